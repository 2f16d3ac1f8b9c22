// Fuzzes the action text parser (parse_action: "2F0", "1SEND_B3", "3B17@2", "0F9+1",
// "0OPT_STEP@1", "0FLUSH"). An action that parses prints (to_string) as text that parses back
// to the same action; anything else is an error quoting the text.
#include "engine/schedule/schedule.hpp"
#include "tests/fuzz/fuzz_support.hpp"

using namespace actorpipe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = fuzz::as_text(data, size);
  auto action = parse_action(text);
  if (!action) {
    FUZZ_CHECK(action.error().message.find(text) != std::string::npos,
               "the error does not quote the text: {}", action.error().message);
    return 0;
  }
  const std::string printed = to_string(*action);
  auto again = parse_action(printed);
  FUZZ_CHECK(again.ok(), "'{}' prints as '{}', which does not parse: {}", text, printed,
             again.ok() ? "" : again.error().message);
  FUZZ_CHECK(*again == *action, "'{}' prints as '{}', which parses as '{}'", text, printed,
             to_string(*again));
  return 0;
}
