// Wire: text forms of the announcement that precedes a tensor on a channel (used in logs and in
// error messages that name a mismatching announcement) and the check of one a peer sent.
#include "transport/wire.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace actorpipe {

std::string to_string(Direction d) {
  return d == Direction::forward ? "forward" : "backward";
}

std::string to_string(const Announcement& a) {
  if (a.ndim < 0 || a.ndim > Tensor::kMaxDims) {
    return fmt::format("tag {} #{} mb {} v {} {} with {} dims", a.tag, a.sequence, a.microbatch,
                       a.version, to_string(a.dtype), a.ndim);
  }
  return fmt::format("tag {} #{} mb {} v {} {}[{}]", a.tag, a.sequence, a.microbatch, a.version,
                     to_string(a.dtype), fmt::join(a.shape(), ", "));
}

Expected<size_t> payload_bytes(const Announcement& a) {
  if (a.dtype != DType::f32 && a.dtype != DType::i32) {
    return make_error("announcement {} has unknown dtype {}", to_string(a),
                      static_cast<int>(a.dtype));
  }
  if (a.ndim < 0 || a.ndim > Tensor::kMaxDims) {
    return make_error("announcement {} has {} dims, expected 0 to {}", to_string(a), a.ndim,
                      Tensor::kMaxDims);
  }
  constexpr uint64_t kMaxBytes = uint64_t{1} << 40;
  uint64_t bytes = dtype_size(a.dtype);
  for (int i = 0; i < a.ndim; ++i) {
    const int64_t d = a.dims[static_cast<size_t>(i)];
    if (d < 0 || (d > 0 && bytes > kMaxBytes / static_cast<uint64_t>(d))) {
      return make_error("announcement {} has dimension {} = {} (negative or above 1 TiB)",
                        to_string(a), i, d);
    }
    bytes *= static_cast<uint64_t>(d);
  }
  return static_cast<size_t>(bytes);
}

}  // namespace actorpipe
