// Forced moves: a small hand-written reader of "<step>: <count>, ...; ..." with errors that
// quote the piece at fault.
#include "engine/config/forced_moves.hpp"

#include <fmt/format.h>

#include <cctype>
#include <charconv>

namespace actorpipe {
namespace {

std::string_view trim_view(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// A whole decimal integer >= 0 (no sign, no spaces inside), or nullopt.
bool read_integer(std::string_view s, long& out) {
  s = trim_view(s);
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && out >= 0;
}

}  // namespace

Expected<std::vector<ForcedMove>> parse_forced_moves(std::string_view text) {
  std::vector<ForcedMove> moves;
  if (trim_view(text).empty()) return moves;
  constexpr const char* kForm = "allowed: \"<step>: <layers per stage>; ...\", e.g. \"10: 3, 5\"";
  size_t start = 0;
  while (start <= text.size()) {
    const size_t semi = text.find(';', start);
    const std::string_view piece = trim_view(
        text.substr(start, semi == std::string_view::npos ? std::string_view::npos : semi - start));
    start = semi == std::string_view::npos ? text.size() + 1 : semi + 1;
    if (piece.empty()) {
      if (start > text.size()) break;  // a trailing ';'
      return make_error("migration.moves = \"{}\": an empty move between ';' ({})", text, kForm);
    }
    const size_t colon = piece.find(':');
    if (colon == std::string_view::npos) {
      return make_error("migration.moves = \"{}\": \"{}\" has no ':' ({})", text, piece, kForm);
    }
    ForcedMove move;
    if (!read_integer(piece.substr(0, colon), move.step) || move.step < 1) {
      return make_error("migration.moves = \"{}\": \"{}\": the step must be an integer >= 1", text,
                        piece);
    }
    std::string_view rest = piece.substr(colon + 1);
    size_t at = 0;
    while (at <= rest.size()) {
      const size_t comma = rest.find(',', at);
      const std::string_view item =
          rest.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at);
      long count = 0;
      if (!read_integer(item, count) || count < 1 || count > 1'000'000) {
        return make_error(
            "migration.moves = \"{}\": \"{}\": \"{}\" is not a layer count (an integer >= 1)", text,
            piece, trim_view(item));
      }
      move.counts.push_back(static_cast<int>(count));
      if (comma == std::string_view::npos) break;
      at = comma + 1;
    }
    if (!moves.empty() && move.step <= moves.back().step) {
      return make_error("migration.moves = \"{}\": step {} after step {}: the steps must increase",
                        text, move.step, moves.back().step);
    }
    moves.push_back(std::move(move));
  }
  return moves;
}

std::string to_string(const std::vector<ForcedMove>& moves) {
  std::string out;
  for (const ForcedMove& m : moves) {
    if (!out.empty()) out += "; ";
    out += fmt::format("{}: {}", m.step, fmt::join(m.counts, ", "));
  }
  return out;
}

}  // namespace actorpipe
