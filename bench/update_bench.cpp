// `actorpipe-bench update`: the update, the gradients' fill and the weights' bf16 conversions as
// separate passes against the fused update (ReferenceTrainer::set_fused_update), on two trainers
// of the same shape fed the same gradients, alternating.
#include "bench/update_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "bench/bench_shapes.hpp"
#include "bench/machine.hpp"
#include "bench/step_timing.hpp"
#include "engine/execution/compute_precision.hpp"
#include "engine/execution/reference_trainer.hpp"
#include "kernels/bf16.hpp"
#include "kernels/bf16_gemm.hpp"

namespace actorpipe::bench {

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// every parameter and optimizer state float of a trainer, layer after layer
std::vector<float> weights_and_state(ReferenceTrainer& tr) {
  std::vector<float> all;
  for (int i = 0; i < tr.num_layers(); ++i) {
    const std::span<float> p = tr.params(i), s = tr.optimizer_state(i);
    all.insert(all.end(), p.begin(), p.end());
    all.insert(all.end(), s.begin(), s.end());
  }
  return all;
}

}  // namespace

Expected<UpdateTiming> time_update(const std::string& shape_name, int threads,
                                   const std::string& precision_name, int reps) {
  auto shape = find_bench_shape(shape_name);
  if (!shape) return shape.error();
  auto precision = resolve_precision(precision_name);
  if (!precision) return precision.error();
  if (reps < 1) return make_error("update bench: --reps {}: must be at least 1", reps);
  auto model_a = Model::build(shape->model), model_b = Model::build(shape->model);
  if (!model_a) return model_a.error();
  if (!model_b) return model_b.error();
  UpdateTiming r;
  r.shape = shape->name;
  r.threads = threads;
  r.precision = precision_name;
  r.parameters = static_cast<long>(model_a->unique_parameters());

  const OptimizerOptions opt;  // AdamW with the clip, as the step bench
  ReferenceTrainer separate(std::move(*model_a), opt, shape->B, shape->T, threads);
  ReferenceTrainer fused(std::move(*model_b), opt, shape->B, shape->T, threads);
  separate.set_precision(*precision);
  fused.set_precision(*precision);
  separate.set_fused_update(false);
  const std::vector<Microbatch> mbs = {
      random_microbatch(shape->model.vocab_size, shape->B, shape->T, 1234)};
  (void)separate.compute_gradients(mbs);
  std::vector<std::vector<float>> grads;
  for (int i = 0; i < separate.num_layers(); ++i)
    grads.emplace_back(separate.grads(i).begin(), separate.grads(i).end());
  auto restore = [&](ReferenceTrainer& tr) {
    for (int i = 0; i < tr.num_layers(); ++i)
      std::ranges::copy(grads[static_cast<size_t>(i)], tr.grads(i).begin());
  };

  // the separate passes' conversions: each product operand once per version, as the products
  // make them (Bf16Weights::copy)
  const bool in_bf16 = *precision == Precision::bf16;
  size_t operand_floats = 0;
  for (int i = 0; i < separate.num_layers(); ++i)
    for (const ParamSlot& s : separate.model().layer(i).slots())
      if (s.product_operand) operand_floats = std::max(operand_floats, s.numel);
  std::vector<bf16> copy(in_bf16 ? operand_floats : 0);

  auto run_separate = [&] {
    const auto t0 = Clock::now();
    separate.apply_update();
    for (int i = 0; i < separate.num_layers(); ++i) {
      const std::span<float> g = separate.grads(i);
      std::fill(g.begin(), g.end(), 0.0f);
    }
    for (int i = 0; in_bf16 && i < separate.num_layers(); ++i) {
      const float* p = separate.params(i).data();
      for (const ParamSlot& s : separate.model().layer(i).slots())
        if (s.product_operand)
          convert_to_bf16(separate.context(), p + s.offset, copy.data(),
                          static_cast<int64_t>(s.numel));
    }
    r.separate_ms.push_back(ms_between(t0, Clock::now()));
  };
  auto run_fused = [&] {
    const auto t0 = Clock::now();
    fused.apply_update();
    r.fused_ms.push_back(ms_between(t0, Clock::now()));
  };
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0: untimed warm-up
    restore(separate);
    restore(fused);
    if (rep % 2 == 0) {
      run_separate();
      run_fused();
    } else {
      run_fused();
      run_separate();
    }
    if (rep == 0) {
      r.separate_ms.clear();
      r.fused_ms.clear();
    }
  }
  r.same_bits = weights_and_state(separate) == weights_and_state(fused);
  return r;
}

