// Layer: one partitionable unit of a model (embedding, transformer block, head + loss) as a
// const forward/backward pair over caller-owned parameter, gradient and activation buffers.
#include "engine/model/layer.hpp"

#include <algorithm>

#include "engine/rng.hpp"
#include "kernels/check.hpp"
#include "kernels/crossentropy.hpp"

namespace actorpipe {

float loss_scale(int64_t count, int microbatches) {
  AP_CHECK(microbatches > 0, "microbatches = {}", microbatches);
  if (count <= 0) return 0.0f;
  return static_cast<float>(1.0 / (static_cast<double>(microbatches) * static_cast<double>(count)));
}

int64_t count_targets(const Microbatch& mb) {
  return count_targets(mb.targets.data(), static_cast<int>(mb.targets.size()));
}

std::string_view to_string(LayerRole role) {
  switch (role) {
    case LayerRole::input:
      return "input";
    case LayerRole::hidden:
      return "hidden";
    case LayerRole::loss:
      return "loss";
  }
  return "unknown";
}

Layer::Layer(LayerRole role, std::string type, int index, std::vector<ParamSlot> slots)
    : role_(role), type_(std::move(type)), index_(index), slots_(std::move(slots)) {
  AP_CHECK(!type_.empty(), "layer {}: empty type name", index_);
  size_t offset = 0;
  for (size_t s = 0; s < slots_.size(); ++s) {
    ParamSlot& slot = slots_[s];
    AP_CHECK(!slot.name.empty(), "{} layer {}: slot {} has no name", type_, index_, s);
    for (size_t t = 0; t < s; ++t)
      AP_CHECK(slots_[t].name != slot.name, "{} layer {}: two slots named {}", type_, index_,
               slot.name);
    slot.offset = offset;
    slot.numel = 1;
    for (int64_t d : slot.shape) {
      AP_CHECK(d > 0, "{} layer {}: slot {} has dimension {}", type_, index_, slot.name, d);
      slot.numel *= static_cast<size_t>(d);
    }
    offset += slot.numel;
    if (slot.stream_layer < 0) {
      slot.stream_layer = index_;
      slot.stream_slot = static_cast<int>(s);
    }
  }
  param_floats_ = offset;
}

const ParamSlot* Layer::find_slot(std::string_view name) const {
  for (const ParamSlot& s : slots_)
    if (s.name == name) return &s;
  return nullptr;
}

size_t Layer::product_operand_floats() const {
  size_t n = 0;
  for (const ParamSlot& s : slots_)
    if (s.product_operand) n += s.numel;
  return n;
}

void init_slot(const ParamSlot& s, float* p, uint64_t init_seed) {
  switch (s.init) {
    case InitKind::zeros:
      std::fill(p, p + s.numel, 0.0f);
      break;
    case InitKind::ones:
      std::fill(p, p + s.numel, 1.0f);
      break;
    case InitKind::normal: {
      NormalRng rng(derive_seed(init_seed, static_cast<uint64_t>(s.stream_layer),
                                static_cast<uint64_t>(s.stream_slot)));
      const double std_dev = s.init_std;
      for (size_t k = 0; k < s.numel; ++k) p[k] = static_cast<float>(std_dev * rng.next());
      break;
    }
  }
}

void Layer::init(float* params, uint64_t init_seed) const {
  for (const ParamSlot& s : slots_) init_slot(s, params + s.offset, init_seed);
}

const float* Layer::logits(const float* /*saved*/, int /*B*/, int /*T*/) const {
  return nullptr;
}

std::vector<int> Layer::logit_rows(const Microbatch& mb) const {
  if (!is_loss()) return {};
  std::vector<int> rows(mb.targets.size());
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int>(i);
  return rows;
}

}  // namespace actorpipe
