// Profiler: each layer of a model timed alone for one microbatch, through the same Layer,
// optimizer and prediction calls a StageWorker makes, on a Context of the stage's thread count;
// its bytes from the model's sizes.
#include "engine/profiler/profiler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <thread>

#include "engine/batch.hpp"
#include "engine/execution/layer_optimizer.hpp"
#include "engine/execution/xpipe_prediction.hpp"
#include "engine/model/deferred_grads.hpp"
#include "engine/model/model.hpp"
#include "kernels/context.hpp"
#include "kernels/crossentropy.hpp"

namespace actorpipe {

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

/// Random tokens of a microbatch of (B, T) for `model`: GPT predicts the next token everywhere;
/// BERT has segment 0 everywhere and every seventh position masked ([MASK] = V - 1, its token
/// the target), about the default 15%.
Microbatch profile_microbatch(const ModelOptions& model, int B, int T, uint64_t seed) {
  const int V = model.vocab_size;
  Microbatch mb;
  mb.B = B;
  mb.T = T;
  const size_t n = static_cast<size_t>(B) * T;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, model.arch == Arch::bert ? V - 2 : V - 1);
  std::vector<int32_t> seq(n + static_cast<size_t>(B));
  for (auto& t : seq) t = tok(rng);
  mb.tokens.resize(n);
  mb.targets.assign(n, kIgnoreIndex);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const size_t src = static_cast<size_t>(b) * (T + 1) + t;
      const size_t k = static_cast<size_t>(b) * T + t;
      mb.tokens[k] = seq[src];
      if (model.arch == Arch::gpt) {
        mb.targets[k] = seq[src + 1];
      } else if (k % 7 == 0) {
        mb.targets[k] = mb.tokens[k];
        mb.tokens[k] = V - 1;
      }
    }
  if (model.arch == Arch::bert) mb.segments.assign(n, 0);
  return mb;
}

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

/// One model at its seeded initialisation with every buffer a layer call needs (parameters,
/// gradients, optimizer state, saved activations, inputs and output gradients per layer) and a
/// Context of `threads` threads: the layers of one microbatch, callable one at a time.
class LayerBench {
 public:
  static std::unique_ptr<LayerBench> create(Model model, const OptimizerOptions& optimizer, int B,
                                            int T, int threads, Precision precision) {
    auto b =
        std::unique_ptr<LayerBench>(new LayerBench(std::move(model), optimizer, B, T, threads));
    b->ctx_.set_precision(precision);
    return b;
  }

  int layers() const { return model_.num_layers(); }
  const Model& model() const { return model_; }

