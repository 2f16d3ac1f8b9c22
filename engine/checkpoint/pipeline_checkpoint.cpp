// Pipeline checkpoint: walks every stage's layers and parameter slots to name its tensors by
// global layer, so a checkpoint saved at d stages loads into d' stages tensor by tensor.
#include "engine/checkpoint/pipeline_checkpoint.hpp"

#include <charconv>
#include <cstring>
#include <memory>
#include <vector>

#include "engine/delay_correction.hpp"
#include "engine/execution/layer_optimizer.hpp"
#include "engine/execution/optimizer_shard.hpp"
#include "engine/execution/stage_worker.hpp"
#include "kernels/bf16.hpp"
#include "kernels/check.hpp"

namespace actorpipe {
namespace {

int sequence_length(const Config& c) {
  return c.pipeline.seq_len > 0 ? c.pipeline.seq_len : c.model.context;
}

// The suffixes of a slot's optimizer state, in the order of the layer's state buffer
// (optimizer_state_floats): AdamW keeps m for the whole layer, then v; SGD one momentum buffer,
// and with the dc correction its mean square after it; the secant correction's four arrays
// come last.
std::vector<std::string> state_suffixes(const OptimizerOptions& o) {
  DelayCorrectionChoice c;
  AP_CHECK(from_string(o.delay_correction, c), "optimizer.delay_correction = \"{}\"",
           o.delay_correction);
  using Compensation = DelayCorrectionChoice::Compensation;
  std::vector<std::string> s;
  if (o.kind == "sgd") {
    s = {".momentum"};
    if (c.compensation == Compensation::dc) s.push_back(".dc_mean_square");
  } else {
    s = {".adam_m", ".adam_v"};
  }
  if (c.compensation == Compensation::secant) {
    for (const char* name : {".secant_weights", ".secant_grad", ".secant_num", ".secant_den"})
      s.push_back(name);
  }
  return s;
}

// State k's suffix for a slot: a matrix that rotates keeps AdamW's m in the rotated basis (M',
// kernels/basis_rotation.hpp), saved as "<param>.adam_m_rotated", so that a checkpoint that
// holds m in the coordinates (written before M' was kept) is refused by name, not misread.
std::string state_suffix(const std::vector<std::string>& suffixes, size_t k, bool rotates) {
  return rotates && suffixes[k] == ".adam_m" ? ".adam_m_rotated" : suffixes[k];
}

// optimizer.basis_rotation's arrays of a slot that rotates (slot_rotation), after the element-wise
// state in the layer's buffer (rotation_state_offset): name suffix, shape, offset from the
// start of the layer's state and floats.
struct RotationArray {
  const char* suffix;
  std::vector<int64_t> shape;
  size_t offset;
  size_t floats;
};

std::vector<RotationArray> rotation_arrays(const OptimizerOptions& o, const Layer& layer,
                                           size_t s) {
  const RotationShape shape = slot_rotation(o, layer.slots()[s]);
  if (!shape.any()) return {};
  const size_t at = rotation_state_offset(o, layer, s);
  const size_t lf = shape.left_floats(), rf = shape.right_floats();  // rotation_state's layout
  // a whole side: its square matrix; a side in blocks: their matrices one after the other, flat
  auto dims = [](int n, int block, size_t floats) {
    return block >= n ? std::vector<int64_t>{n, n}
                      : std::vector<int64_t>{static_cast<int64_t>(floats)};
  };
  const auto ld = dims(shape.rows, shape.left_block, lf);
  const auto rd = dims(shape.cols, shape.right_block, rf);
  std::vector<RotationArray> a;
  if (shape.left) a.push_back({".rotation_left_cov", ld, at, lf});
  if (shape.right) a.push_back({".rotation_right_cov", rd, at + lf, rf});
  if (shape.left) a.push_back({".rotation_left_basis", ld, at + lf + rf, lf});
  if (shape.right) a.push_back({".rotation_right_basis", rd, at + 2 * lf + rf, rf});
  return a;
}

Status check_idle(std::span<StageWorker* const> workers,
                  std::span<OptimizerShard* const> optimizers) {
  if (workers.empty()) return make_error("checkpoint: no stage workers");
  if (optimizers.size() != workers.size()) {
    return make_error("checkpoint: {} optimizer shards for {} stage workers", optimizers.size(),
                      workers.size());
  }
  for (size_t r = 0; r < workers.size(); ++r) {
    const StageWorker* w = workers[r];
    const OptimizerShard* o = optimizers[r];
    if (o->stage() != w->stage() || o->first_layer() != w->first_layer() ||
        o->num_layers() != w->num_layers()) {
      return make_error("checkpoint: the optimizer shard of stage {} given for stage {}",
                        o->stage(), w->stage());
    }
    if (w->in_flight() > 0 || w->update_open()) {
      return make_error(
          "checkpoint: stage {} has {} microbatches in flight{} (checkpoints are taken "
          "between runs)",
          w->stage(), w->in_flight(), w->update_open() ? " and an update open" : "");
    }
  }
  return {};
}

const std::string* find_extra(const CheckpointInfo& info, const std::string& key) {
  auto it = info.extra.find(key);
  return it == info.extra.end() ? nullptr : &it->second;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Copies tensor `name` of `tensors` into dst[0, n) after checking its dtype and shape.
Status copy_tensor(const std::vector<NamedTensor>& tensors, const std::string& file,
                   const std::string& name, const std::vector<int64_t>& shape, float* dst,
                   size_t n) {
  const NamedTensor* t = find_tensor(tensors, name);
  if (!t) return make_error("checkpoint: {} has no tensor {}", file, name);
  if (t->dtype != "F32") {
    return make_error("checkpoint: {} in {} is {}, expected F32", name, file, t->dtype);
  }
  if (t->shape != shape) {
    return make_error("checkpoint: {} in {} has shape {}, the model expects {}", name, file,
                      shape_text(t->shape), shape_text(shape));
  }
  if (t->f32.size() != n) {
    return make_error("checkpoint: {} in {} holds {} values, expected {}", name, file,
                      t->f32.size(), n);
  }
  std::memcpy(dst, t->f32.data(), n * sizeof(float));
  return {};
}

// `v` (of `memory`) readable on the host: v itself in host memory, else a copy kept in `held`.
// `sizes_only`: v itself wherever it is (only the shapes will be read).
const float* on_host(BackendMemory& memory, std::span<const float> v,
                     std::shared_ptr<std::vector<std::vector<float>>>& held, bool sizes_only) {
  if (memory.host_memory() || sizes_only) return v.data();
  if (!held) held = std::make_shared<std::vector<std::vector<float>>>();
  std::vector<float>& copy = held->emplace_back(v.size());
  memory.to_host(copy.data(), v.data(), v.size());
  return copy.data();
}

// A host buffer that stands for `dst` (of `memory`) while a checkpoint's tensors are copied
// into it: dst itself in host memory, else a staging copy that store() writes to dst.
class HostTarget {
 public:
  HostTarget(BackendMemory& memory, std::span<float> dst) : memory_(memory), dst_(dst) {
    if (!memory.host_memory()) staging_.assign(dst.size(), 0.0f);
  }
  float* data() { return memory_.host_memory() ? dst_.data() : staging_.data(); }
  void store() {
    if (!memory_.host_memory()) memory_.to_backend(dst_.data(), staging_.data(), dst_.size());
  }

 private:
  BackendMemory& memory_;
  std::span<float> dst_;
  std::vector<float> staging_;
};

// 2bw: restores version updates - 1 (saved in versions.safetensors), which a continued run
// computes its first step with, and installs the owner's previous tied weights into each copy
// following its owner. A checkpoint without it (of another mode, or at update 0) restores none:
// the next run is not continued.
Status load_previous_version(const CheckpointContents& ckpt, std::span<StageWorker* const> workers,
                             long updates) {
  if (updates < 1) return {};
  const std::string suffix = fmt::format("@v{}", updates - 1);
  for (const StageWorker* w : workers) {
    if (version_policy(w->mode()) != VersionPolicy::double_buffered) return {};
    for (int i = 0; i < w->num_layers(); ++i) {
      const int layer = w->first_layer() + i;
      for (const ParamSlot& slot : w->model().layer(layer).slots()) {
        if (!find_tensor(ckpt.versions, w->model().param_name(layer, slot) + suffix)) return {};
      }
    }
  }
  for (StageWorker* w : workers) {
    for (int i = 0; i < w->num_layers(); ++i) {
      const int layer = w->first_layer() + i;
      HostTarget params(w->memory(), w->mutable_previous_params(i));
      for (const ParamSlot& slot : w->model().layer(layer).slots()) {
        if (Status ok = copy_tensor(ckpt.versions, kVersionsFile,
                                    w->model().param_name(layer, slot) + suffix, slot.shape,
                                    params.data() + slot.offset, slot.numel);
            !ok)
          return ok;
      }
      params.store();
    }
  }
  // the owner's previous value from the checkpoint, not from the owner's worker: in a job of
  // several processes the owner's stage may run in another one
  for (StageWorker* copy : workers) {
    for (size_t k = 0; k < copy->num_tied(); ++k) {
      if (copy->tied_role(k) != TiedRole::copy || tied_sync(copy->mode()) != TiedSync::follow_owner)
        continue;
      const TiedParam& tp = copy->model().tied()[k];
      const ParamSlot* slot = &copy->model().tied_slots(tp).owner;
      std::vector<float> owner(slot->numel);
      if (Status ok = copy_tensor(ckpt.versions, kVersionsFile,
                                  copy->model().param_name(tp.owner_layer, *slot) + suffix,
                                  slot->shape, owner.data(), slot->numel);
          !ok)
        return ok;
      copy->install_tied_weights(k, static_cast<int>(updates) - 1, owner);
    }
  }
  return {};
}

}  // namespace

CheckpointInfo pipeline_checkpoint_info(const Config& config, const RunPosition& position,
                                        long updates) {
  CheckpointInfo info;
  info.final = position.final;
  info.step = position.step;
  info.data_position = position.data_position;
  info.rng_state = {config.train.seed, config.data.seed};
  info.mode = config.pipeline.mode;
  info.stages = config.pipeline.stages;
  info.partition = config.pipeline.partition.counts;  // "auto" is resolved to counts by then
  info.model = config.model;
  info.optimizer = config.optimizer;
  info.extra["updates"] = std::to_string(updates);
  info.extra["data.kind"] = config.data.kind;
  info.extra["data.seed"] = std::to_string(config.data.seed);
  info.extra["data.synthetic_seed"] = std::to_string(config.data.synthetic_seed);
  info.extra["pipeline.microbatch_size"] = std::to_string(config.pipeline.microbatch_size);
  info.extra["pipeline.seq_len"] = std::to_string(sequence_length(config));
  info.extra["pipeline.microbatches"] = std::to_string(config.pipeline.microbatches);
  return info;
}

namespace {

// pipeline_checkpoint_refs; with `sizes_only` the refs' shapes are right but their data is not
// readable (nothing is copied out of a stage's memory or widened from a bf16 stash)
Expected<CheckpointRefs> checkpoint_refs(std::span<StageWorker* const> workers,
                                         std::span<OptimizerShard* const> optimizers,
                                         bool sizes_only) {
  if (Status ok = check_idle(workers, optimizers); !ok) return ok.error();
  const long updates = workers[0]->updates();
  for (const StageWorker* w : workers) {
    if (w->updates() != updates) {
      return make_error("checkpoint: stage {} has applied {} updates but stage 0 {}", w->stage(),
                        w->updates(), updates);
    }
  }
  const auto suffixes = state_suffixes(optimizers[0]->options());
  CheckpointRefs refs;
  for (size_t r = 0; r < workers.size(); ++r) {
    const StageWorker* w = workers[r];
    const OptimizerShard* o = optimizers[r];
    const Model& model = w->model();
    const WeightStore& store = w->store();
    for (int i = 0; i < w->num_layers(); ++i) {
      const int layer = w->first_layer() + i;
      const Layer& l = model.layer(layer);
      const float* params = on_host(w->memory(), w->params(i), refs.held, sizes_only);
      const std::span<const float> state_span = o->state(i);
      AP_CHECK(state_span.size() == optimizer_state_floats(o->options(), l),
               "layer {}: {} optimizer state floats for {} parameters", layer, state_span.size(),
               l.param_floats());
      const float* state = on_host(o->memory(), state_span, refs.held, sizes_only);
      // the older versions' weights, each read once
      std::vector<const float*> older;
      for (int v : store.versions()) {
        older.push_back(v == store.latest()
                            ? nullptr
                            : on_host(w->memory(), store.params(v, i), refs.held, sizes_only));
      }
      for (size_t s = 0; s < l.slots().size(); ++s) {
        const ParamSlot& slot = l.slots()[s];
        const std::string name = model.param_name(layer, slot);
        refs.model.push_back({name, slot.shape, params + slot.offset});
        const bool rotates = slot_rotation(o->options(), slot).any();
        for (size_t k = 0; k < suffixes.size(); ++k) {
          refs.optimizer.push_back({name + state_suffix(suffixes, k, rotates), slot.shape,
                                    state + k * l.param_floats() + slot.offset});
        }
        for (const RotationArray& a : rotation_arrays(o->options(), l, s))
          refs.optimizer.push_back({name + a.suffix, a.shape, state + a.offset});
        size_t at = 0;
        for (int v : store.versions()) {
          const float* version = older[at++];
          if (v == store.latest()) continue;
          const float* data = version + slot.offset;
          const bf16* kept =
              sizes_only ? nullptr : store.stashed_bf16(v, i, slot.offset, slot.numel);
          if (kept != nullptr) {
            // a bf16 stash (on the host only): the version's weights are their bf16 rounding
            if (!refs.held) refs.held = std::make_shared<std::vector<std::vector<float>>>();
            std::vector<float>& f32 = refs.held->emplace_back(slot.numel);
            convert_to_f32(kept, f32.data(), static_cast<int64_t>(slot.numel));
            data = f32.data();
          }
          refs.versions.push_back({fmt::format("{}@v{}", name, v), slot.shape, data});
        }
      }
    }
  }
  return refs;
}

}  // namespace

Expected<CheckpointRefs> pipeline_checkpoint_refs(std::span<StageWorker* const> workers,
                                                  std::span<OptimizerShard* const> optimizers) {
  return checkpoint_refs(workers, optimizers, false);
}

Expected<uint64_t> pipeline_checkpoint_bytes(std::span<StageWorker* const> workers,
                                             std::span<OptimizerShard* const> optimizers) {
  auto refs = checkpoint_refs(workers, optimizers, true);
  if (!refs) return refs.error();
  return tensor_bytes(*refs);
}

Expected<std::string> save_pipeline_checkpoint(const std::string& dir, const Config& config,
                                               const RunPosition& position,
                                               std::span<StageWorker* const> workers,
                                               std::span<OptimizerShard* const> optimizers) {
  auto refs = pipeline_checkpoint_refs(workers, optimizers);
  if (!refs) return refs.error();
  return save_checkpoint(dir, pipeline_checkpoint_info(config, position, workers[0]->updates()),
                         *refs);
}

Status check_resume(const CheckpointInfo& info, const Config& config) {
  std::string msg;
  if (Status ok = check_compatible(info, config.model); !ok) {
    // its lines after the heading: one per model key
    const std::string& m = ok.error().message;
    const size_t nl = m.find('\n');
    msg = nl == std::string::npos ? m : m.substr(nl + 1);
  }
  auto mismatch = [&](const std::string& key, const std::string& saved, const std::string& now) {
    if (saved == now) return;
    msg += fmt::format("{}{}: the checkpoint has {}, the config has {}", msg.empty() ? "" : "\n",
                       key, saved, now);
  };
  mismatch("optimizer.kind", info.optimizer.kind, config.optimizer.kind);
  const std::pair<const char*, std::string> keys[] = {
      {"data.kind", config.data.kind},
      {"pipeline.microbatch_size", std::to_string(config.pipeline.microbatch_size)},
      {"pipeline.seq_len", std::to_string(sequence_length(config))},
  };
  for (const auto& [key, now] : keys) {
    const std::string* saved = find_extra(info, key);
    if (!saved) {
      msg += fmt::format("{}the manifest's \"extra\" has no {}", msg.empty() ? "" : "\n", key);
    } else {
      mismatch(key, *saved, now);
    }
  }
  if (!find_extra(info, "updates")) {
    msg += fmt::format("{}the manifest's \"extra\" has no updates", msg.empty() ? "" : "\n");
  }
  if (msg.empty()) return {};
  return Error{"the checkpoint does not match this run:\n" + msg};
}

Status load_pipeline_checkpoint(const CheckpointContents& ckpt,
                                std::span<StageWorker* const> workers,
                                std::span<OptimizerShard* const> optimizers) {
  if (Status ok = check_idle(workers, optimizers); !ok) return ok.error();
  const OptimizerOptions& optimizer = optimizers[0]->options();
  long updates = 0;
  {
    const std::string* text = find_extra(ckpt.info, "updates");
    if (!text) return make_error("checkpoint {}: the manifest has no updates count", ckpt.path);
    const char* end = text->data() + text->size();
    auto [p, ec] = std::from_chars(text->data(), end, updates);
    if (ec != std::errc() || p != end || updates < 0) {
      return make_error("checkpoint {}: updates = \"{}\", expected an integer >= 0", ckpt.path,
                        *text);
    }
  }
  if (ckpt.info.optimizer.kind != optimizer.kind) {
    return make_error("checkpoint {}: optimizer.kind is {}, the stages use {}", ckpt.path,
                      ckpt.info.optimizer.kind, optimizer.kind);
  }
  // AdamW's v is in the rotated basis with basis rotation, in the coordinates without it; and
  // which sides rotate decides the saved matrices' shapes
  const OptimizerOptions& saved = ckpt.info.optimizer;
  if (saved.basis_rotation != optimizer.basis_rotation ||
      (optimizer.basis_rotation && (saved.rotation_max_dim != optimizer.rotation_max_dim ||
                                    saved.rotation_block != optimizer.rotation_block))) {
    return make_error(
        "checkpoint {}: written with optimizer.basis_rotation = {} (rotation_max_dim {}, "
        "rotation_block {}), the stages use basis_rotation = {} (rotation_max_dim {}, "
        "rotation_block {}): AdamW's second moment is kept in another basis",
        ckpt.path, saved.basis_rotation, saved.rotation_max_dim, saved.rotation_block,
        optimizer.basis_rotation, optimizer.rotation_max_dim, optimizer.rotation_block);
  }
  const auto suffixes = state_suffixes(optimizer);
  for (size_t r = 0; r < workers.size(); ++r) {
    StageWorker* w = workers[r];
    OptimizerShard* o = optimizers[r];
    const Model& model = w->model();
    if (Status ok = check_compatible(ckpt.info, model.options()); !ok) return ok.error();
    for (int i = 0; i < w->num_layers(); ++i) {
      const int layer = w->first_layer() + i;
      const Layer& l = model.layer(layer);
      HostTarget params(w->memory(), w->mutable_params(i));
      const std::span<float> state_span = o->state(i);
      AP_CHECK(state_span.size() == optimizer_state_floats(optimizer, l),
               "layer {}: {} optimizer state floats for {} parameters", layer, state_span.size(),
               l.param_floats());
      HostTarget state(o->memory(), state_span);
      for (size_t s = 0; s < l.slots().size(); ++s) {
        const ParamSlot& slot = l.slots()[s];
        const std::string name = model.param_name(layer, slot);
        if (Status ok = copy_tensor(ckpt.model, kModelFile, name, slot.shape,
                                    params.data() + slot.offset, slot.numel);
            !ok)
          return ok;
        const bool rotates = slot_rotation(optimizer, slot).any();
        for (size_t k = 0; k < suffixes.size(); ++k) {
          if (Status ok = copy_tensor(
                  ckpt.optimizer, kOptimizerFile, name + state_suffix(suffixes, k, rotates),
                  slot.shape, state.data() + k * l.param_floats() + slot.offset, slot.numel);
              !ok)
            return ok;
        }
        for (const RotationArray& a : rotation_arrays(optimizer, l, s)) {
          if (Status ok = copy_tensor(ckpt.optimizer, kOptimizerFile, name + a.suffix, a.shape,
                                      state.data() + a.offset, a.floats);
              !ok)
            return ok;
        }
      }
      params.store();
      state.store();
    }
    w->set_updates(updates);
  }
  return load_previous_version(ckpt, workers, updates);
}

}  // namespace actorpipe
