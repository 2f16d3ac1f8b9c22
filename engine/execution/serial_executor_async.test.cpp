// Async-mode oracles: 2bw, pipedream and xpipe runs of the serial executor equal independent,
// plainly written simulations of their update rules on the unpartitioned model (Model layers and
// optimizer kernels, no StageWorker) bitwise, use exactly the versions their rules name, and keep
// no more weight versions than their policies allow.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/data/loader.hpp"
#include "engine/execution/layer_optimizer.hpp"
#include "engine/execution/serial_executor.hpp"
#include "engine/schedule/simulator.hpp"
#include "kernels/basis_rotation.hpp"
#include "kernels/optimizer.hpp"
#include "tests/support/bits.hpp"
#include "tests/support/tiny_executor.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

ModelOptions tiny(Arch arch, bool tied = true) {
  return tiny_model(arch, tied, 3);
}

OptimizerOptions adamw() {
  OptimizerOptions o;
  o.kind = "adamw";
  o.lr = 2e-2f;
  o.weight_decay = 0.1f;
  o.grad_clip = 0.2f;  // below every stage's gradient norm: each stage clips with its own scale
  return o;
}

std::vector<Microbatch> batches(Arch arch, int V, int64_t n) {
  return tiny_batches(arch, V, n, 21);
}

std::unique_ptr<SerialExecutor> executor(const Model& model, const Partition& p,
                                         const OptimizerOptions& opt, Mode mode, int m,
                                         bool lowered = true) {
  SerialExecutorOptions o;
  o.lowered = lowered;
  o.mode = mode;
  o.microbatches = m;
  o.log_versions = true;
  return tiny_executor(model, p, opt, o);
}

using Buffers = std::vector<std::vector<float>>;  // per global layer

// ---------------------------------------------------------------------------------------------
// The simulations' building blocks, written against Model, Layer and the optimizer kernels.

struct Plain {
  const Model& model;
  const Partition& partition;
  OptimizerOptions opt;
  Context ctx{1};
  std::vector<std::vector<float>> hidden, saved;
  std::vector<float> da, db;

  Plain(const Model& m, const Partition& p, const OptimizerOptions& o)
      : model(m), partition(p), opt(o) {
    const size_t bth = static_cast<size_t>(kB) * kT * m.options().width;
    for (int i = 0; i < m.num_layers(); ++i) {
      hidden.emplace_back(bth, 0.0f);
      saved.emplace_back(m.layer(i).saved_floats(kB, kT), 0.0f);
    }
    da.assign(bth, 0.0f);
    db.assign(bth, 0.0f);
  }

  Buffers init() const {
    Buffers w;
    for (int i = 0; i < model.num_layers(); ++i) {
      w.emplace_back(model.layer(i).param_floats(), 0.0f);
      model.init_layer(i, w.back().data());
    }
    return w;
  }
  Buffers zeros_like_state() const {
    Buffers s;
    for (int i = 0; i < model.num_layers(); ++i)
      s.emplace_back(optimizer_state_floats(opt, model.layer(i)), 0.0f);
    return s;
  }
  Buffers zeros_like_params() const {
    Buffers g;
    for (int i = 0; i < model.num_layers(); ++i)
      g.emplace_back(model.layer(i).param_floats(), 0.0f);
    return g;
  }

  // Forward of one microbatch with layer i computing with fwd[i], backward with bwd[i],
  // accumulating into g; dloss as a step of m microbatches. Returns the microbatch's mean loss.
  double forward_backward(const Microbatch& mb, const std::vector<const float*>& fwd,
                          const std::vector<const float*>& bwd, Buffers& g, int m) {
    const int L = model.num_layers();
    LossStats loss;
    for (int i = 0; i < L; ++i) {
      const size_t k = static_cast<size_t>(i);
      ctx.arena().reset();
      loss = model.layer(i).forward(ctx, fwd[k], mb, i > 0 ? hidden[k - 1].data() : nullptr,
                                    i + 1 < L ? hidden[k].data() : nullptr, saved[k].data());
    }
    const float dloss = loss_scale(loss.count, m);
    const float* dout = nullptr;
    for (int i = L - 1; i >= 0; --i) {
      const size_t k = static_cast<size_t>(i);
      float* din = i > 0 ? (dout == da.data() ? db.data() : da.data()) : nullptr;
      ctx.arena().reset();
      model.layer(i).backward(ctx, bwd[k], g[k].data(), mb, i > 0 ? hidden[k - 1].data() : nullptr,
                              saved[k].data(), dout, din, dloss, nullptr);
      dout = din;
    }
    return loss.mean();
  }