  void forward(int i) {
    const size_t k = static_cast<size_t>(i);
    const Layer& layer = model_.layer(i);
    ctx_.arena().reset();
    layer.forward(ctx_, params_[k].data(), mb_, layer.takes_input() ? acts_[k].data() : nullptr,
                  layer.is_loss() ? nullptr : acts_[k + 1].data(), saved_[k].data());
  }
  /// Layer i's backward; with `later`, its input half (the weight half recorded there).
  void backward(int i, DeferredGrads* later = nullptr) {
    const size_t k = static_cast<size_t>(i);
    const Layer& layer = model_.layer(i);
    ctx_.arena().reset();
    layer.backward(ctx_, params_[k].data(), grads_[k].data(), mb_,
                   layer.takes_input() ? acts_[k].data() : nullptr, saved_[k].data(),
                   layer.is_loss() ? nullptr : dacts_[k + 1].data(),
                   layer.takes_input() ? dacts_[k].data() : nullptr, dloss_, later);
  }
  /// Layer i's backward split: the input half (untimed), then the weight half, timed.
  double backward_weight(int i) {
    backward(i, &later_);
    const auto t0 = Clock::now();
    later_.run(ctx_);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
  /// Forward over every layer, then backward over every layer: one microbatch.
  void chain() {
    for (int i = 0; i < layers(); ++i) forward(i);
    for (int i = layers() - 1; i >= 0; --i) backward(i);
  }
  /// Σg², the optimizer update (at the next step number) and zeroing the gradient of layer i.
  void update(int i) {
    const size_t k = static_cast<size_t>(i);
    ctx_.arena().reset();
    (void)model_.grad_sumsq(ctx_, i, grads_[k].data());
    optimizer_update(ctx_, opt_, model_.layer(i), params_[k].data(), grads_[k].data(),
                     state_[k].data(), ++step_, 1.0f);
    std::fill(grads_[k].begin(), grads_[k].end(), 0.0f);
  }
  /// A new weight version of layer i: its parameters copied.
  void copy(int i) {
    const size_t k = static_cast<size_t>(i);
    std::copy(params_[k].begin(), params_[k].end(), spare_[k].begin());
  }
  /// An xpipe forward's prediction of layer i, one update ahead.
  void predict(int i) {
    const size_t k = static_cast<size_t>(i);
    predict_weights(ctx_, opt_, model_.layer(i), params_[k].data(), state_[k].data(),
                    std::max(step_, 1L), 1, spare_[k].data());
  }

 private:
  LayerBench(Model model, const OptimizerOptions& optimizer, int B, int T, int threads)
      : model_(std::move(model)),
        opt_(optimizer),
        ctx_(threads),
        mb_(profile_microbatch(model_.options(), B, T, 1234)),
        dloss_(loss_scale(count_targets(mb_), 1)) {
    const int n = model_.num_layers();
    const size_t bth = static_cast<size_t>(B) * T * model_.options().width;
    const size_t un = static_cast<size_t>(n);
    params_.resize(un);
    grads_.resize(un);
    state_.resize(un);
    saved_.resize(un);
    spare_.resize(un);
    // acts[i] is layer i's input (acts[0] unused: the embedding reads tokens); the head writes
    // none; dacts[i]: the gradient w.r.t. acts[i]
    acts_.assign(un + 1, std::vector<float>(bth));
    dacts_ = acts_;
    for (int i = 0; i < n; ++i) {
      const size_t k = static_cast<size_t>(i);
      const Layer& layer = model_.layer(i);
      params_[k].resize(layer.param_floats());
      model_.init_layer(i, params_[k].data());
      grads_[k].assign(layer.param_floats(), 0.0f);
      spare_[k].resize(layer.param_floats());
      state_[k].assign(optimizer_state_floats(opt_, layer), 0.0f);
      saved_[k].resize(layer.saved_floats(B, T));
    }
    // a small, non-zero gradient arriving at the last hidden state (unused: the head makes its
    // own)
    std::mt19937 rng(7);
    std::normal_distribution<float> g(0.0f, 1e-3f);
    for (float& x : dacts_[un]) x = g(rng);
  }

  Model model_;
  OptimizerOptions opt_;
  Context ctx_;
  Microbatch mb_;
  float dloss_;
  DeferredGrads later_;
  long step_ = 0;
  std::vector<std::vector<float>> params_, grads_, state_, saved_, spare_, acts_, dacts_;
};

Status check_profile_args(const ModelOptions& model_opts, int B, int T, int threads, int reps) {
  if (B < 1 || T < 1 || T > model_opts.context || threads < 1 || reps < 1)
    return make_error(
        "layer profile: B = {}, T = {}, threads = {}, reps = {}: expected B, threads and reps >= "
        "1 and 1 <= T <= context ({})",
        B, T, threads, reps, model_opts.context);
  return {};
}

}  // namespace

Expected<LayerProfile> profile_layers(const ModelOptions& model_opts,
                                      const OptimizerOptions& optimizer, int B, int T, int threads,
                                      int reps, Precision precision) {
  if (Status ok = check_profile_args(model_opts, B, T, threads, reps); !ok) return ok.error();
  auto model = Model::build(model_opts);
  if (!model) return model.error();
  return profile_layers(*model, optimizer, B, T, threads, reps, precision);
}

Expected<LayerProfile> profile_layers(const Model& model, const OptimizerOptions& optimizer, int B,
                                      int T, int threads, int reps, Precision precision) {
  if (Status ok = check_profile_args(model.options(), B, T, threads, reps); !ok) return ok.error();
  auto bench = LayerBench::create(model, optimizer, B, T, threads, precision);
  LayerBench& lb = *bench;
  const int n = lb.layers();

  LayerProfile p;
  p.threads = threads;
  p.tied = model.options().tied;
  p.B = B;
  p.T = T;
  p.reps = reps;
  p.layers.resize(static_cast<size_t>(n));
  // a warm-up chain: realistic inputs and gradients for every layer, memory touched
  lb.chain();
  for (int i = 0; i < n; ++i) {
    LayerTiming& c = p.layers[static_cast<size_t>(i)];
    c.name = fmt::format("{} {}", lb.model().layer(i).type(), i);
    c.forward = time_median(reps, [&] { lb.forward(i); });
  }
  for (int i = n - 1; i >= 0; --i) {
    LayerTiming& c = p.layers[static_cast<size_t>(i)];
    c.backward = time_median(reps, [&] { lb.backward(i); });
    std::vector<double> w;
    for (int r = 0; r < reps; ++r) w.push_back(lb.backward_weight(i));
    c.backward_weight = median(std::move(w));
  }
  for (int i = 0; i < n; ++i) {
    LayerTiming& c = p.layers[static_cast<size_t>(i)];
    c.update = time_median(reps, [&] { lb.update(i); });
    c.copy = time_median(reps, [&] { lb.copy(i); });
    c.predict = time_median(reps, [&] { lb.predict(i); });
  }
  return p;
}

