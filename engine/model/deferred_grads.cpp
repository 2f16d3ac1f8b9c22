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

void DeferredGrads::add_linear(float* dweight, float* dbias, const float* dout, const float* inp,
                               int N, int C, int OC) {
  tasks_.push_back({dweight, dbias, dout, inp, N, C, OC});
}

void DeferredGrads::run(Context& ctx) {
  for (const Linear& t : tasks_)
    matmul_backward_weight(ctx, t.dweight, t.dbias, t.dout, t.inp, t.N, t.C, t.OC);
  clear();
}

void DeferredGrads::clear() {
  tasks_.clear();
  storage_.reset();
}

}  // namespace actorpipe
