// BERT masking of one sequence: fixed-count position selection and the 80/10/10 replacement
// rule of the original BERT data pipeline (create_pretraining_data.py).
#include "engine/data/mask.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/check.hpp"

namespace actorpipe {

int bert_selected_count(int T, double mask_prob) {
  const auto k = static_cast<int>(std::llround(mask_prob * T));
  return std::clamp(k, 1, std::max(T, 1));
}

void apply_bert_mask(std::span<int32_t> tokens, std::span<int32_t> targets, const BertMasking& m,
                     DataRng& rng) {
  AP_CHECK(tokens.size() == targets.size(), "tokens {} vs targets {}", tokens.size(),
           targets.size());
  AP_CHECK(m.mask_prob > 0 && m.mask_prob <= 1, "mask_prob {}", m.mask_prob);
  AP_CHECK(m.random_vocab >= 1, "random_vocab {}", m.random_vocab);
  const int T = static_cast<int>(tokens.size());
  std::fill(targets.begin(), targets.end(), -1);
  if (T == 0) return;
  const int k = bert_selected_count(T, m.mask_prob);
  std::vector<int32_t> order(T);
  std::iota(order.begin(), order.end(), 0);
  for (int i = 0; i < k; ++i) {
    const auto j = i + static_cast<int>(rng.below(static_cast<uint64_t>(T - i)));
    std::swap(order[i], order[j]);
    const int32_t pos = order[i];
    targets[pos] = tokens[pos];
    const double u = rng.uniform();
    if (u < 0.8) {
      tokens[pos] = m.mask_token;
    } else if (u < 0.9) {
      tokens[pos] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(m.random_vocab)));
    }
  }
}

}  // namespace actorpipe