  // The tied gradient: owner + copy, in that order, to both.
  void reduce_tied(Buffers& g) const {
    for (const TiedParam& t : model.tied()) {
      const ParamSlot* a = model.layer(t.owner_layer).find_slot(t.owner_slot);
      const ParamSlot* b = model.layer(t.copy_layer).find_slot(t.copy_slot);
      reduce_tied_grads(g[static_cast<size_t>(t.owner_layer)].data() + a->offset,
                        g[static_cast<size_t>(t.copy_layer)].data() + b->offset, a->numel);
    }
  }

  // Per-stage clip scales: each stage's Σg² over its layers in order (tied copy excluded, so the
  // tied parameter belongs to its owner's stage).
  std::vector<float> stage_scales(const Buffers& g) {
    std::vector<float> scales;
    for (int r = 0; r < partition.stages(); ++r) {
      double sum = 0.0;
      for (int i = partition.begin(r); i < partition.end(r); ++i)
        sum += model.grad_sumsq(ctx, i, g[static_cast<size_t>(i)].data());
      scales.push_back(clip_scale(sum, opt.grad_clip));
    }
    return scales;
  }

  // One update of every layer at optimizer step `step`, each layer with its stage's scale and,
  // for the dc and secant corrections, its weight change since the weights of its gradient
  // (`stale[i]`, nullptr when they are the newest: nothing stale); the tied copy then equals the
  // owner (its values, and with `copy_state` its optimizer state).
  void update(Buffers& w, Buffers& state, const Buffers& g, long step, bool copy_state,
              const std::vector<const std::vector<float>*>& stale = {}) {
    const std::vector<float> scales = stage_scales(g);
    for (int i = 0; i < model.num_layers(); ++i) {
      const size_t k = static_cast<size_t>(i);
      std::vector<float> delta;
      if (needs_weight_change(opt) && k < stale.size() && stale[k] != nullptr) {
        delta.resize(w[k].size());
        for (size_t e = 0; e < delta.size(); ++e) delta[e] = w[k][e] - (*stale[k])[e];
      }
      optimizer_update(ctx, opt, model.layer(i), w[k].data(), g[k].data(), state[k].data(), step,
                       scales[static_cast<size_t>(partition.stage_of(i))],
                       delta.empty() ? nullptr : delta.data());
    }
    for (const TiedParam& t : model.tied()) {
      const ParamSlot* a = model.layer(t.owner_layer).find_slot(t.owner_slot);
      const ParamSlot* b = model.layer(t.copy_layer).find_slot(t.copy_slot);
      const size_t o = static_cast<size_t>(t.owner_layer), c = static_cast<size_t>(t.copy_layer);
      std::copy_n(w[o].data() + a->offset, a->numel, w[c].data() + b->offset);
      if (!copy_state) continue;
      const size_t no = model.layer(t.owner_layer).param_floats();
      const size_t nc = model.layer(t.copy_layer).param_floats();
      std::copy_n(state[o].data() + a->offset, a->numel, state[c].data() + b->offset);
      if (opt.kind == "adamw")
        std::copy_n(state[o].data() + no + a->offset, a->numel, state[c].data() + nc + b->offset);
    }
  }

