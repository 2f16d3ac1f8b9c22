// BERT masked-language-model masking: select a fixed share of positions, replace 80% of them by
// [MASK], 10% by a random token, keep 10%; targets hold the original token there and −1 elsewhere.
#pragma once

#include <cstdint>
#include <span>

#include "engine/data/data_rng.hpp"

namespace actorpipe {

struct BertMasking {
  double mask_prob = 0.15;   // share of positions selected, in (0, 1]
  int32_t mask_token = 0;    // the [MASK] id
  int32_t random_vocab = 0;  // random replacements are uniform in [0, random_vocab)
};

/// Positions selected in a sequence of T tokens: max(1, round(mask_prob·T)), at most T.
int bert_selected_count(int T, double mask_prob);

/// Masks one sequence in place: picks bert_selected_count(T) distinct positions uniformly (partial
/// Fisher–Yates), then for each draws u ~ U[0,1): u < 0.8 → mask_token, u < 0.9 → a uniform
/// random token, else kept. targets[t] = original token at selected t, −1 elsewhere.
void apply_bert_mask(std::span<int32_t> tokens, std::span<int32_t> targets, const BertMasking& m,
                     DataRng& rng);

}  // namespace actorpipe
