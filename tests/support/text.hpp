// Tests' text helpers: the message of a failed Expected, and substring checks on messages.
#pragma once

#include <string>

#include "engine/expected.hpp"

namespace actorpipe::testing {

/// The error message of `e`, empty when it holds a value (for REQUIRE_MESSAGE).
template <class T>
std::string why(const Expected<T>& e) {
  return e.ok() ? std::string() : e.error().message;
}

/// Whether `s` contains `part`.
inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace actorpipe::testing
