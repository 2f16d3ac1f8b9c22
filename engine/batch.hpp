// Microbatch: the integer inputs of one microbatch (tokens, targets, segments, padding mask).
// Small, so every stage gets its own copy; only hidden states move between stages.
#pragma once

#include <cstdint>
#include <vector>

namespace actorpipe {

struct Microbatch {
  int B = 0;                      // sequences
  int T = 0;                      // tokens per sequence
  std::vector<int32_t> tokens;    // (B,T) input ids
  std::vector<int32_t> targets;   // (B,T) ids to predict; kIgnoreIndex (-1) = no loss
  std::vector<int32_t> segments;  // (B,T) BERT segment ids; empty for GPT
  std::vector<uint8_t> key_mask;  // (B,T) 1 = real token, 0 = padding; empty = all real
  int64_t index = 0;              // global microbatch number (data position)
};

}  // namespace actorpipe
