// Fuzzes the config parser with TOML text (config_from_string, what load_config does with a
// file): every input is a config or an error; a config writes back (to_toml) as text that reads
// back as the same config.
#include "engine/config/config.hpp"
#include "tests/fuzz/config_round_trip.hpp"
#include "tests/fuzz/fuzz_support.hpp"

using namespace actorpipe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return fuzz::check_config_round_trip(config_from_string(fuzz::as_text(data, size)));
}
