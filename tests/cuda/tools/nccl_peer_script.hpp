// What the NCCL channel test's two processes agree on: the tensors the peer posts, in order, and
// the bytes of each (tests/cuda/nccl_channel.test.cpp, tests/cuda/tools/nccl_channel_peer.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/tensor.hpp"

namespace actorpipe::nccl_peer {

struct Item {
  std::vector<int64_t> shape;
  DType dtype;
};

/// The posts: 8 B, 64 KiB, 3 MiB and an odd 4-dimensional one, f32 and i32.
inline std::vector<Item> script() {
  return {{{2}, DType::f32},          {{16, 1024}, DType::i32}, {{3, 256, 1024}, DType::f32},
          {{2, 3, 4, 5}, DType::i32}, {{16, 1024}, DType::f32}, {{3, 256, 1024}, DType::i32}};
}

/// Byte i of post k.
inline std::byte pattern(size_t k, size_t i) {
  return static_cast<std::byte>((k * 131 + i * 7 + (i >> 11)) & 0xFF);
}

/// Post k's bytes in a host tensor.
inline Tensor patterned(size_t k) {
  const Item item = script()[k];
  Tensor t = Tensor::zeros(item.shape, item.dtype);
  auto* p = static_cast<std::byte*>(t.storage()->data());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = pattern(k, i);
  return t;
}

}  // namespace actorpipe::nccl_peer
