// Gradient check: finite differences through the reference trainer, split against one-pass
// backward per layer.
#include "engine/execution/gradient_check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/execution/reference_trainer.hpp"
#include "engine/model/deferred_grads.hpp"
#include "engine/rng.hpp"

namespace actorpipe {
namespace {

double mean_loss(ReferenceTrainer& tr, std::span<const Microbatch> mbs) {
  double loss = 0.0;
  for (const Microbatch& mb : mbs) loss += tr.forward(mb).mean();
  return loss / static_cast<double>(mbs.size());
}

// Layer i's backward with random input and output gradient, once in one pass and once split.
SplitCheck check_split(const Model& model, int i, const Microbatch& mb, uint64_t seed) {
  const Layer& layer = model.layer(i);
  const size_t NC = static_cast<size_t>(mb.B) * mb.T * model.options().width;
  Context ctx(1);
  NormalRng rng(derive_seed(seed, 2, static_cast<uint64_t>(i)));
  std::vector<float> params(layer.param_floats());
  model.init_layer(i, params.data());
  std::vector<float> in(NC), dout(NC), out(NC), saved(layer.saved_floats(mb.B, mb.T));
  for (auto* v : {&in, &dout})
    for (float& x : *v) x = static_cast<float>(rng.next());
  std::vector<float> g0(layer.param_floats());
  for (float& x : g0) x = static_cast<float>(rng.next());  // backward accumulates onto it
  const float* x = layer.takes_input() ? in.data() : nullptr;
  layer.forward(ctx, params.data(), mb, x, layer.is_loss() ? nullptr : out.data(), saved.data());
  const float* dy = layer.is_loss() ? nullptr : dout.data();
  const float dloss = 1.0f / static_cast<float>(NC);

  ctx.arena().reset();
  std::vector<float> din_one(NC, 0.0f), g_one = g0;
  layer.backward(ctx, params.data(), g_one.data(), mb, x, saved.data(), dy,
                 layer.takes_input() ? din_one.data() : nullptr, dloss, nullptr);

  ctx.arena().reset();
  DeferredGrads later;
  std::vector<float> din(NC, 0.0f), g = g0, dout_copy = dout;
  layer.backward(ctx, params.data(), g.data(), mb, x, saved.data(),
                 layer.is_loss() ? nullptr : dout_copy.data(),
                 layer.takes_input() ? din.data() : nullptr, dloss, &later);
  SplitCheck c;
  c.layer = i;
  c.type = layer.type();
  c.deferred = later.size();
  c.din_equal = std::memcmp(din.data(), din_one.data(), NC * sizeof(float)) == 0;
  // what the caller may overwrite before run(): the output gradient and the arena's scratch
  std::fill(dout_copy.begin(), dout_copy.end(), 1e30f);
  ctx.arena().reset();
  std::fill_n(ctx.arena().alloc_f32(1 << 16), 1 << 16, -1e30f);
  later.run(ctx);
  c.grads_equal = std::memcmp(g.data(), g_one.data(), g.size() * sizeof(float)) == 0;
  return c;
}

}  // namespace

bool GradientCheck::passed() const {
  return std::all_of(slots.begin(), slots.end(),
                     [](const SlotCheck& s) { return s.failed == 0; }) &&
         std::all_of(splits.begin(), splits.end(),
                     [](const SplitCheck& s) { return s.din_equal && s.grads_equal; });
}

std::string GradientCheck::describe() const {
  std::string out;
  for (const SlotCheck& s : slots) {
    if (s.failed == 0) continue;
    out += fmt::format(
        "{}: {} of {} entries off the finite differences, worst {:.3g} of max |fd| "
        "{:.3g}\n",
        s.name, s.failed, s.checked, s.worst, s.scale);
  }
  for (const SplitCheck& s : splits) {
    if (!s.din_equal)
      out += fmt::format("layer {} ({}): split backward's din differs from the one-pass one\n",
                         s.layer, s.type);
    if (!s.grads_equal)
      out += fmt::format(
          "layer {} ({}): split backward's gradients after DeferredGrads::run differ from the "
          "one-pass ones\n",
          s.layer, s.type);
  }
  if (out.empty()) return "passed";
  out.pop_back();
  return out;
}

Expected<GradientCheck> check_gradients(const Model& model, std::span<const Microbatch> mbs,
                                        const GradientCheckOptions& options) {
  if (mbs.empty()) return make_error("gradient check: no microbatches");
  const int B = mbs.front().B, T = mbs.front().T;
  for (const Microbatch& mb : mbs) {
    if (mb.B != B || mb.T != T || B < 1 || T < 1 || T > model.options().context) {
      return make_error(
          "gradient check: microbatch of shape ({}, {}); all must be ({}, {}) with T <= context {}",
          mb.B, mb.T, B, T, model.options().context);
    }
  }
  if (!(options.step > 0) || options.entries_per_slot < 1 || !(options.tolerance > 0) ||
      !(options.jitter >= 0)) {
    return make_error(
        "gradient check: step = {}, entries_per_slot = {}, tolerance = {}: expected "
        "positive values",
        options.step, options.entries_per_slot, options.tolerance);
  }
  ReferenceTrainer tr(model, OptimizerOptions{}, B, T);
  if (options.jitter > 0) {
    NormalRng rng(derive_seed(options.seed, 1, 0));
    for (int i = 0; i < model.num_layers(); ++i)
      for (float& p : tr.params(i)) p += static_cast<float>(options.jitter * rng.next());
    for (const TiedParam& t : model.tied()) {
      const auto [a, b] = model.tied_slots(t);
      std::copy_n(tr.params(t.owner_layer).data() + a.offset, a.numel,
                  tr.params(t.copy_layer).data() + b.offset);
    }
  }
  GradientCheck out;
  out.loss = tr.compute_gradients(mbs);
  const float h = static_cast<float>(options.step);
  for (int i = 0; i < model.num_layers(); ++i) {
    const auto& slots = model.layer(i).slots();
    for (size_t si = 0; si < slots.size(); ++si) {
      if (model.is_tied_copy(i, si)) continue;
      const ParamSlot& s = slots[si];
      // the tied copies of this slot move with it: one parameter
      std::vector<float*> copies;
      for (const TiedParam& t : model.tied()) {
        if (t.owner_layer != i || t.owner_slot != s.name) continue;
        copies.push_back(tr.params(t.copy_layer).data() + model.tied_slots(t).copy.offset);
      }
      const size_t n = std::min(s.numel, static_cast<size_t>(options.entries_per_slot));
      std::vector<double> fd(n), analytic(n);
      for (size_t j = 0; j < n; ++j) {
        const size_t k = j * s.numel / n;
        float& p = tr.params(i)[s.offset + k];
        const float p0 = p;
        auto set = [&](float v) {
          p = v;
          for (float* c : copies) c[k] = v;
        };
        set(p0 + h);
        const double up = mean_loss(tr, mbs);
        set(p0 - h);
        const double down = mean_loss(tr, mbs);
        set(p0);
        // the step actually taken in f32
        fd[j] = (up - down) / (static_cast<double>(p0 + h) - static_cast<double>(p0 - h));
        analytic[j] = tr.grads(i)[s.offset + k];
      }
      SlotCheck c;
      c.name = model.param_name(i, s);
      c.checked = n;
      for (double v : fd) c.scale = std::max(c.scale, std::abs(v));
      for (size_t j = 0; j < n; ++j) {
        const double err = std::abs(analytic[j] - fd[j]);
        if (c.scale > 0) c.worst = std::max(c.worst, err / c.scale);
        if (err > options.tolerance * (c.scale + std::abs(fd[j]))) ++c.failed;
        if (c.scale == 0 && err > 0) c.worst = std::max(c.worst, err);
      }
      out.slots.push_back(std::move(c));
    }
  }
  for (int i = 0; i < model.num_layers(); ++i)
    out.splits.push_back(check_split(model, i, mbs.front(), options.seed));
  return out;
}

}  // namespace actorpipe
