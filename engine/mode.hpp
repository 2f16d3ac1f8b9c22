// Mode: the five training modes (gpipe, 1f1b, 2bw, pipedream, xpipe) and their names.
// The mode decides the schedule shape and which weight version each forward/backward uses.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "engine/expected.hpp"

namespace actorpipe {

/// The training modes; docs/modes.md gives each one's exact update rule.
enum class Mode : uint8_t {
  gpipe,      ///< synchronous: all F, all B (ascending), OPT_STEP, FLUSH
  onef1b,     ///< synchronous PipeDream-Flush: one F one B, OPT_STEP, FLUSH
  twobw,      ///< PipeDream-2BW: 1F1B without flush, delayed update, 2 versions
  pipedream,  ///< PipeDream: 1F1B, OPT_STEP after every B, weight stashing
  xpipe,      ///< XPipe: 2BW order, forwards use weights predicted ahead
};

/// Every mode, in declaration order.
inline constexpr std::array<Mode, 5> all_modes = {Mode::gpipe, Mode::onef1b, Mode::twobw,
                                                  Mode::pipedream, Mode::xpipe};

/// "gpipe", "1f1b", "2bw", "pipedream", "xpipe".
std::string_view to_string(Mode mode);

/// Parses a mode name; false (out untouched) for an unknown name.
bool from_string(std::string_view name, Mode& out);

/// Parses a mode name; the error names the value and the allowed names.
Expected<Mode> parse_mode(std::string_view name);

/// True for the modes that flush the pipeline at every optimizer step (gpipe, 1f1b).
bool is_synchronous(Mode mode);

}  // namespace actorpipe
