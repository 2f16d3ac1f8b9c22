// Model: an ordered list of layers plus the declared shared parameters; the built-in GPT and
// BERT are built from the same list a user's own layers go through.
#include "engine/model/model.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <tuple>

#include "engine/model/internal/transformer_layers.hpp"
#include "kernels/check.hpp"
#include "kernels/compute_backend.hpp"
#include "kernels/optimizer.hpp"

namespace actorpipe {

Expected<Model> Model::build(const ModelOptions& o) {
  auto positive = [](const char* key, int v) -> Status {
    if (v >= 1) return {};
    return make_error("model.{} = {}: must be a positive integer", key, v);
  };
  for (auto [key, v] : {std::pair<const char*, int>{"vocab_size", o.vocab_size},
                        {"context", o.context},
                        {"width", o.width},
                        {"depth", o.depth},
                        {"heads", o.heads}}) {
    if (Status st = positive(key, v); !st) return st.error();
  }
  if (o.vocab_size < 2)
    return make_error("model.vocab_size = {}: must be at least 2", o.vocab_size);
  if (o.width % o.heads != 0)
    return make_error("model.heads = {}: must divide model.width = {}", o.heads, o.width);
  if (o.arch == Arch::bert && o.segments < 1)
    return make_error("model.segments = {}: BERT needs at least 1 segment type", o.segments);

  const bool gpt = o.arch == Arch::gpt;
  std::vector<std::shared_ptr<const Layer>> layers;
  layers.push_back(gpt ? internal::make_gpt_embedding(o, 0) : internal::make_bert_embedding(o, 0));
  for (int l = 1; l <= o.depth; ++l) layers.push_back(internal::make_block(o, l, gpt));
  const int head = o.depth + 1;
  layers.push_back(gpt ? internal::make_gpt_head(o, head) : internal::make_bert_head(o, head));
  std::vector<TiedParam> tied;
  if (o.tied)
    tied.push_back(TiedParam{0, "wte", head, gpt ? "lm_head.weight" : "mlm.decoder.weight"});
  return from_layers(o, std::move(layers), std::move(tied));
}

Expected<Model> Model::from_layers(const ModelOptions& shape,
                                   std::vector<std::shared_ptr<const Layer>> layers,
                                   std::vector<TiedParam> tied) {
  for (auto [key, v] : {std::pair<const char*, int>{"vocab_size", shape.vocab_size},
                        {"context", shape.context},
                        {"width", shape.width}}) {
    if (v < 1) return make_error("model.{} = {}: must be a positive integer", key, v);
  }
  const int L = static_cast<int>(layers.size());
  if (L < 3) {
    return make_error(
        "a model of {} layers: needs an input layer, at least one hidden layer and a loss layer",
        L);
  }
  for (int i = 0; i < L; ++i) {
    const auto& layer = layers[static_cast<size_t>(i)];
    if (!layer) return make_error("layer {}: null", i);
    if (layer->index() != i) {
      return make_error("layer {} ({}): was made with index {}; a layer's index is its position", i,
                        layer->type(), layer->index());
    }
    const LayerRole want =
        i == 0 ? LayerRole::input : (i == L - 1 ? LayerRole::loss : LayerRole::hidden);
    if (layer->role() != want) {
      return make_error("layer {} ({}): role {}, but layer {} of {} must be the {} layer", i,
                        layer->type(), to_string(layer->role()), i, L, to_string(want));
    }
  }
  auto slot_of = [&](int l, const std::string& name,
                     const char* side) -> Expected<const ParamSlot*> {
    if (l < 0 || l >= L) return make_error("tied {} layer {}: outside [0, {})", side, l, L);
    const ParamSlot* s = layers[static_cast<size_t>(l)]->find_slot(name);
    if (!s) {
      return make_error("tied {} layers.{}.{}: layer {} ({}) has no slot \"{}\"", side, l, name, l,
                        layers[static_cast<size_t>(l)]->type(), name);
    }
    return s;
  };
  for (size_t k = 0; k < tied.size(); ++k) {
    const TiedParam& t = tied[k];
    auto a = slot_of(t.owner_layer, t.owner_slot, "owner");
    if (!a) return a.error();
    auto b = slot_of(t.copy_layer, t.copy_slot, "copy");
    if (!b) return b.error();
    const std::string names = fmt::format("layers.{}.{} / layers.{}.{}", t.owner_layer,
                                          t.owner_slot, t.copy_layer, t.copy_slot);
    if (t.owner_layer >= t.copy_layer) {
      return make_error(
          "tied {}: the owner must be in an earlier layer than its copy (the copy's stage uses the "
          "owner's values of the same microbatch); declare it the other way round",
          names);
    }
    if ((*a)->shape != (*b)->shape) {
      return make_error("tied {}: shapes ({}) and ({}) differ", names, fmt::join((*a)->shape, ", "),
                        fmt::join((*b)->shape, ", "));
    }
    for (size_t j = 0; j < k; ++j) {
      const TiedParam& u = tied[j];
      auto same = [](int l1, const std::string& s1, int l2, const std::string& s2) {
        return l1 == l2 && s1 == s2;
      };
      if (same(u.copy_layer, u.copy_slot, t.copy_layer, t.copy_slot) ||
          same(u.copy_layer, u.copy_slot, t.owner_layer, t.owner_slot) ||
          same(u.owner_layer, u.owner_slot, t.copy_layer, t.copy_slot)) {
        return make_error(
            "tied {}: a parameter is tied once (it is an owner or a copy of one "
            "other tie already)",
            names);
      }
    }
  }
  Model m;
  m.opts_ = shape;
  m.opts_.depth = L - 2;
  m.opts_.tied = !tied.empty();
  m.layers_ = std::move(layers);
  m.tied_ = std::move(tied);
  return m;
}

const Layer& Model::layer(int i) const {
  return *layer_ptr(i);
}

std::shared_ptr<const Layer> Model::layer_ptr(int i) const {
  AP_CHECK(i >= 0 && i < num_layers(), "layer index {} outside [0, {})", i, num_layers());
  return layers_[static_cast<size_t>(i)];
}

bool Model::is_tied_copy(int layer_index, size_t slot_index) const {
  for (const TiedParam& t : tied_) {
    if (t.copy_layer != layer_index) continue;
    const auto& slots = layer(layer_index).slots();
    if (slot_index < slots.size() && slots[slot_index].name == t.copy_slot) return true;
  }
  return false;
}

bool Model::is_tied(int layer_index, size_t slot_index) const {
  const auto& slots = layer(layer_index).slots();
  if (slot_index >= slots.size()) return false;
  const std::string& name = slots[slot_index].name;
  for (const TiedParam& t : tied_) {
    if ((t.owner_layer == layer_index && t.owner_slot == name) ||
        (t.copy_layer == layer_index && t.copy_slot == name))
      return true;
  }
  return false;
}

size_t Model::bf16_stash_floats(int layer_index) const {
  const auto& slots = layer(layer_index).slots();
  size_t n = 0;
  for (size_t s = 0; s < slots.size(); ++s)
    if (slots[s].product_operand && !is_tied(layer_index, s)) n += slots[s].numel;
  return n;
}

std::string Model::param_name(int layer_index, const ParamSlot& slot) const {
  return fmt::format("layers.{}.{}", layer_index, slot.name);
}

size_t Model::total_param_floats() const {
  size_t n = 0;
  for (const auto& l : layers_) n += l->param_floats();
  return n;
}

size_t Model::unique_parameters() const {
  size_t n = 0;
  for (int i = 0; i < num_layers(); ++i) {
    const auto& slots = layer(i).slots();
    for (size_t s = 0; s < slots.size(); ++s)
      if (!is_tied_copy(i, s)) n += slots[s].numel;
  }
  return n;
}

Model::TiedSlots Model::tied_slots(const TiedParam& t) const {
  const ParamSlot* owner = layer(t.owner_layer).find_slot(t.owner_slot);
  const ParamSlot* copy = layer(t.copy_layer).find_slot(t.copy_slot);
  AP_CHECK(owner != nullptr && copy != nullptr && owner->numel == copy->numel,
           "tied parameter {}.{} / {}.{}: no such slots of equal size in this model", t.owner_layer,
           t.owner_slot, t.copy_layer, t.copy_slot);
  return {*owner, *copy};
}

void Model::init_layer(int i, float* params) const {
  layer(i).init(params, opts_.init_seed);
  for (const TiedParam& t : tied_) {
    if (t.copy_layer != i) continue;
    const auto [owner, copy] = tied_slots(t);
    init_slot(owner, params + copy.offset, opts_.init_seed);
  }
}

double Model::grad_sumsq(Context& ctx, int layer_index, const float* grads) const {
  const auto& slots = layer(layer_index).slots();
  double sum = 0.0;
  size_t s = 0;
  while (s < slots.size()) {
    if (is_tied_copy(layer_index, s)) {
      ++s;
      continue;
    }
    // one maximal run of counted slots, contiguous in the buffer
    const size_t begin = slots[s].offset;
    size_t end = begin;
    while (s < slots.size() && !is_tied_copy(layer_index, s)) {
      end = slots[s].offset + slots[s].numel;
      ++s;
    }
    // the Context's backend: on the host the CPU kernel, whose order does not depend on threads
    sum += ctx.backend().grad_sumsq(grads + begin, end - begin);
  }
  return sum;
}

Expected<ModelOptions> options_for_model(const ModelOptions& declared, const Model& model) {
  const ModelOptions& m = model.options();
  for (auto [key, a, b] :
       {std::tuple<const char*, int64_t, int64_t>{"vocab_size", declared.vocab_size, m.vocab_size},
        {"context", declared.context, m.context},
        {"width", declared.width, m.width},
        {"depth", declared.depth, m.depth}}) {
    if (a != b)
      return make_error("model.{} = {}, but the model given has {}{}", key, a, b,
                        std::string_view(key) == "depth" ? " hidden layers" : "");
  }
  if (declared.init_seed != m.init_seed) {
    return make_error("model.init_seed = {}, but the model given was built with {}",
                      declared.init_seed, m.init_seed);
  }
  ModelOptions out = declared;
  out.tied = m.tied;
  return out;
}

void reduce_tied_grads(float* __restrict owner, float* __restrict copy, size_t n) {
  for (size_t k = 0; k < n; ++k) {
    const float s = owner[k] + copy[k];
    owner[k] = s;
    copy[k] = s;
  }
}

void reduce_tied_grads(Context& ctx, float* owner, float* copy, size_t n) {
  ctx.parallel_for_aligned(static_cast<int64_t>(n), 16, [&](int, int64_t b, int64_t e) {
    reduce_tied_grads(owner + b, copy + b, static_cast<size_t>(e - b));
  });
}

}  // namespace actorpipe
