// DeferredGrads: recorded linear weight gradients, computed later in the order recorded.
#include "engine/model/deferred_grads.hpp"

#include <algorithm>

#include "kernels/matmul.hpp"

namespace actorpipe {

float* DeferredGrads::hold(size_t n) {
  return storage_.alloc_f32(n);
}

float* DeferredGrads::copy(const float* src, size_t n) {
  float* dst = hold(n);
  std::copy(src, src + n, dst);
  return dst;
}

bf16* DeferredGrads::hold_bf16(size_t n) {
  return reinterpret_cast<bf16*>(hold((n + 1) / 2));
}

void DeferredGrads::add_linear(float* dweight, float* dbias, const float* dout, const float* inp,
                               int N, int C, int OC) {
  tasks_.push_back({dweight, dbias, dout, inp, nullptr, nullptr, N, C, OC});
}

void DeferredGrads::add_linear(float* dweight, float* dbias, const float* dout, const bf16* inp,
                               int N, int C, int OC) {
  tasks_.push_back({dweight, dbias, dout, nullptr, inp, nullptr, N, C, OC});
}

void DeferredGrads::add_linear(float* dweight, const bf16* dout, const float* inp, int N, int C,
                               int OC) {
  tasks_.push_back({dweight, nullptr, nullptr, inp, nullptr, dout, N, C, OC});
}

void DeferredGrads::add_linear(float* dweight, const bf16* dout, const bf16* inp, int N, int C,
                               int OC) {
  tasks_.push_back({dweight, nullptr, nullptr, nullptr, inp, dout, N, C, OC});
}

void DeferredGrads::mark(int tag) {
  marks_.emplace_back(tasks_.size(), tag);
}

void DeferredGrads::run(Context& ctx, const std::function<void(int)>& on_mark) {
  size_t m = 0;
  for (size_t i = 0; i <= tasks_.size(); ++i) {
    for (; m < marks_.size() && marks_[m].first == i; ++m)
      if (on_mark) on_mark(marks_[m].second);
    if (i == tasks_.size()) break;
    const Linear& t = tasks_[i];
    if (t.dout_bf16 != nullptr && t.inp_bf16 != nullptr)
      matmul_backward_products(ctx, nullptr, t.dweight, t.dout_bf16, t.inp_bf16, nullptr, t.N, t.C,
                               t.OC);
    else if (t.dout_bf16 != nullptr)
      matmul_backward_products(ctx, nullptr, t.dweight, t.dout_bf16, t.inp, nullptr, t.N, t.C,
                               t.OC);
    else if (t.inp_bf16 != nullptr)
      matmul_backward_weight(ctx, t.dweight, t.dbias, t.dout, t.inp_bf16, t.N, t.C, t.OC);
    else
      matmul_backward_weight(ctx, t.dweight, t.dbias, t.dout, t.inp, t.N, t.C, t.OC);
  }
  clear();
}

void DeferredGrads::clear() {
  tasks_.clear();
  marks_.clear();
  storage_.reset();
}

}  // namespace actorpipe
