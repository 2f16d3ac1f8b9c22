// Model: an ordered list of layers (an input layer, L hidden layers, a loss layer) plus the
// declared parameters two layers share. The built-in GPT and BERT are built by Model::build; a
// user's own layers by Model::from_layers. Partition cuts go between any two layers.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "engine/expected.hpp"
#include "engine/model/layer.hpp"
#include "engine/options.hpp"
#include "kernels/context.hpp"

namespace actorpipe {

/// A parameter held twice: `owner` (the embedding's wte) and its `copy` (the head's decoder
/// weight). Both copies start identical (the copy is initialised as the owner's slot says, from
/// the owner's RNG stream), get the same summed gradient and the same update; the copy is
/// counted once (gradient norm, parameter count). Declaring it is all a model does. The owner
/// is in an earlier layer than its copy.
struct TiedParam {
  int owner_layer = 0;
  std::string owner_slot;  // "wte"
  int copy_layer = 0;
  std::string copy_slot;  // "lm_head.weight" (GPT) | "mlm.decoder.weight" (BERT)
};

/// GPT: [gpt_embedding, gpt_block × L, gpt_head]. BERT: [bert_embedding, bert_block × L,
/// bert_head]. Both use pre-LN blocks (x + attn(ln1(x)), then + mlp(ln2(·))) with a final
/// layernorm ln_f in the head; BERT differs by its embedding layernorm, bidirectional
/// attention with a key padding mask, segment embeddings and the MLM head.
/// Layers are shared, immutable objects: a pipeline stage may hold some of them.
class Model {
 public:
  /// The built-in GPT or BERT of opts.arch. Validates the options (errors name the key, the
  /// value and what is allowed).
  static Expected<Model> build(const ModelOptions& opts);
  /// A model of the caller's own layers, in order: layers[0] has LayerRole::input, the last
  /// LayerRole::loss, every other LayerRole::hidden, and layers[i].index() == i. `shape` gives
  /// vocab_size (the ids the input layer and the loss read), context (the longest T), width (C
  /// of the (B,T,C) stream between layers) and init_seed; options().depth becomes the number of
  /// hidden layers and options().tied whether `tied` is non-empty (arch, heads and segments are
  /// kept as given: they mean nothing to the engine). Errors name the layer or slot at fault.
  static Expected<Model> from_layers(const ModelOptions& shape,
                                     std::vector<std::shared_ptr<const Layer>> layers,
                                     std::vector<TiedParam> tied = {});

  const ModelOptions& options() const { return opts_; }
  /// L + 2.
  int num_layers() const { return static_cast<int>(layers_.size()); }
  const Layer& layer(int i) const;
  std::shared_ptr<const Layer> layer_ptr(int i) const;
  /// The declared shared parameters; empty when options().tied is false.
  const std::vector<TiedParam>& tied() const { return tied_; }
  /// A tied parameter's two slots: the owner's and the copy's (a model validated both when it
  /// was built; AP_CHECK for a TiedParam of another model).
  struct TiedSlots {
    const ParamSlot& owner;
    const ParamSlot& copy;
  };
  TiedSlots tied_slots(const TiedParam& t) const;
  /// True if slot `slot_index` of layer `layer` is the copy side of a tied parameter: it is
  /// skipped by the global gradient norm (the parameter counts once) and by parameter counts.
  bool is_tied_copy(int layer, size_t slot_index) const;
  /// True if slot `slot_index` of layer `layer` is either side of a tied parameter.
  bool is_tied(int layer, size_t slot_index) const;
  /// The floats of layer i that a bf16 weight stash keeps as their bf16 rounding alone in the
  /// versions besides the newest: its product operands (ParamSlot::product_operand) that are not
  /// tied (a tied value travels between stages in f32).
  size_t bf16_stash_floats(int layer) const;
  /// Checkpoint name "layers.<i>.<slot>".
  std::string param_name(int layer, const ParamSlot& slot) const;
  /// Σ of param_floats() over layers (tied copies included: the floats a run stores).
  size_t total_param_floats() const;
  /// Number of distinct trainable parameters (tied parameter counted once).
  size_t unique_parameters() const;

  /// Initialises layer i's parameter buffer from options().init_seed (a tied copy from its
  /// owner's slot and stream, so both start identical).
  void init_layer(int i, float* params) const;

  /// Σ g² (double) over layer i's gradient buffer, tied copies excluded, slot ranges in
  /// order, each through grad_sumsq. The global squared norm is the sum of these in layer
  /// order 0..num_layers()-1 (every executor must combine them in that order). `grads` is in
  /// the memory of ctx.backend(), which computes the sums.
  double grad_sumsq(Context& ctx, int layer, const float* grads) const;

 private:
  Model() = default;
  ModelOptions opts_;
  std::vector<std::shared_ptr<const Layer>> layers_;
  std::vector<TiedParam> tied_;
};

/// The [model] options a run of `model` (a user's own, Model::from_layers) uses, for a config
/// whose [model] section is `declared`: the config describes the model it trains, so
/// vocab_size, context, width, depth (the hidden layers) and init_seed must equal the model's
/// (an error names the key and both values); model.tied is taken from the model's declared ties.
Expected<ModelOptions> options_for_model(const ModelOptions& declared, const Model& model);

/// Sums a tied gradient in the one fixed order: s = owner[k] + copy[k], written to both.
void reduce_tied_grads(float* owner, float* copy, size_t n);
/// The same over ctx's threads (each element on its own: the same bits for any thread count).
void reduce_tied_grads(Context& ctx, float* owner, float* copy, size_t n);

}  // namespace actorpipe
