// Fuzzes the command-line overrides: every line of the input is one argument of a command line
// ("--set", "section.key=value", "--set=section.key=value", ...). collect_sets picks the
// overrides, config_from_string applies them to the defaults and validates; an accepted config
// writes back (to_toml) as text that reads back as the same config.
#include <string>
#include <vector>

#include "engine/config/config.hpp"
#include "tests/fuzz/config_round_trip.hpp"
#include "tests/fuzz/fuzz_support.hpp"

using namespace actorpipe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text = fuzz::as_text(data, size);
  std::vector<std::string> args = {"actorpipe-fuzz"};
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    args.emplace_back(text.substr(0, eol));
    text = eol == std::string_view::npos ? std::string_view{} : text.substr(eol + 1);
  }
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  auto sets = collect_sets(static_cast<int>(argv.size()), argv.data());
  if (!sets) {
    FUZZ_CHECK(!sets.error().message.empty(), "an error without a message");
    return 0;
  }
  return fuzz::check_config_round_trip(config_from_string("", *sets));
}
