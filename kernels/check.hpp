// Check macros for programmer errors and backend failures: they record file and line and
// throw actorpipe::CheckFailure. Recoverable errors are values (engine/expected.hpp).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace actorpipe {

struct CheckFailure : std::logic_error {
  using std::logic_error::logic_error;
};

[[noreturn]] inline void check_failed(const char* file, int line, const char* cond,
                                      const std::string& msg) {
  throw CheckFailure(
      fmt::format("{}:{}: check failed: {}{}{}", file, line, cond, msg.empty() ? "" : ": ", msg));
}

}  // namespace actorpipe

/// AP_CHECK(cond) or AP_CHECK(cond, "fmt {}", args...)
#define AP_CHECK(cond, ...)                                                 \
  do {                                                                      \
    if (!(cond))                                                            \
      ::actorpipe::check_failed(__FILE__, __LINE__, #cond,                  \
                                ::fmt::format("" __VA_OPT__(__VA_ARGS__))); \
  } while (0)
