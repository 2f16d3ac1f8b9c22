// Wire: the small announcement that precedes a tensor on a channel (tag, microbatch, version,
// dtype, shape, sequence). Plain data, CAF-free; actors/ gives it a CAF inspect().
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/expected.hpp"
#include "kernels/tensor.hpp"

namespace actorpipe {

/// Which way a tensor travels between two neighbouring stages.
enum class Direction : uint8_t {
  forward,   ///< activation from stage r to stage r+1
  backward,  ///< gradient from stage r+1 to stage r
};

/// "forward" / "backward".
std::string to_string(Direction d);

/// The tag of the channel for `dir` between stages `lower` and `lower + 1`: 2*lower for forward,
/// 2*lower + 1 for backward. Both ends compute it without talking to each other.
constexpr uint32_t channel_tag(int lower, Direction dir) {
  return static_cast<uint32_t>(2 * lower + (dir == Direction::backward ? 1 : 0));
}

/// Announces one tensor posted on a channel. The receiver gets this (a small control message)
/// first and then takes the payload from the channel named by `tag`.
struct Announcement {
  uint32_t tag = 0;         ///< channel_tag() of the channel holding the payload
  uint64_t sequence = 0;    ///< 0, 1, 2, ... per channel in post order
  int64_t microbatch = -1;  ///< global microbatch index
  int32_t version = 0;      ///< weight version the producing action used
  DType dtype = DType::f32;
  int32_t ndim = 0;
  std::array<int64_t, Tensor::kMaxDims> dims{};  ///< first ndim entries are the shape

  /// The shape as a vector.
  std::vector<int64_t> shape() const { return {dims.begin(), dims.begin() + ndim}; }
  friend bool operator==(const Announcement&, const Announcement&) = default;
};

/// "tag 2 #5 mb 7 v 1 f32[4, 16, 32]"; an announcement whose ndim is outside 0 to
/// Tensor::kMaxDims (as a peer may send) prints "tag 2 #5 mb 7 v 1 f32 with 9 dims".
std::string to_string(const Announcement& a);

/// The bytes of the payload `a` announces, checking what a peer sent: dtype f32 or i32, 0 to
/// Tensor::kMaxDims dimensions, none negative, at most 1 TiB in all. The error names the
/// announcement and what is wrong with it.
Expected<size_t> payload_bytes(const Announcement& a);

}  // namespace actorpipe