  // A copy of w[copy_layer] whose tied slot holds `owner`'s tied parameter.
  std::vector<float> with_tied_of(const std::vector<float>& head, const std::vector<float>& owner,
                                  const TiedParam& t) const {
    std::vector<float> out = head;
    const ParamSlot* a = model.layer(t.owner_layer).find_slot(t.owner_slot);
    const ParamSlot* b = model.layer(t.copy_layer).find_slot(t.copy_slot);
    std::copy_n(owner.data() + a->offset, a->numel, out.data() + b->offset);
    return out;
  }
};

std::vector<const float*> pointers(const Buffers& w) {
  std::vector<const float*> p;
  for (const auto& b : w) p.push_back(b.data());
  return p;
}

void check_params(const SerialExecutor& e, const Buffers& w) {
  for (int i = 0; i < e.model().num_layers(); ++i) {
    INFO("layer " << i);
    CHECK(same_bits(e.params(i), w[static_cast<size_t>(i)]));
  }
}

// Both copies of every tied parameter are identical in the executor's newest weights.
void check_tied_identical(const SerialExecutor& e) {
  for (const TiedParam& t : e.model().tied()) {
    const ParamSlot* a = e.model().layer(t.owner_layer).find_slot(t.owner_slot);
    const ParamSlot* b = e.model().layer(t.copy_layer).find_slot(t.copy_slot);
    CHECK(same_bits(e.params(t.owner_layer).subspan(a->offset, a->numel),
                    e.params(t.copy_layer).subspan(b->offset, b->numel)));
  }
}

// Every stage's store has the policy's capacity, never pinned more versions than that, reached
// it exactly (the bound is tight), and agrees with the simulator's count from the schedule.
void check_version_bounds(const SerialExecutor& e, Mode mode, int steps) {
  auto schedules = e.schedules_for(steps);
  REQUIRE(schedules.ok());
  const std::vector<int> kept = versions_kept(schedules->back());
  for (int r = 0; r < e.stages(); ++r) {
    const WeightStore& store = e.worker(r).store();
    const int d = e.stages();
    const int expected = mode == Mode::twobw ? 2 : mode == Mode::pipedream ? d - r : 1;
    INFO("stage " << r);
    CHECK(store.capacity() == expected);
    CHECK(store.peak_versions() == expected);
    CHECK(store.peak_versions() == kept[static_cast<size_t>(r)]);
  }
}

// ---------------------------------------------------------------------------------------------
// The rules, simulated on the unpartitioned model. Each returns the per-step losses and the final
// weights of every layer.

struct Simulated {
  std::vector<double> losses;
  Buffers weights;
};

// 2bw: W(t+1) = W(t) − opt(g_t(W(t−1))), W(−1) = W(0); the tied copy equals the owner.
Simulated simulate_2bw(const Model& model, const Partition& p, const OptimizerOptions& opt,
                       const std::vector<Microbatch>& mbs, int m, int steps) {
  Plain sim(model, p, opt);
  Buffers w = sim.init(), prev = w, state = sim.zeros_like_state();
  Simulated out;
  for (int t = 0; t < steps; ++t) {
    Buffers g = sim.zeros_like_params();
    double loss = 0.0;
    for (int j = t * m; j < (t + 1) * m; ++j)
      loss +=
          sim.forward_backward(mbs[static_cast<size_t>(j)], pointers(prev), pointers(prev), g, m);
    out.losses.push_back(loss / m);
    sim.reduce_tied(g);
    Buffers next = w;
    // dc: Δ = W(t) − W(t−1); at t = 0 the gradients' weights are the newest (W(−1) = W(0))
    std::vector<const std::vector<float>*> stale;
    if (t > 0)
      for (const auto& b : prev) stale.push_back(&b);
    sim.update(next, state, g, t + 1, false, stale);
    prev = std::move(w);
    w = std::move(next);
  }
  out.weights = std::move(w);
  return out;
}

// pipedream: stage r's version for microbatch j.
int staleness_version(int d, int r, int64_t j) {
  return static_cast<int>(std::max<int64_t>(0, j - (d - 1 - r)));
}

