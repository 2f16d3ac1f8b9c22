// Sampler: the whole model's forward over a context of up to model.context tokens (B = 1, every
// target ignored), the loss layer's logits at the last position, and the token picked from them.
#include "engine/sampling/sampler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/checkpoint/checkpoint.hpp"
#include "kernels/check.hpp"
#include "kernels/compute_backend.hpp"
#include "kernels/crossentropy.hpp"

namespace actorpipe {

Status check_sample_options(const SampleOptions& o) {
  if (o.tokens < 0) return make_error("sample tokens = {}: must be >= 0", o.tokens);
  if (!(o.temperature >= 0.0) || !std::isfinite(o.temperature))
    return make_error("sample temperature = {}: must be >= 0 (0 = greedy)", o.temperature);
  if (o.top_k < 0) return make_error("sample top-k = {}: must be >= 0 (0 = all)", o.top_k);
  return {};
}

int32_t pick_token(std::span<const float> logits, double temperature, int top_k, SplitMix64& rng) {
  const int V = static_cast<int>(logits.size());
  AP_CHECK(V > 0, "no logits");
  if (temperature == 0.0) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  const int k = top_k > 0 ? std::min(top_k, V) : V;
  // the k largest, ties by id: a total order, so the draw does not depend on the sort
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  const double top = logits[ids[0]];
  std::vector<double> w(static_cast<size_t>(k));
  double sum = 0.0;
  for (int i = 0; i < k; ++i) {
    w[static_cast<size_t>(i)] = std::exp((logits[ids[static_cast<size_t>(i)]] - top) / temperature);
    sum += w[static_cast<size_t>(i)];
  }
  const double u = static_cast<double>(rng.next() >> 11) * 0x1.0p-53 * sum;
  double acc = 0.0;
  for (int i = 0; i < k; ++i) {
    acc += w[static_cast<size_t>(i)];
    if (u < acc) return ids[static_cast<size_t>(i)];
  }
  return ids[static_cast<size_t>(k - 1)];
}

Sampler::Sampler(Model model, const std::vector<std::vector<float>>& params, int threads,
                 ComputeBackend* backend)
    : model_(std::move(model)), ctx_(threads) {
  if (backend != nullptr) ctx_.set_backend(backend);
  BackendMemory& memory = backend != nullptr ? *backend : host_backend_memory();
  for (const std::vector<float>& p : params) {
    params_.emplace_back(memory, p.size());
    memory.to_backend(params_.back().data(), p.data(), p.size());
  }
  const ModelOptions& o = model_.options();
  const size_t hidden = static_cast<size_t>(o.context) * o.width;
  hidden_a_ = BackendBuffer(memory, hidden);
  hidden_b_ = BackendBuffer(memory, hidden);
  size_t saved = 1;
  for (int i = 0; i < model_.num_layers(); ++i)
    saved = std::max(saved, model_.layer(i).saved_floats(1, o.context));
  saved_ = BackendBuffer(memory, saved);
  logits_.resize(static_cast<size_t>(o.vocab_size));
  device_ = ctx_.backend().name();
}

Expected<std::unique_ptr<Sampler>> Sampler::create(Model model,
                                                   std::vector<std::vector<float>> params,
                                                   int threads, ComputeBackend* backend) {
  if (threads < 1) return make_error("sampler: threads = {}, expected >= 1", threads);
  if (params.size() != static_cast<size_t>(model.num_layers()))
    return make_error("sampler: {} parameter buffers for {} layers", params.size(),
                      model.num_layers());
  for (int i = 0; i < model.num_layers(); ++i) {
    if (params[static_cast<size_t>(i)].size() != model.layer(i).param_floats()) {
      return make_error("sampler: layer {} ({}) has {} parameters, the buffer {}", i,
                        model.layer(i).type(), model.layer(i).param_floats(),
                        params[static_cast<size_t>(i)].size());
    }
  }
  // a causal model's loss layer keeps the logits of every position
  Microbatch probe;
  probe.B = 1;
  probe.T = std::min(2, model.options().context);
  probe.tokens.assign(static_cast<size_t>(probe.T), 0);
  probe.targets.assign(static_cast<size_t>(probe.T), kIgnoreIndex);
  std::vector<int> all(static_cast<size_t>(probe.T));
  std::iota(all.begin(), all.end(), 0);
  const int last = model.num_layers() - 1;
  const Layer& head = model.layer(last);
  std::vector<float> saved(std::max<size_t>(1, head.saved_floats(1, probe.T)));
  if (head.logit_rows(probe) != all || head.logits(saved.data(), 1, probe.T) == nullptr) {
    return make_error(
        "sampling needs a causal model whose loss layer keeps the logits of every position; "
        "layer {} ({}) does not (BERT's head computes the masked positions only)",
        last, head.type());
  }
  return std::unique_ptr<Sampler>(new Sampler(std::move(model), params, threads, backend));
}

Expected<std::unique_ptr<Sampler>> Sampler::from_checkpoint(const ModelOptions& model_options,
                                                            const std::string& checkpoint,
                                                            ComputeBackend* backend) {
  auto contents = load_checkpoint(checkpoint);
  if (!contents) return contents.error();
  if (Status ok = check_compatible(contents->info, model_options); !ok)
    return make_error("{}: {}", contents->path, ok.error().message);
  auto model = Model::build(model_options);
  if (!model) return model.error();
  std::vector<std::vector<float>> params;
  for (int i = 0; i < model->num_layers(); ++i) {
    const Layer& layer = model->layer(i);
    std::vector<float> p(layer.param_floats());
    for (const ParamSlot& s : layer.slots()) {
      const std::string name = model->param_name(i, s);
      auto it = std::find_if(contents->model.begin(), contents->model.end(),
                             [&](const NamedTensor& t) { return t.name == name; });
      if (it == contents->model.end())
        return make_error("{}: no tensor {} in the checkpoint", contents->path, name);
      if (it->shape != s.shape || it->f32.size() != s.numel)
        return make_error("{}: tensor {} has shape ({}), the model's is ({})", contents->path, name,
                          fmt::join(it->shape, ", "), fmt::join(s.shape, ", "));
      std::copy(it->f32.begin(), it->f32.end(), p.begin() + static_cast<std::ptrdiff_t>(s.offset));
    }
    params.push_back(std::move(p));
  }
  auto sampler = create(std::move(*model), std::move(params), 1, backend);
  if (!sampler) return sampler.error();
  (*sampler)->source_ = contents->path;
  return sampler;
}

std::span<const float> Sampler::next_logits(std::span<const int32_t> context) {
  AP_CHECK(!context.empty(), "sampling needs a non-empty context");
  const ModelOptions& o = model_.options();
  const size_t T = std::min(context.size(), static_cast<size_t>(o.context));
  Microbatch mb;
  mb.B = 1;
  mb.T = static_cast<int>(T);
  mb.tokens.assign(context.end() - static_cast<std::ptrdiff_t>(T), context.end());
  mb.targets.assign(T, kIgnoreIndex);
  const float* x = nullptr;
  for (int i = 0; i < model_.num_layers(); ++i) {
    const Layer& layer = model_.layer(i);
    float* y = layer.is_loss() ? nullptr : (i % 2 == 0 ? hidden_a_.data() : hidden_b_.data());
    ctx_.arena().reset();
    if (!ctx_.host_backend()) ctx_.backend().reset_scratch();
    layer.forward(ctx_, params_[static_cast<size_t>(i)].data(), mb, x, y, saved_.data());
    x = y;
  }
  const Layer& head = model_.layer(model_.num_layers() - 1);
  const float* logits = head.logits(saved_.data(), 1, mb.T);
  const size_t V = static_cast<size_t>(o.vocab_size);
  ctx_.backend().to_host(logits_.data(), logits + (T - 1) * V, V);
  return logits_;
}

Expected<std::vector<int32_t>> Sampler::generate(std::span<const int32_t> prompt,
                                                 const SampleOptions& options) {
  if (Status ok = check_sample_options(options); !ok) return ok.error();
  if (prompt.empty()) return make_error("sampling needs a prompt of at least one token");
  const int V = model_.options().vocab_size;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= V)
      return make_error("prompt token {} = {}: outside [0, vocab_size = {})", i, prompt[i], V);
  }
  std::vector<int32_t> out(prompt.begin(), prompt.end());
  SplitMix64 rng(options.seed);
  for (int n = 0; n < options.tokens; ++n) {
    const auto logits = next_logits(out);
    out.push_back(pick_token(logits, options.temperature, options.top_k, rng));
  }
  return out;
}

}  // namespace actorpipe