std::string update_usage() {
  return "usage: actorpipe-bench update [--shapes small,gpt2] [--threads 1,2] "
         "[--precision fp32,bf16] [--reps N] [--json]\n"
         "  The per-step work on the weights besides the products, on a shape's parameters: the\n"
         "  AdamW update, the gradients' fill and (bf16) the conversions of the new weights for\n"
         "  the products as separate passes, against the fused update that does them in one\n"
         "  pass. Two trainers fed the same gradients, alternating; median of N updates.\n";
}

int run_update_bench(std::span<const std::string> args) {
  auto parsed = parse_bench_options(args);
  if (!parsed) {
    fmt::print(stderr, "actorpipe-bench update: {}\n", parsed.error().message);
    return 2;
  }
  BenchOptions o = *parsed;
  if (o.help) {
    fmt::print("{}", update_usage());
    return 0;
  }
  // the tiny shape fits in cache, which is not what this measures
  if (std::ranges::find(args, std::string("--shapes")) == args.end()) o.shapes = {"small", "gpt2"};
  const Interference start = sample_interference(std::chrono::milliseconds(500));
  warn_if_busy("actorpipe-bench update", start);
  if (!o.json) {
    fmt::print(
        "actorpipe-bench update: AdamW update + gradient fill + bf16 conversions as separate "
        "passes (peer) against the fused update; median of {} updates, alternating\n{}\n\n",
        o.reps, describe_machine());
    fmt::print(
        "| shape | threads | precision | parameters | separate ms | fused ms | "
        "separate / fused | same bits | disturbed |\n|---|---|---|---|---|---|---|---|---|\n");
  }
  int failures = 0;
  for (const std::string& shape : o.shapes)
    for (const int threads : o.threads)
      for (const std::string& precision : o.precisions) {
        if (precision == "bf16" && !bf16_support().native) {
          fmt::print(stderr, "actorpipe-bench update: bf16 skipped: {}\n",
                     bf16_support().describe());
          continue;
        }
        const CpuSnapshot before = cpu_snapshot();
        auto t = time_update(shape, threads, precision, o.reps);
        if (!t) {
          fmt::print(stderr, "actorpipe-bench update: {}\n", t.error().message);
          ++failures;
          continue;
        }
        const Interference during = interference(before, cpu_snapshot());
        const double sep = median(t->separate_ms), fus = median(t->fused_ms);
        if (!t->same_bits) ++failures;
        if (o.json) {
          nlohmann::ordered_json j;
          j["bench"] = "update";
          j["shape"] = t->shape;
          j["threads"] = t->threads;
          j["precision"] = t->precision;
          j["parameters"] = t->parameters;
          j["separate_ms"] = sep;
          j["fused_ms"] = fus;
          j["separate_ms_all"] = t->separate_ms;
          j["fused_ms_all"] = t->fused_ms;
          j["same_bits"] = t->same_bits;
          add_interference(j, during);
          fmt::print("{}\n", j.dump());
        } else {
          fmt::print("| {} | {} | {} | {:.1f}M | {:.2f} | {:.2f} | **{:.2f}×** | {} | {} |\n",
                     t->shape, t->threads, t->precision, static_cast<double>(t->parameters) / 1e6,
                     sep, fus, sep / fus, t->same_bits ? "yes" : "**NO**",
                     interference_cell(during));
        }
      }
  return failures == 0 ? 0 : 1;
}

}  // namespace actorpipe::bench