// pipedream: per-microbatch updates; stage r computes microbatch k's gradient with its version
// k−(d−1−r) and applies it to its newest weights; the tied parameter is read at the owner's
// version at both ends and updated by the owner.
Simulated simulate_pipedream(const Model& model, const Partition& p, const OptimizerOptions& opt,
                             const std::vector<Microbatch>& mbs, int n) {
  const int d = p.stages();
  Plain sim(model, p, opt);
  std::vector<Buffers> versions{sim.init()};  // versions[v]: every layer after v updates
  Buffers state = sim.zeros_like_state();
  Simulated out;
  for (int k = 0; k < n; ++k) {
    Buffers used;
    for (int i = 0; i < model.num_layers(); ++i) {
      const int v = staleness_version(d, p.stage_of(i), k);
      used.push_back(versions[static_cast<size_t>(v)][static_cast<size_t>(i)]);
    }
    for (const TiedParam& t : model.tied()) {
      const Buffers& owner = versions[static_cast<size_t>(staleness_version(d, 0, k))];
      used[static_cast<size_t>(t.copy_layer)] = sim.with_tied_of(
          used[static_cast<size_t>(t.copy_layer)], owner[static_cast<size_t>(t.owner_layer)], t);
    }
    Buffers g = sim.zeros_like_params();
    out.losses.push_back(
        sim.forward_backward(mbs[static_cast<size_t>(k)], pointers(used), pointers(used), g, 1));
    sim.reduce_tied(g);
    Buffers next = versions.back();
    // dc: each layer's Δ against the version its stage computed microbatch k with
    std::vector<const std::vector<float>*> stale;
    for (int i = 0; i < model.num_layers(); ++i) {
      const size_t v = static_cast<size_t>(staleness_version(d, p.stage_of(i), k));
      stale.push_back(v + 1 == versions.size() ? nullptr : &versions[v][static_cast<size_t>(i)]);
    }
    sim.update(next, state, g, k + 1, false, stale);
    versions.push_back(std::move(next));
  }
  out.weights = versions.back();
  return out;
}

// The XPipe prediction, written from docs/modes.md: Ŵ = W − s·lr·(m̂/(√v̂+ε) + wd·W) for AdamW,
// Ŵ = W − s·lr·buf for SGD, at t updates (nothing to predict at t = 0).
std::vector<float> predicted(const Layer& layer, const OptimizerOptions& o,
                             const std::vector<float>& w, const std::vector<float>& state, long t,
                             int s) {
  if (t == 0 || s == 0) return w;
  std::vector<float> out(w.size());
  const size_t n = w.size();
  const float lr = o.warmup_steps > 0 && t + 1 < o.warmup_steps
                       ? o.lr * static_cast<float>(t + 1) / static_cast<float>(o.warmup_steps)
                       : o.lr;
  const float k = static_cast<float>(s) * lr;
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(o.beta1), t));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(o.beta2), t));
  for (size_t si = 0; si < layer.slots().size(); ++si) {
    const ParamSlot& slot = layer.slots()[si];
    const float wd = slot.decay ? o.weight_decay : 0.0f;
    if (const RotationShape shape = slot_rotation(o, slot); shape.any()) {
      // basis rotation: AdamW's direction in the rotated basis, brought back
      std::vector<float> dir(slot.numel);
      std::vector<float> rotation(
          state.begin() + static_cast<std::ptrdiff_t>(rotation_state_offset(o, layer, si)),
          state.end());
      Context ctx(1);
      rotated_adamw_direction(ctx, state.data() + slot.offset, state.data() + n + slot.offset,
                              shape, rotation_state(shape, rotation.data()), bc1, std::sqrt(bc2),
                              o.eps, dir.data());
      for (size_t i = 0; i < slot.numel; ++i) {
        const float wi = w[slot.offset + i];
        out[slot.offset + i] = wi - k * (dir[i] + wd * wi);
      }
      continue;
    }
    for (size_t i = slot.offset; i < slot.offset + slot.numel; ++i) {
      if (o.kind == "adamw") {
        const float mhat = state[i] / bc1;
        const float denom = std::sqrt(state[n + i]) / std::sqrt(bc2) + o.eps;
        out[i] = w[i] - k * (mhat / denom + wd * w[i]);
      } else {
        out[i] = w[i] - k * state[i];
      }
    }
  }
  return out;
}

