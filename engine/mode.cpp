// Mode: the five training modes and their names ("gpipe", "1f1b", "2bw", "pipedream", "xpipe").
// Parsing errors name the value and list every allowed name.
#include "engine/mode.hpp"

namespace actorpipe {

std::string_view to_string(Mode mode) {
  switch (mode) {
    case Mode::gpipe:
      return "gpipe";
    case Mode::onef1b:
      return "1f1b";
    case Mode::twobw:
      return "2bw";
    case Mode::pipedream:
      return "pipedream";
    case Mode::xpipe:
      return "xpipe";
  }
  return "unknown";
}

bool from_string(std::string_view name, Mode& out) {
  for (Mode m : all_modes) {
    if (to_string(m) == name) {
      out = m;
      return true;
    }
  }
  return false;
}

Expected<Mode> parse_mode(std::string_view name) {
  Mode m{};
  if (from_string(name, m)) return m;
  return make_error("mode '{}' is unknown; allowed: gpipe, 1f1b, 2bw, pipedream, xpipe", name);
}

bool is_synchronous(Mode mode) {
  return mode == Mode::gpipe || mode == Mode::onef1b;
}

}  // namespace actorpipe
