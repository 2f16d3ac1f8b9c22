// Benchmark shapes: the named GPT configurations the benchmark trains (tiny, small, gpt2)
// and the model-FLOP count of one training step.
#include "bench/bench_shapes.hpp"

#include <fmt/format.h>

#include "bench/cli_args.hpp"

namespace actorpipe::bench {

namespace {
BenchShape make_shape(std::string name, int V, int maxT, int C, int L, int NH, int B, int T) {
  BenchShape s;
  s.name = std::move(name);
  s.model.arch = Arch::gpt;
  s.model.vocab_size = V;
  s.model.context = maxT;
  s.model.width = C;
  s.model.depth = L;
  s.model.heads = NH;
  s.model.tied = true;
  s.model.init_seed = 1;
  s.B = B;
  s.T = T;
  return s;
}
}  // namespace

std::string BenchShape::describe() const {
  return fmt::format("V{} T{} d{} L{} H{} B{}", model.vocab_size, T, model.width, model.depth,
                     model.heads, B);
}

const std::vector<BenchShape>& bench_shapes() {
  static const std::vector<BenchShape> shapes = {
      make_shape("tiny", 256, 128, 128, 4, 4, 8, 128),
      make_shape("small", 8192, 256, 384, 6, 6, 8, 256),
      make_shape("gpt2", 50257, 1024, 768, 12, 12, 4, 64),
  };
  return shapes;
}

Expected<BenchShape> find_bench_shape(const std::string& name) {
  std::string known;
  for (const BenchShape& s : bench_shapes()) {
    if (s.name == name) return s;
    known += known.empty() ? s.name : ", " + s.name;
  }
  return make_error("--shapes: unknown shape '{}' (known: {})", name, known);
}

long matmul_parameters(const Model& model) {
  const ModelOptions& o = model.options();
  return static_cast<long>(model.unique_parameters()) - static_cast<long>(o.context) * o.width;
}

double step_model_flops(const Model& model, int B, int T) {
  const ModelOptions& o = model.options();
  const double tokens = static_cast<double>(B) * T;
  const double n = static_cast<double>(matmul_parameters(model));
  return 6.0 * n * tokens + 12.0 * o.depth * static_cast<double>(T) * o.width * tokens;
}

Expected<std::string> shape_option(std::span<const std::string> args, size_t& i) {
  const std::string option = args[i];
  auto v = option_value(args, i);
  if (!v) return v.error();
  if (auto s = find_bench_shape(*v); !s) return make_error("{}: {}", option, s.error().message);
  return *v;
}

}  // namespace actorpipe::bench
