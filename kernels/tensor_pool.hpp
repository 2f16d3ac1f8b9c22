// Tensor pool: tensors of one shape handed to other holders without copying, each reused once
// every other holder has dropped it (its storage's use count is back to 1).
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/tensor.hpp"

namespace actorpipe {

/// A pool of zero-initialised tensors of one shape and dtype, in host memory or in a
/// BackendMemory (which must outlive them: a lasting_memory()). acquire() returns a tensor no
/// one else holds, allocating a new one only while more are held than ever before: in a steady
/// state nothing allocates. One thread at a time calls acquire(); holders may drop their
/// copies on any thread.
class TensorPool {
 public:
  TensorPool(std::vector<int64_t> shape, int preallocate, DType dtype = DType::f32,
             BackendMemory* memory = nullptr)
      : shape_(std::move(shape)), dtype_(dtype), memory_(memory) {
    for (int i = 0; i < preallocate; ++i) items_.push_back(make());
  }

  /// A tensor of the pool's shape whose storage no other holder shares.
  Tensor acquire() {
    for (const Tensor& t : items_) {
      if (t.storage().use_count() == 1) {
        // the last other holder's reads happen before our writes
        std::atomic_thread_fence(std::memory_order_acquire);
        return t;
      }
    }
    items_.push_back(make());
    return items_.back();
  }

  const std::vector<int64_t>& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  /// Tensors allocated so far.
  size_t size() const { return items_.size(); }
  /// Where the tensors are; nullptr for host memory.
  BackendMemory* memory() const { return memory_; }

 private:
  Tensor make() const {
    return memory_ != nullptr ? Tensor::zeros(shape_, dtype_, *memory_)
                              : Tensor::zeros(shape_, dtype_);
  }
  std::vector<int64_t> shape_;
  DType dtype_;
  BackendMemory* memory_;
  std::vector<Tensor> items_;
};

}  // namespace actorpipe