// xpipe: the versions of stage r (w = d−1−r warm-up forwards, an update after each step's last
// B): before F(j) it has done floor(max(j−w, 0)/m) updates, before B(j) floor(j/m).
int xpipe_f_version(int d, int m, int r, int64_t j) {
  return static_cast<int>(std::max<int64_t>(j - (d - 1 - r), 0) / m);
}
int xpipe_b_version(int m, int64_t j) {
  return static_cast<int>(j / m);
}

// xpipe: per-step updates W(t+1) = W(t) − opt(g_t); microbatch j's forward at stage r uses the
// prediction from its F version, its backward the weights W(t) of its step. The tied copy (the
// head, at the last stage) computes forward and backward with the tied value the owner's forward
// used for the same microbatch: the owner's prediction.
Simulated simulate_xpipe(const Model& model, const Partition& p, const OptimizerOptions& opt,
                         const std::vector<Microbatch>& mbs, int m, int steps) {
  const int d = p.stages();
  Plain sim(model, p, opt);
  std::vector<Buffers> w{sim.init()}, st{sim.zeros_like_state()};
  Simulated out;
  for (int t = 0; t < steps; ++t) {
    Buffers g = sim.zeros_like_params();
    double loss = 0.0;
    for (int j = t * m; j < (t + 1) * m; ++j) {
      Buffers fwd;
      for (int i = 0; i < model.num_layers(); ++i) {
        const size_t k = static_cast<size_t>(i);
        const int vf = xpipe_f_version(d, m, p.stage_of(i), j);
        fwd.push_back(predicted(model.layer(i), opt, w[static_cast<size_t>(vf)][k],
                                st[static_cast<size_t>(vf)][k], vf, t - vf));
      }
      Buffers bwd = w[static_cast<size_t>(t)];
      for (const TiedParam& tp : model.tied()) {
        if (p.stage_of(tp.owner_layer) == p.stage_of(tp.copy_layer)) continue;
        const size_t c = static_cast<size_t>(tp.copy_layer);
        const std::vector<float>& owner = fwd[static_cast<size_t>(tp.owner_layer)];
        fwd[c] = sim.with_tied_of(fwd[c], owner, tp);
        bwd[c] = sim.with_tied_of(bwd[c], owner, tp);
      }
      loss += sim.forward_backward(mbs[static_cast<size_t>(j)], pointers(fwd), pointers(bwd), g, m);
    }
    out.losses.push_back(loss / m);
    sim.reduce_tied(g);
    Buffers next = w.back(), next_state = st.back();
    sim.update(next, next_state, g, t + 1, true);
    w.push_back(std::move(next));
    st.push_back(std::move(next_state));
  }
  out.weights = w.back();
  return out;
}

// The versions every F and B used, as each rule names them.
void check_versions(const SerialExecutor& e, Mode mode, int m) {
  const int d = e.stages();
  const bool tied = !e.model().tied().empty();
  for (const VersionUse& u : e.version_log()) {
    INFO("stage " << u.stage << " " << to_string(u.kind) << u.microbatch);
    if (mode == Mode::twobw) {
      CHECK(u.version == std::max(static_cast<int>(u.microbatch / m) - 1, 0));
      CHECK(u.tied_version == (tied && d > 1 && u.stage == d - 1 ? u.version : -1));
    } else if (mode == Mode::pipedream) {
      CHECK(u.version == staleness_version(d, u.stage, u.microbatch));
      CHECK(u.tied_version ==
            (tied && d > 1 && u.stage == d - 1 ? staleness_version(d, 0, u.microbatch) : -1));
    } else {
      if (u.kind == ActionKind::F) {
        CHECK(u.version == xpipe_f_version(d, m, u.stage, u.microbatch));
        CHECK(u.lookahead ==
              xpipe_b_version(m, u.microbatch) - xpipe_f_version(d, m, u.stage, u.microbatch));
      } else {
        CHECK(u.version == xpipe_b_version(m, u.microbatch));
        CHECK(u.lookahead == 0);
      }
      // the head's F and B: the owner's F version, predicted as far ahead as the owner did
      const int owner_v = xpipe_f_version(d, m, 0, u.microbatch);
      const bool head = tied && d > 1 && u.stage == d - 1;
      CHECK(u.tied_version == (head ? owner_v : -1));
      CHECK(u.tied_lookahead ==
            (head && owner_v > 0 ? xpipe_b_version(m, u.microbatch) - owner_v : 0));
      continue;
    }
    CHECK(u.tied_lookahead == 0);
  }
}

