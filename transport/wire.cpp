// Wire: text forms of the announcement that precedes a tensor on a channel.
// Used in logs and in error messages that name a mismatching announcement.
#include "transport/wire.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace actorpipe {

std::string to_string(Direction d) {
  return d == Direction::forward ? "forward" : "backward";
}

std::string to_string(const Announcement& a) {
  return fmt::format("tag {} #{} mb {} v {} {}[{}]", a.tag, a.sequence, a.microbatch, a.version,
                     to_string(a.dtype), fmt::join(a.shape(), ", "));
}

}  // namespace actorpipe
