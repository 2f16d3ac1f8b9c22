#include "bench/variant_rows.hpp"

#include "bench/step_timing.hpp"

namespace actorpipe::bench {

double VariantResult::median_tokens_per_s() const {
  return ok() && !tokens_per_s.empty() ? median(tokens_per_s) : 0.0;
}

PipelineRunSpec two_stage_spec(const BenchShape& shape, Mode mode, const std::vector<int>& counts,
                               int m, int warmup, int reps) {
  PipelineRunSpec spec;
  spec.model = shape.model;
  spec.B = shape.B;
  spec.T = shape.T;
  spec.mode = mode;
  spec.stages = 2;
  spec.microbatches = m;
  spec.partition = counts;
  spec.warmup = warmup;
  spec.reps = reps;
  return spec;
}

std::vector<size_t> variant_order(int round, size_t n) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = round % 2 == 0 ? i : n - 1 - i;
  return order;
}

std::vector<VariantResult> run_variants(const PipelineRunSpec& base,
                                        const std::vector<Variant>& variants, int rounds) {
  std::vector<VariantResult> out(variants.size());
  for (int round = 0; round < rounds; ++round) {
    for (size_t i : variant_order(round, variants.size())) {
      if (!out[i].ok()) continue;
      PipelineRunSpec spec = base;
      variants[i].apply(spec);
      auto r = measure_pipeline(spec);
      if (!r) {
        out[i].error = r.error().message;
        continue;
      }
      out[i].tokens_per_s.push_back(r->tokens_per_s);
      out[i].last = std::move(*r);
    }
  }
  return out;
}

}  // namespace actorpipe::bench