// Runs the executor and the mode's simulation on the same microbatches and compares everything.
void compare(Arch arch, bool tied, const Partition& p, const OptimizerOptions& opt, Mode mode,
             int m, int steps, bool lowered = true) {
  const Model model = build_model(tiny(arch, tied));
  auto e = executor(model, p, opt, mode, m, lowered);
  const auto mbs = batches(arch, model.options().vocab_size, e->microbatches_for(steps));
  auto losses = e->run(steps, mbs);
  REQUIRE_MESSAGE(losses.ok(), (losses.ok() ? "" : losses.error().message));
  const Simulated sim = mode == Mode::twobw       ? simulate_2bw(model, p, opt, mbs, m, steps)
                        : mode == Mode::pipedream ? simulate_pipedream(model, p, opt, mbs, steps)
                                                  : simulate_xpipe(model, p, opt, mbs, m, steps);
  CHECK(*losses == sim.losses);
  check_params(*e, sim.weights);
  check_tied_identical(*e);
  check_version_bounds(*e, mode, steps);
  check_versions(*e, mode, m);
  CHECK(e->version_log().size() == static_cast<size_t>(2 * p.stages() * mbs.size()));
}

}  // namespace

// ---------------------------------------------------------------------------------------------

TEST_CASE("2bw equals W(t+1) = W(t) - opt(grad f(W(t-1))), W(-1) = W(0), bitwise") {
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    for (bool tied : {true, false}) {
      for (int d = 1; d <= 4; ++d) {
        const Partition p = *Partition::even(4, d);
        for (int m = d; m <= d + 2; ++m) {
          INFO((arch == Arch::gpt ? "gpt" : "bert")
               << " tied " << tied << " d=" << d << " m=" << m);
          compare(arch, tied, p, adamw(), Mode::twobw, m, 4);
          if (m == d + 1 && tied) compare(arch, tied, p, clipped_sgd(), Mode::twobw, m, 4);
        }
      }
    }
  }
}

TEST_CASE("pipedream: stage r is d-1-r updates behind, F and B share a version, bitwise") {
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    for (bool tied : {true, false}) {
      for (int d = 1; d <= 4; ++d) {
        INFO((arch == Arch::gpt ? "gpt" : "bert") << " tied " << tied << " d=" << d);
        const Partition p = *Partition::even(4, d);
        compare(arch, tied, p, adamw(), Mode::pipedream, 1, 9);
        if (d == 3) compare(arch, tied, p, clipped_sgd(), Mode::pipedream, 1, 9);
      }
    }
  }
}

TEST_CASE("xpipe forwards use the predicted weights of its formula, backwards the actual ones") {
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    for (bool tied : {true, false}) {
      for (int d = 1; d <= 4; ++d) {
        const Partition p = *Partition::even(4, d);
        for (int m = 1; m <= 4; ++m) {
          INFO((arch == Arch::gpt ? "gpt" : "bert")
               << " tied " << tied << " d=" << d << " m=" << m);
          compare(arch, tied, p, adamw(), Mode::xpipe, m, 4);
          if (m == 2 && tied) compare(arch, tied, p, clipped_sgd(), Mode::xpipe, m, 4);
        }
      }
    }
  }
}