Expected<LayerProfile> profile_layers_loaded(const ModelOptions& model,
                                             const OptimizerOptions& optimizer, int B, int T,
                                             int threads, int reps, int load_threads,
                                             Precision precision) {
  if (load_threads < 0)
    return make_error("layer profile: load_threads = {}, expected >= 0", load_threads);
  if (Status ok = check_profile_args(model, B, T, threads, reps); !ok) return ok.error();
  // every load thread builds its model and buffers before the profile starts, then runs
  // forward-backward chains of microbatches (the work of a stage) until the profile is done
  auto built = Model::build(model);
  if (!built) return built.error();
  std::vector<std::unique_ptr<LayerBench>> benches;
  for (int i = 0; i < load_threads; ++i)
    benches.push_back(LayerBench::create(*built, optimizer, B, T, 1, precision));
  std::atomic<bool> stop{false};
  std::atomic<int> started{0};
  std::vector<std::thread> load;
  for (auto& b : benches) {
    load.emplace_back([&stop, &started, lb = b.get()] {
      started.fetch_add(1);
      // one microbatch per loop: `stop` is checked often enough
      while (!stop.load()) lb->chain();
    });
  }
  while (started.load() < load_threads) std::this_thread::yield();
  auto p = profile_layers(*built, optimizer, B, T, threads, reps, precision);
  stop.store(true);
  for (std::thread& t : load) t.join();
  if (p) p->load_threads = load_threads;
  return p;
}

namespace {

constexpr std::int64_t kFloat = 4;  // bytes of an f32

}  // namespace

Expected<std::vector<LayerCosts>> layer_bytes(const ModelOptions& model_opts,
                                              const OptimizerOptions& optimizer, int B, int T,
                                              Precision precision, bool bf16_stash) {
  auto model = Model::build(model_opts);
  if (!model) return model.error();
  return layer_bytes(*model, optimizer, B, T, precision, bf16_stash);
}

Expected<std::vector<LayerCosts>> layer_bytes(const Model& m, const OptimizerOptions& optimizer,
                                              int B, int T, Precision precision, bool bf16_stash) {
  const ModelOptions& model_opts = m.options();
  if (B < 1 || T < 1 || T > model_opts.context)
    return make_error("layer bytes: B = {}, T = {}: expected B >= 1 and 1 <= T <= context ({})", B,
                      T, model_opts.context);
  const Model* model = &m;
  const std::int64_t hidden = std::int64_t{B} * T * model_opts.width * kFloat;  // (B, T, C)
  std::vector<LayerCosts> out;
  for (int i = 0; i < model->num_layers(); ++i) {
    const Layer& layer = model->layer(i);
    const auto params = static_cast<std::int64_t>(layer.param_floats()) * kFloat;
    const std::int64_t input = layer.takes_input() ? hidden : 0;
    LayerCosts c;
    c.parameter_bytes = params;
    c.gradient_bytes = params;
    // a bf16 stash keeps a stored version's product operands as their bf16 copy only
    c.version_bytes =
        params - (bf16_stash ? static_cast<std::int64_t>(model->bf16_stash_floats(i)) * kFloat : 0);
    c.weight_copy_bytes = precision == Precision::bf16 ? params / 2 : 0;  // 2 bytes a value
    c.optimizer_bytes =
        static_cast<std::int64_t>(optimizer_state_floats(optimizer, layer)) * kFloat;
    // a bf16 stage's Context keeps bf16 activations (StageWorkerOptions::bf16_activations)
    c.activation_bytes =
        static_cast<std::int64_t>(layer.saved_floats_for(B, T, precision == Precision::bf16)) *
            kFloat +
        input;
    c.recompute_activation_bytes = input;
    c.output_bytes = layer.is_loss() ? 0 : hidden;
    out.push_back(c);
  }
  return out;
}

Expected<std::vector<LayerCosts>> layer_costs(const LayerProfile& profile,
                                              const ModelOptions& model,
                                              const OptimizerOptions& optimizer,
                                              Precision precision, bool bf16_stash) {
  auto built = Model::build(model);
  if (!built) return built.error();
  return layer_costs(profile, *built, optimizer, precision, bf16_stash);
}

Expected<std::vector<LayerCosts>> layer_costs(const LayerProfile& profile, const Model& model,
                                              const OptimizerOptions& optimizer,
                                              Precision precision, bool bf16_stash) {
  auto costs = layer_bytes(model, optimizer, profile.B, profile.T, precision, bf16_stash);
  if (!costs) return costs.error();
  if (costs->size() != profile.layers.size())
    return make_error("layer costs: the profile has {} layers but the model has {}",
                      profile.layers.size(), costs->size());
  for (size_t i = 0; i < costs->size(); ++i) {
    const LayerTiming& t = profile.layers[i];
    LayerCosts& c = (*costs)[i];
    c.forward = t.forward;
    c.backward = t.backward;
    // a median of the weight half may exceed the median of the whole on a noisy machine
    c.backward_weight = std::min(t.backward_weight, t.backward);
    c.update = t.update;
  }
  return costs;
}

}  // namespace actorpipe
