// DeferredGrads: the weight-gradient work of a backward, left for after its input gradient has
// been handed on (the previous stage can start its backward while this one finishes).
#pragma once

#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/context.hpp"

namespace actorpipe {

/// A queue of linear-layer weight gradients (matmul_backward_weight) that a Layer::backward
/// records instead of computing, with storage for the output gradients they read. The inputs
/// they read (saved activations, the layer's input) must stay valid until run(). run()
/// computes them in the order they were added, so every gradient buffer receives the same
/// additions in the same order as the one-pass backward: the same bits.
class DeferredGrads {
 public:
  DeferredGrads() = default;
  DeferredGrads(const DeferredGrads&) = delete;
  DeferredGrads& operator=(const DeferredGrads&) = delete;

  /// n floats (64-byte aligned, uninitialised) that stay valid until run() or clear() returns.
  float* hold(size_t n);
  /// hold(n) filled with a copy of src[0, n).
  float* copy(const float* src, size_t n);
  /// n bf16 values of the same storage.
  bf16* hold_bf16(size_t n);
  /// Records dweight (OC,C) += doutᵀ · inp and dbias (OC) += Σ rows of dout (dbias may be null).
  void add_linear(float* dweight, float* dbias, const float* dout, const float* inp, int N, int C,
                  int OC);
  /// The same for an input kept in bf16 (matmul_backward_weight's bf16 overload).
  void add_linear(float* dweight, float* dbias, const float* dout, const bf16* inp, int N, int C,
                  int OC);
  /// Records only dweight (OC,C) += doutᵀ · inp of bf16 products on an output gradient already
  /// in bf16 (matmul_backward_products): in bf16 the input half rounds dout once, takes the bias
  /// gradient in that pass, and leaves this rounding (in hold_bf16 storage) to the weight half.
  void add_linear(float* dweight, const bf16* dout, const float* inp, int N, int C, int OC);
  void add_linear(float* dweight, const bf16* dout, const bf16* inp, int N, int C, int OC);
  /// Nothing recorded (marks aside).
  bool empty() const { return tasks_.empty(); }
  size_t size() const { return tasks_.size(); }
  /// Records a mark carrying `tag` after what was added so far: run() calls its `on_mark` there
  /// (e.g. a stage marks the end of each layer's weight gradients).
  void mark(int tag);
  /// Computes every recorded gradient in order, calling on_mark(tag) at each mark as it passes
  /// it, then clear().
  void run(Context& ctx, const std::function<void(int)>& on_mark = {});
  /// Drops what was recorded (the storage is kept for reuse).
  void clear();
  /// Bytes of storage held (grows to the largest backward's needs, then stays).
  size_t capacity_bytes() const { return storage_.capacity_bytes(); }

 private:
  struct Linear {
    float* dweight;
    float* dbias;
    const float* dout;
    const float* inp;
    const bf16* inp_bf16;   // instead of inp
    const bf16* dout_bf16;  // instead of dout (and dbias)
    int N, C, OC;
  };
  Arena storage_;
  std::vector<Linear> tasks_;
  std::vector<std::pair<size_t, int>> marks_;  // (tasks before it, tag), in order
};

}  // namespace actorpipe
