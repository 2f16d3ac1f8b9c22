// What both config harnesses check of a parse: an error has a message; an accepted config writes
// back (to_toml) as text that reads back as the same config.
#pragma once

#include <string>

#include "engine/config/config.hpp"
#include "tests/fuzz/fuzz_support.hpp"

namespace actorpipe::fuzz {

inline int check_config_round_trip(const Expected<Config>& config) {
  if (!config) {
    FUZZ_CHECK(!config.error().message.empty(), "an error without a message");
    return 0;
  }
  const std::string toml = to_toml(*config);
  auto again = config_from_string(toml);
  FUZZ_CHECK(again.ok(), "to_toml of an accepted config does not read back: {}\n{}",
             again.ok() ? "" : again.error().message, toml);
  FUZZ_CHECK(to_toml(*again) == toml, "to_toml of the config read back differs:\n{}\n---\n{}", toml,
             to_toml(*again));
  return 0;
}

}  // namespace actorpipe::fuzz
