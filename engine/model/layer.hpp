// Layer: one partitionable unit of a model (an input layer, a hidden layer, the loss layer) as a
// const forward/backward pair over caller-owned parameter, gradient and activation buffers. The
// built-in GPT and BERT layers implement it, and so does a user's own layer (docs/api.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/batch.hpp"
#include "engine/model/deferred_grads.hpp"
#include "kernels/context.hpp"

namespace actorpipe {

/// How a parameter slot is initialised (GPT-2 scheme).
enum class InitKind : uint8_t { zeros, ones, normal };

/// One named parameter tensor inside a layer's contiguous buffer.
struct ParamSlot {
  std::string name;            // "attn.qkv.weight"; checkpoint name is layers.<i>.<name>
  std::vector<int64_t> shape;  // row-major, e.g. (3C, C)
  size_t offset = 0;           // floats from the start of the layer's buffer
  size_t numel = 0;            // product of shape
  InitKind init = InitKind::zeros;
  float init_std = 0.0f;  // InitKind::normal: N(0, init_std²)
  bool decay = false;     // weight decay applies (matrices and embeddings; not biases, norms)
  // Every read of the slot in bf16 precision is as a matrix-product operand through the
  // Context's bf16 weight copies (kernels/matmul.hpp's linear products): an update writes the
  // slot's bf16 copy in its own pass, and a bf16 weight stash (pipeline.stash_precision) keeps
  // the slot of a stashed version as its bf16 copy only (unless the slot is tied). A slot read
  // any other way (an embedding's gather, a norm, a bias) must leave it false.
  bool product_operand = false;
  // The RNG stream of a normal init is derive_seed(init_seed, stream_layer, stream_slot).
  // -1 (the default) means the slot's own (layer index, slot position); a tied copy names its
  // source's, so both copies get identical values without either stage seeing the other.
  int stream_layer = -1;
  int stream_slot = -1;
};

/// Writes slot `slot`'s initial values (its InitKind; a normal slot from the RNG stream
/// derive_seed(init_seed, stream_layer, stream_slot)) to dst[0, slot.numel).
void init_slot(const ParamSlot& slot, float* dst, uint64_t init_seed);

/// The loss produced by the last layer for one microbatch: Σ of per-token losses (double, in
/// row order) over `count` non-ignored targets. Every other layer returns {0, 0}.
struct LossStats {
  double sum = 0.0;
  int64_t count = 0;
  /// sum / count, or 0 when no target counts.
  double mean() const { return count > 0 ? sum / static_cast<double>(count) : 0.0; }
};

/// The `dloss` the loss layer's backward takes for a microbatch of `count` counted targets
/// when a step averages m microbatches: 1/(m·count) (0 when count == 0). The step's loss is
/// then (1/m)·Σⱼ meanⱼ, the mean over microbatches of each microbatch's mean token loss.
float loss_scale(int64_t count, int microbatches);

/// Number of targets that count in the loss (target != kIgnoreIndex); any stage can
/// compute it from the microbatch alone.
int64_t count_targets(const Microbatch& mb);

/// Where a layer sits in a model: the first reads the microbatch's tokens, the last computes
/// the loss, every other maps the hidden (B,T,C) stream to a new one.
enum class LayerRole : uint8_t {
  input,   // tokens (and segments) -> (B,T,C)
  hidden,  // (B,T,C) -> (B,T,C)
  loss,    // (B,T,C), targets -> loss
};
/// "input", "hidden", "loss".
std::string_view to_string(LayerRole role);

/// A layer of a model. All methods are const and keep no mutable state, so one object can
/// serve several threads. Buffers (all f32, B·T rows of the microbatch):
///  - params / grads: the layer's contiguous buffers of param_floats(), laid out by slots().
///  - in:    (B,T,C) hidden input; ignored (may be null) for the first layer (takes_input()
///           false), which reads mb.tokens (and mb.segments).
///  - out:   (B,T,C) hidden output; ignored (may be null) for the loss layer (is_loss()).
///  - saved: saved_floats_for(B,T, ctx.bf16_activations()) floats of per-microbatch
///           activations (a bf16 region in it is two values per float) written by forward and
///           read by the backward of the same microbatch (the caller stashes one per
///           microbatch in flight). Backward takes the same params and `in` as its forward.
/// Scratch comes from ctx.arena() and is dead when the call returns: the caller may reset
/// the arena between calls.
class Layer {
 public:
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  LayerRole role() const { return role_; }
  /// What the layer is, for messages and profiles: "gpt_block", or a user layer's own name.
  const std::string& type() const { return type_; }
  /// Global index of the layer in its model (0 = the input layer, L+1 = the loss layer).
  int index() const { return index_; }
  const std::vector<ParamSlot>& slots() const { return slots_; }
  /// Size of the parameter buffer (and of the gradient buffer) in floats.
  size_t param_floats() const { return param_floats_; }
  /// The slot called `name`, or nullptr.
  const ParamSlot* find_slot(std::string_view name) const;
  /// Floats of the slots marked ParamSlot::product_operand.
  size_t product_operand_floats() const;
  /// False for the first layer, which reads tokens from the microbatch instead of `in`.
  bool takes_input() const { return role_ != LayerRole::input; }
  /// True for the last layer, which reads targets and returns the loss instead of `out`.
  bool is_loss() const { return role_ == LayerRole::loss; }

