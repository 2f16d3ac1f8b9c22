// Layer profile: each layer of a model timed alone for one microbatch, through the same Layer,
// optimizer and prediction calls a StageWorker makes, on a Context of the stage's thread count.
#include "bench/layer_profile.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "bench/step_timing.hpp"
#include "engine/batch.hpp"
#include "engine/layer_optimizer.hpp"
#include "engine/model.hpp"
#include "engine/xpipe_prediction.hpp"
#include "kernels/context.hpp"

namespace actorpipe::bench {

namespace {

using Clock = std::chrono::steady_clock;

/// Median seconds of `reps` calls of fn (after none: the caller warms up).
template <class F>
double time_median(int reps, F&& fn) {
  std::vector<double> s;
  s.reserve(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    fn();
    s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(std::move(s));
}

}  // namespace

Expected<LayerProfile> profile_layers(const ModelOptions& model_opts,
                                      const OptimizerOptions& optimizer, int B, int T, int threads,
                                      int reps) {
  if (B < 1 || T < 1 || T > model_opts.context || threads < 1 || reps < 1)
    return make_error(
        "layer profile: B = {}, T = {}, threads = {}, reps = {}: expected B, threads and reps >= "
        "1 and 1 <= T <= context ({})",
        B, T, threads, reps, model_opts.context);
  auto built = Model::build(model_opts);
  if (!built) return built.error();
  const Model& model = *built;
  const int n = model.num_layers();
  const size_t bth = static_cast<size_t>(B) * T * model_opts.width;
  Context ctx(threads);
  const Microbatch mb = random_microbatch(model_opts.vocab_size, B, T, 1234);
  const float dloss = loss_scale(count_targets(mb), 1);

  std::vector<std::vector<float>> params(static_cast<size_t>(n)), grads(params), state(params),
      saved(params), spare(params);
  // acts[i] is layer i's input (acts[0] unused: the embedding reads tokens); the head writes none
  std::vector<std::vector<float>> acts(static_cast<size_t>(n) + 1, std::vector<float>(bth));
  std::vector<std::vector<float>> dacts(acts);  // dacts[i]: gradient w.r.t. acts[i]
  for (int i = 0; i < n; ++i) {
    const size_t k = static_cast<size_t>(i);
    const Layer& layer = model.layer(i);
    params[k].resize(layer.param_floats());
    model.init_layer(i, params[k].data());
    grads[k].assign(layer.param_floats(), 0.0f);
    spare[k].resize(layer.param_floats());
    state[k].assign(optimizer_state_floats(optimizer, layer.param_floats()), 0.0f);
    saved[k].resize(layer.saved_floats(B, T));
  }
  // a small, non-zero gradient arriving at the last hidden state (unused: the head makes its own)
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.0f, 1e-3f);
  for (float& x : dacts[static_cast<size_t>(n)]) x = g(rng);

  auto forward = [&](int i) {
    const size_t k = static_cast<size_t>(i);
    const Layer& layer = model.layer(i);
    ctx.arena().reset();
    layer.forward(ctx, params[k].data(), mb, layer.takes_input() ? acts[k].data() : nullptr,
                  layer.is_loss() ? nullptr : acts[k + 1].data(), saved[k].data());
  };
  auto backward = [&](int i) {
    const size_t k = static_cast<size_t>(i);
    const Layer& layer = model.layer(i);
    ctx.arena().reset();
    layer.backward(ctx, params[k].data(), grads[k].data(), mb,
                   layer.takes_input() ? acts[k].data() : nullptr, saved[k].data(),
                   layer.is_loss() ? nullptr : dacts[k + 1].data(),
                   layer.takes_input() ? dacts[k].data() : nullptr, dloss);
  };

  LayerProfile p;
  p.threads = threads;
  p.tied = model_opts.tied;
  p.B = B;
  p.T = T;
  p.reps = reps;
  p.layers.resize(static_cast<size_t>(n));
  // warm-up chains: realistic inputs and gradients for every layer, memory touched
  for (int i = 0; i < n; ++i) forward(i);
  for (int i = n - 1; i >= 0; --i) backward(i);
  for (int i = 0; i < n; ++i) {
    LayerCost& c = p.layers[static_cast<size_t>(i)];
    c.name = fmt::format("{} {}", to_string(model.layer(i).kind()), i);
    c.forward = time_median(reps, [&] { forward(i); });
  }
  for (int i = n - 1; i >= 0; --i)
    p.layers[static_cast<size_t>(i)].backward = time_median(reps, [&] { backward(i); });
  long step = 0;
  for (int i = 0; i < n; ++i) {
    const size_t k = static_cast<size_t>(i);
    const Layer& layer = model.layer(i);
    LayerCost& c = p.layers[k];
    c.update = time_median(reps, [&] {
      ctx.arena().reset();
      (void)model.grad_sumsq(ctx, i, grads[k].data());
      optimizer_update(ctx, optimizer, layer, params[k].data(), grads[k].data(), state[k].data(),
                       ++step, 1.0f);
      std::fill(grads[k].begin(), grads[k].end(), 0.0f);
    });
    c.copy =
        time_median(reps, [&] { std::copy(params[k].begin(), params[k].end(), spare[k].begin()); });
    c.predict = time_median(reps, [&] {
      predict_weights(ctx, optimizer, layer, params[k].data(), state[k].data(), std::max(step, 1L),
                      1, spare[k].data());
    });
  }
  return p;
}

Expected<LayerProfile> profile_layers_loaded(const ModelOptions& model,
                                             const OptimizerOptions& optimizer, int B, int T,
                                             int threads, int reps, int load_threads) {
  if (load_threads < 0)
    return make_error("layer profile: load_threads = {}, expected >= 0", load_threads);
  std::atomic<bool> stop{false};
  std::atomic<int> started{0};
  std::vector<std::thread> load;
  for (int i = 0; i < load_threads; ++i) {
    load.emplace_back([&] {
      started.fetch_add(1);
      // one rep per call: the loop checks `stop` often enough (a call is one chain of layers)
      while (!stop.load()) {
        if (!profile_layers(model, optimizer, B, T, 1, 1)) break;
      }
    });
  }
  while (started.load() < load_threads) std::this_thread::yield();
  auto p = profile_layers(model, optimizer, B, T, threads, reps);
  stop.store(true);
  for (std::thread& t : load) t.join();
  if (p) p->load_threads = load_threads;
  return p;
}

}  // namespace actorpipe::bench
