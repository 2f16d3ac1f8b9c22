// Forced moves: migration.moves, the steps at which a run's stages take other layer counts.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/expected.hpp"

namespace actorpipe {

/// After `step` optimizer updates (the stages' update count, which a resume restores) the
/// stages hold `counts` layers each, first stage first.
struct ForcedMove {
  long step = 0;
  std::vector<int> counts;
  friend bool operator==(const ForcedMove&, const ForcedMove&) = default;
};

/// Parses migration.moves: "" (none) or moves separated by ';', each "<step>: <count>, ...",
/// spaces anywhere, e.g. "10: 3, 5; 20: 4, 4". Steps must be >= 1 and increasing, counts >= 1.
/// The number of counts and their sum are checked against the model by validate() (config.hpp).
/// Errors quote the move at fault and say what is allowed.
Expected<std::vector<ForcedMove>> parse_forced_moves(std::string_view text);

/// "10: 3, 5; 20: 4, 4" (the canonical form parse_forced_moves reads back).
std::string to_string(const std::vector<ForcedMove>& moves);

}  // namespace actorpipe
