// UTF-8: the first invalid sequence of a byte string, by the table of RFC 3629, section 4.
#include "engine/utf8.hpp"

namespace actorpipe {

std::optional<size_t> find_invalid_utf8(std::span<const uint8_t> b) {
  const size_t n = b.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t c = b[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    uint8_t lo = 0x80, hi = 0xbf;  // allowed range of the second byte (RFC 3629, section 4)
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;  // no overlong forms
      if (c == 0xed) hi = 0x9f;  // no surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;  // no overlong forms
      if (c == 0xf4) hi = 0x8f;  // nothing above U+10FFFF
    } else {
      return i;  // continuation byte without a lead, C0/C1 overlong leads, F5..FF
    }
    if (i + static_cast<size_t>(len) > n) return i;
    if (b[i + 1] < lo || b[i + 1] > hi) return i;
    for (int k = 2; k < len; ++k) {
      if (b[i + k] < 0x80 || b[i + k] > 0xbf) return i;
    }
    i += static_cast<size_t>(len);
  }
  return std::nullopt;
}

}  // namespace actorpipe
