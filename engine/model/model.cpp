// Model: the ordered list of layers of a GPT or BERT (embedding, L blocks, head) plus the
// spec that ties parameters across layers. Partition cuts go between any two layers.
#include "engine/model/model.hpp"

#include <fmt/format.h>

#include "engine/model/internal/transformer_layers.hpp"
#include "kernels/check.hpp"
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

  Model m;
  m.opts_ = o;
  const bool gpt = o.arch == Arch::gpt;
  m.layers_.push_back(gpt ? internal::make_gpt_embedding(o, 0)
                          : internal::make_bert_embedding(o, 0));
  for (int l = 1; l <= o.depth; ++l) m.layers_.push_back(internal::make_block(o, l, gpt));
  const int head = o.depth + 1;
  m.layers_.push_back(gpt ? internal::make_gpt_head(o, head) : internal::make_bert_head(o, head));
  if (o.tied)
    m.tied_.push_back(TiedParam{0, "wte", head, gpt ? "lm_head.weight" : "mlm.decoder.weight"});
  for (const TiedParam& t : m.tied_) {
    const ParamSlot* a = m.layer(t.owner_layer).find_slot(t.owner_slot);
    const ParamSlot* b = m.layer(t.copy_layer).find_slot(t.copy_slot);
    AP_CHECK(a && b && a->shape == b->shape, "tied slots {} / {}", t.owner_slot, t.copy_slot);
  }
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

void Model::init_layer(int i, float* params) const {
  layer(i).init(params, opts_.init_seed);
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
    sum += actorpipe::grad_sumsq(ctx, grads + begin, end - begin);
  }
  return sum;
}

void reduce_tied_grads(float* owner, float* copy, size_t n) {
  for (size_t k = 0; k < n; ++k) {
    const float s = owner[k] + copy[k];
    owner[k] = s;
    copy[k] = s;
  }
}

}  // namespace actorpipe