  /// Floats of saved activations per microbatch of B sequences of T tokens.
  virtual size_t saved_floats(int B, int T) const = 0;
  /// The same when forward runs on a Context with bf16_activations() (bf16 products): a layer
  /// may keep the activations only its products read as their bf16 rounding, in half the
  /// floats. The default keeps everything in f32: saved_floats(B, T).
  virtual size_t saved_floats_bf16(int B, int T) const { return saved_floats(B, T); }
  /// saved_floats_bf16 when `bf16_activations`, else saved_floats: what `saved` must hold for a
  /// Context with that bf16_activations().
  size_t saved_floats_for(int B, int T, bool bf16_activations) const {
    return bf16_activations ? saved_floats_bf16(B, T) : saved_floats(B, T);
  }

  /// Writes the initial parameters (every slot per its InitKind; normal slots from their own
  /// RNG stream, see ParamSlot), independent of any other layer or the partition.
  void init(float* params, uint64_t init_seed) const;

  /// Forward of one microbatch. Returns the loss for the loss layer, {0, 0} otherwise.
  virtual LossStats forward(Context& ctx, const float* params, const Microbatch& mb,
                            const float* in, float* out, float* saved) const = 0;

  /// Backward of one microbatch. ACCUMULATES (+=) into grads; OVERWRITES din (B,T,C) with the
  /// gradient w.r.t. `in` (ignored for the first layer, may be null). dout (B,T,C) is the
  /// gradient w.r.t. `out` (ignored for the loss layer). dloss is used by the loss layer only:
  /// it differentiates dloss·(Σ token losses), see loss_scale().
  /// `later` null: everything is computed before the call returns. Otherwise the layer MAY
  /// record the weight gradients of its linear maps into `later` (with copies of what they
  /// read that the caller may overwrite: dout, the arena's scratch) instead: din is complete on
  /// return, those gradients once later->run() has run, which must happen before `params`,
  /// `in` or `saved` change. Either way grads receive the same bits. Splitting is optional: a
  /// layer that ignores `later` runs a one-pass backward, which is always correct (the built-in
  /// linear layers split, so the previous stage gets din sooner).
  virtual void backward(Context& ctx, const float* params, float* grads, const Microbatch& mb,
                        const float* in, const float* saved, const float* dout, float* din,
                        float dloss, DeferredGrads* later) const = 0;

  /// The loss layer's logits inside a `saved` buffer its forward wrote: one row of V for each
  /// entry of logit_rows(mb), in that order; nullptr for every other layer.
  virtual const float* logits(const float* saved, int B, int T) const;
  /// The rows of the microbatch (b·T + t) whose logits the loss layer computes: every row for
  /// GPT; for BERT only those whose targets count (the masked positions), since no other row
  /// reaches the loss. Empty for every other layer.
  virtual std::vector<int> logit_rows(const Microbatch& mb) const;

 protected:
  /// `slots` come with names, shapes and init; offsets and numel are filled in here, packed
  /// in order. Streams default to (index, slot position). `index` is the layer's position in
  /// the model it will be part of (Model::from_layers checks it); `type` names what it is.
  /// Slot names must be unique and non-empty, and every dimension positive (a bug otherwise:
  /// CheckFailure).
  Layer(LayerRole role, std::string type, int index, std::vector<ParamSlot> slots);

 private:
  LayerRole role_;
  std::string type_;
  int index_;
  std::vector<ParamSlot> slots_;
  size_t param_floats_ = 0;
};

}  // namespace actorpipe
