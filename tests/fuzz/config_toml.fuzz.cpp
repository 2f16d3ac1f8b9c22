// Fuzzes the config parser with TOML text (config_from_string, what load_config does with a
// file): every input is a config or an error; a config writes back (to_toml) as text that reads
// back as the same config.
#include "engine/config/config.hpp"
#include "tests/fuzz/fuzz_support.hpp"

using namespace actorpipe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto config = config_from_string(fuzz::as_text(data, size));
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