TEST_CASE("async modes with uneven partitions and compute-only schedules") {
  for (const std::vector<int>& counts :
       {std::vector<int>{1, 3}, std::vector<int>{3, 1}, std::vector<int>{1, 2, 1}}) {
    const Partition p = *Partition::from_counts(4, counts);
    for (bool lowered : {true, false}) {
      INFO(p.to_string() << " lowered " << lowered);
      compare(Arch::gpt, true, p, adamw(), Mode::twobw, 3, 3, lowered);
      compare(Arch::bert, true, p, adamw(), Mode::pipedream, 1, 7, lowered);
      compare(Arch::gpt, true, p, adamw(), Mode::xpipe, 2, 4, lowered);
    }
  }
}

TEST_CASE("async runs continue: a second run restarts the staleness from the current weights") {
  // Two pipedream runs of 5 microbatches: the second starts with every stage on the newest
  // version (all F/B of its first microbatches use it), and the tied copy follows the owner.
  const Model model = build_model(tiny(Arch::gpt));
  const Partition p = *Partition::even(model.num_layers(), 3);
  const OptimizerOptions opt = adamw();
  const auto mbs = batches(Arch::gpt, model.options().vocab_size, 10);
  auto e = executor(model, p, opt, Mode::pipedream, 1);
  REQUIRE(e->run(5, std::span(mbs).first(5)).ok());
  REQUIRE(e->run(5, std::span(mbs).subspan(5)).ok());
  for (const VersionUse& u : e->version_log()) {
    const int64_t j = u.microbatch >= 5 ? u.microbatch - 5 : u.microbatch;
    const int base = u.microbatch >= 5 ? 5 : 0;
    CHECK(u.version == base + static_cast<int>(std::max<int64_t>(0, j - (2 - u.stage))));
  }
  check_tied_identical(*e);
  for (int r = 0; r < 3; ++r) CHECK(e->worker(r).updates() == 10);
}

TEST_CASE("delay corrections: 2bw, pipedream and xpipe equal their rules with every correction") {
  // nesterov changes only the optimizer's formula (kernels/optimizer.test.cpp holds it to its
  // double reference); dc's and secant's Δ is each stage's newest version minus the version its
  // gradient was computed with, which the simulations take from their own version lists (secant
  // keeps the rest of what it needs in the optimizer state)
  for (const char* correction : {"nesterov", "dc", "secant", "dc+nesterov", "secant+nesterov"}) {
    for (bool use_sgd : {false, true}) {
      OptimizerOptions opt = use_sgd ? clipped_sgd() : adamw();
      opt.delay_correction = correction;
      opt.dc_lambda = 50.0f;
      for (int d = 1; d <= 4; ++d) {
        INFO(correction << (use_sgd ? " sgd" : " adamw") << " d=" << d);
        const Partition p = *Partition::even(4, d);
        compare(Arch::gpt, true, p, opt, Mode::twobw, d + 1, 4);
        compare(Arch::bert, false, p, opt, Mode::pipedream, 1, 9);
        if (std::string(correction) == "nesterov") {
          compare(Arch::gpt, true, p, opt, Mode::xpipe, 2, 4);
          if (!use_sgd) {  // NAdam's momentum schedule
            OptimizerOptions decayed = opt;
            decayed.momentum_decay = 0.004f;
            compare(Arch::gpt, true, p, decayed, Mode::twobw, d + 1, 4);
            compare(Arch::bert, false, p, decayed, Mode::pipedream, 1, 9);
          }
        }
      }
    }
  }
}

