// UTF-8: finding the first invalid sequence of a byte string (RFC 3629), for text that must be
// UTF-8: TOML documents and --set values, text token files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace actorpipe {

/// Byte offset where the first invalid UTF-8 sequence starts (stray continuation bytes, overlong
/// forms, surrogates, code points above U+10FFFF and cut sequences are invalid); nullopt if valid.
std::optional<size_t> find_invalid_utf8(std::span<const uint8_t> bytes);

/// As above, for text.
inline std::optional<size_t> find_invalid_utf8(std::string_view text) {
  return find_invalid_utf8(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

}  // namespace actorpipe
