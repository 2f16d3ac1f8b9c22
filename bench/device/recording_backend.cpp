// RecordingBackend: forwards every op; records and replays the linear layers' products.
#include "bench/device/recording_backend.hpp"

namespace actorpipe::bench {

void RecordingBackend::matmul_forward(float* out, const float* inp, const float* weight,
                                      const float* bias, int N, int C, int OC) {
  if (recording_)
    calls_.push_back({Kind::forward, out, nullptr, nullptr, inp, weight, bias, nullptr, N, C, OC});
  timed("matmul_forward", [&] { inner_.matmul_forward(out, inp, weight, bias, N, C, OC); });
}

void RecordingBackend::matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                       const float* inp, const float* weight, int N, int C,
                                       int OC) {
  if (recording_)
    calls_.push_back({Kind::backward, dinp, dweight, dbias, inp, weight, nullptr, dout, N, C, OC});
  timed("matmul_backward",
        [&] { inner_.matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC); });
}

void RecordingBackend::matmul_backward_input(float* dinp, const float* dout, const float* weight,
                                             int N, int C, int OC) {
  if (recording_)
    calls_.push_back(
        {Kind::input, dinp, nullptr, nullptr, nullptr, weight, nullptr, dout, N, C, OC});
  timed("matmul_backward_input",
        [&] { inner_.matmul_backward_input(dinp, dout, weight, N, C, OC); });
}

void RecordingBackend::matmul_backward_weight(float* dweight, float* dbias, const float* dout,
                                              const float* inp, int N, int C, int OC) {
  if (recording_)
    calls_.push_back(
        {Kind::weight, nullptr, dweight, dbias, inp, nullptr, nullptr, dout, N, C, OC});
  timed("matmul_backward_weight",
        [&] { inner_.matmul_backward_weight(dweight, dbias, dout, inp, N, C, OC); });
}

void RecordingBackend::add_time(const char* op, double ms) {
  for (OpTime& t : profile_) {
    if (t.op == op) {
      ++t.calls;
      t.ms += ms;
      return;
    }
  }
  profile_.push_back({op, 1, ms});
}

double RecordingBackend::flops() const {
  double f = 0.0;
  for (const Call& c : calls_) {
    const double one = 2.0 * c.N * c.C * c.OC;
    const bool both = c.kind == Kind::backward && c.out != nullptr;
    f += both ? 2.0 * one : one;
  }
  return f;
}

void RecordingBackend::replay() {
  for (const Call& c : calls_) {
    switch (c.kind) {
      case Kind::forward:
        inner_.matmul_forward(c.out, c.inp, c.weight, c.bias, c.N, c.C, c.OC);
        break;
      case Kind::backward:
        inner_.matmul_backward(c.out, c.dweight, c.dbias, c.dout, c.inp, c.weight, c.N, c.C, c.OC);
        break;
      case Kind::input:
        inner_.matmul_backward_input(c.out, c.dout, c.weight, c.N, c.C, c.OC);
        break;
      case Kind::weight:
        inner_.matmul_backward_weight(c.dweight, c.dbias, c.dout, c.inp, c.N, c.C, c.OC);
        break;
    }
  }
  inner_.synchronize();
}

}  // namespace actorpipe::bench
