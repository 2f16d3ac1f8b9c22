// Transformer layers: the concrete GPT and BERT layers (embeddings, pre-LN block, LM and MLM
// heads) behind the Layer interface. Private to the engine; Model::build is the factory.
#pragma once

#include <memory>

#include "engine/model/layer.hpp"
#include "engine/options.hpp"

namespace actorpipe::internal {

/// Token + position embedding (GPT). Slots: wte (V,C), wpe (maxT,C).
std::shared_ptr<const Layer> make_gpt_embedding(const ModelOptions& o, int index);
/// Token + position + segment embedding, then layernorm (BERT).
/// Slots: wte (V,C), wpe (maxT,C), wse (S,C), ln.weight (C), ln.bias (C).
std::shared_ptr<const Layer> make_bert_embedding(const ModelOptions& o, int index);
/// Pre-LN block: x + proj(attn(qkv(ln1(x)))), then + mlp.proj(gelu(mlp.fc(ln2(·)))).
/// causal = GPT; otherwise bidirectional with Microbatch::key_mask (BERT).
std::shared_ptr<const Layer> make_block(const ModelOptions& o, int index, bool causal);
/// ln_f, logits = ln_f(x) · lm_head.weightᵀ (V,C; the tied copy of wte), cross-entropy.
std::shared_ptr<const Layer> make_gpt_head(const ModelOptions& o, int index);
/// ln_f, mlm.dense (C,C) + GELU + mlm.ln, logits = · mlm.decoder.weightᵀ (V,C; tied copy of
/// wte) + mlm.decoder.bias (V), cross-entropy on the masked positions.
std::shared_ptr<const Layer> make_bert_head(const ModelOptions& o, int index);

}  // namespace actorpipe::internal
