#include "bench/precision_bench.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "bench/variant_rows.hpp"
#include "kernels/bf16_gemm.hpp"

namespace actorpipe::bench {

int run_precision_rows(const BenchShape& shape, std::span<const Mode> modes,
                       const std::vector<int>& counts, int m, int warmup, int reps, int rounds,
                       bool as_json, const std::function<void(const std::string&)>& out) {
  if (!bf16_support().native) {
    out(as_json
            ? nlohmann::json{{"name", "pipeline_precision"}, {"skipped", bf16_support().describe()}}
                      .dump() +
                  "\n"
            : fmt::format("\nprecisions: no bf16 rows ({})\n", bf16_support().describe()));
    return 0;
  }
  if (!as_json) {
    out(fmt::format(
        "\nprecisions (pipeline.precision), 2 stages x 1 thread, partition {}:{}, {} rounds "
        "interleaved, median tokens/s; {}\n",
        counts[0], counts[1], rounds, bf16_support().describe()));
    out(fmt::format("  {:<10} {:>12} {:>12} {:>11}\n", "mode", "fp32 tok/s", "bf16 tok/s",
                    "bf16/fp32"));
  }
  int failures = 0;
  for (Mode mode : modes) {
    const PipelineRunSpec base = two_stage_spec(shape, mode, counts, m, warmup, reps);
    const std::vector<Variant> variants = {
        {"fp32", [](PipelineRunSpec& s) { s.precision = "fp32"; }},
        {"bf16", [](PipelineRunSpec& s) { s.precision = "bf16"; }}};
    const std::vector<VariantResult> r = run_variants(base, variants, rounds);
    for (const VariantResult& v : r)
      if (!v.ok()) ++failures;
    const double f = r[0].median_tokens_per_s(), b = r[1].median_tokens_per_s();
    const bool ok = r[0].ok() && r[1].ok();
    if (as_json) {
      nlohmann::json j{{"name", "pipeline_precision"},
                       {"shape", shape.name},
                       {"mode", std::string(to_string(mode))},
                       {"stages", 2},
                       {"microbatches", m},
                       {"partition", counts},
                       {"fp32_tokens_per_s", f},
                       {"bf16_tokens_per_s", b},
                       {"fp32_tokens_per_s_all", r[0].tokens_per_s},
                       {"bf16_tokens_per_s_all", r[1].tokens_per_s}};
      j["ratio"] = ok && f > 0.0 ? nlohmann::json(b / f) : nlohmann::json(nullptr);
      if (!ok) j["error"] = r[0].ok() ? r[1].error : r[0].error;
      out(j.dump() + "\n");
    } else if (!ok) {
      out(fmt::format("  {:<10} FAILED: {}\n", to_string(mode),
                      r[0].ok() ? r[1].error : r[0].error));
    } else {
      out(fmt::format("  {:<10} {:>12.1f} {:>12.1f} {:>10.2f}x\n", to_string(mode), f, b, b / f));
    }
  }
  return failures;
}

}  // namespace actorpipe::bench
