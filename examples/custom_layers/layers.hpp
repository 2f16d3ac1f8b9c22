// custom_layers: a language model the engine has never seen, written against actorpipe's public
// Layer interface only: a token embedding, pre-RMSNorm residual SwiGLU blocks, and an RMSNorm
// head whose output matrix is the embedding (a declared tie). Token-wise: no attention.
#pragma once

#include <actorpipe/engine/model/model.hpp>
#include <memory>

namespace custom {

/// Hidden units of the SwiGLU MLP per width unit (H = kExpand · C).
inline constexpr int kExpand = 2;

/// The model of `shape` (vocab_size, width, depth = SwiGLU blocks): [token_embedding,
/// swiglu_block × depth, rms_head], with the head's lm_head.weight tied to tok.weight.
actorpipe::Expected<actorpipe::Model> make_model(const actorpipe::ModelOptions& shape);

}  // namespace custom