TEST_CASE("the dc and secant corrections change the bits only where a gradient is stale") {
  // on one stage pipedream's gradients are never stale: dc and secant compute the bits of none;
  // 2bw's are (one update behind): each differs from none after its second update
  const Partition one = *Partition::even(4, 1);
  for (const char* correction : {"dc", "secant"}) {
    INFO(correction);
    OptimizerOptions none = adamw(), dc = adamw();
    dc.delay_correction = correction;
    dc.dc_lambda = 50.0f;
    const Model model = build_model(tiny(Arch::gpt));
    const auto mbs = batches(Arch::gpt, model.options().vocab_size, 12);
    auto run = [&](const OptimizerOptions& o, Mode mode, int m, int steps) {
      auto e = executor(model, one, o, mode, m);
      auto losses = e->run(steps, std::span(mbs).first(static_cast<size_t>(m * steps)));
      REQUIRE(losses.ok());
      return std::vector<float>(e->params(1).begin(), e->params(1).end());
    };
    CHECK(same_bits(run(none, Mode::pipedream, 1, 9), run(dc, Mode::pipedream, 1, 9)));
    CHECK(same_bits(run(none, Mode::twobw, 2, 1), run(dc, Mode::twobw, 2, 1)));
    CHECK_FALSE(same_bits(run(none, Mode::twobw, 2, 3), run(dc, Mode::twobw, 2, 3)));
  }
}

TEST_CASE("basis rotation: 2bw, pipedream and xpipe equal their rules, alone and with nesterov") {
  // the rotation changes only the optimizer (kernels/basis_rotation.test.cpp holds it to its
  // double reference) and its state: the simulations call the same optimizer_update, and xpipe's
  // predict_weights, on their own state. rotation_max_dim 40 leaves the tiny model's wider sides
  // (3C = 96, 4C = 128, the vocabulary 64) in the coordinates; 1024 rotates every side; block
  // 24 splits every side in blocks (32 = 24 + 8, 96 = 4·24, 128 = 5·24 + 8, 64 = 2·24 + 16).
  struct Rotation {
    int max_dim, block;
  };
  for (const char* correction : {"none", "nesterov"}) {
    for (const Rotation rot : {Rotation{40, 0}, Rotation{1024, 0}, Rotation{1024, 24}}) {
      OptimizerOptions opt = adamw();
      opt.delay_correction = correction;
      opt.basis_rotation = true;
      opt.rotation_every = 2;
      opt.rotation_max_dim = rot.max_dim;
      opt.rotation_block = rot.block;
      for (int d = 1; d <= 4; ++d) {
        INFO(std::string(correction)
             << " max_dim " << rot.max_dim << " block " << rot.block << " d=" << d);
        const Partition p = *Partition::even(4, d);
        SUBCASE("2bw") {
          compare(Arch::gpt, true, p, opt, Mode::twobw, d + 1, 4);
        }
        SUBCASE("pipedream") {
          compare(Arch::bert, false, p, opt, Mode::pipedream, 1, 9);
        }
        SUBCASE("xpipe") {
          compare(Arch::gpt, true, p, opt, Mode::xpipe, 2, 4);
        }
      }
    }
  }
}

TEST_CASE("basis rotation changes the bits of AdamW, except where no side rotates") {
  const Partition p = *Partition::even(4, 2);
  const Model model = build_model(tiny(Arch::gpt));
  const auto mbs = batches(Arch::gpt, model.options().vocab_size, 12);
  auto run = [&](const OptimizerOptions& o) {
    auto e = executor(model, p, o, Mode::twobw, 3);
    REQUIRE(e->run(3, std::span(mbs).first(9)).ok());
    return std::vector<float>(e->params(1).begin(), e->params(1).end());
  };
  OptimizerOptions rotated = adamw(), none_rotates = adamw();
  rotated.basis_rotation = none_rotates.basis_rotation = true;
  none_rotates.rotation_max_dim = 1;  // every dimension of the tiny model is above it
  CHECK(optimizer_state_floats(none_rotates, model.layer(1)) ==
        optimizer_state_floats(adamw(), model.layer(1)));
  CHECK(optimizer_state_floats(rotated, model.layer(1)) >
        optimizer_state_floats(adamw(), model.layer(1)));
  CHECK(same_bits(run(adamw()), run(none_rotates)));
  CHECK_FALSE(same_bits(run(adamw()), run(rotated)));
}
