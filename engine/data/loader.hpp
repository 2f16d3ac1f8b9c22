// DataLoader: a deterministic, resumable stream of microbatches: a cursor over a DataSource (a
// built-in one: synthetic Markov corpus, byte-level UTF-8 text, uint16 token file; or a user's).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "engine/batch.hpp"
#include "engine/data/data_source.hpp"
#include "engine/expected.hpp"
#include "engine/options.hpp"

namespace actorpipe {

/// The [MASK] token id of a BERT vocabulary: the last id, vocab_size − 1. Data sources never
/// produce it as a corpus token (the synthetic chain, text bytes and token files stay below it).
constexpr int32_t bert_mask_token(int vocab_size) {
  return vocab_size - 1;
}

/// A stream of microbatches. The n-th microbatch (n = 0, 1, ...) is a pure function of the
/// options, the architecture, vocab_size, B, T and n: no hidden state besides the position.
class DataLoader {
 public:
  /// kind = synthetic | text | tokens (DataOptions::kind): over(open_data_source(...)). Errors
  /// name the file and the problem.
  static Expected<std::unique_ptr<DataLoader>> open(const DataOptions& opts, Arch arch,
                                                    int vocab_size, int B, int T);
  /// A cursor over `source`, at position 0: next() is source->microbatch(position()), checked
  /// (check_microbatch; a bad one throws std::runtime_error naming the position).
  static std::unique_ptr<DataLoader> over(std::shared_ptr<const DataSource> source);
  virtual ~DataLoader();
  /// The microbatch at position(), then advances position() by one.
  virtual Microbatch next() = 0;  // deterministic sequence of microbatches
  /// Microbatches produced so far (the index of the next one).
  virtual uint64_t position() const = 0;  // resumable: microbatches produced so far
  /// next() continues exactly as after `position` calls from a fresh loader. O(1).
  virtual void seek(uint64_t position) = 0;
  /// The model vocabulary the batches are in: every id is < vocab_size().
  virtual int vocab_size() const = 0;
  /// Entropy rate H of the source in nats/token: synthetic only, nullopt for files.
  virtual std::optional<double> entropy_rate() const = 0;  // nats/token, synthetic only
  /// One line for logs: kind, file or chain, sizes.
  virtual std::string describe() const = 0;  // one line for logs
  /// GPT: the lowest achievable mean next-token loss (nats) over a sequence of length T, when
  /// known (synthetic source: exactly H for every T, see docs/data.md); nullopt otherwise.
  virtual std::optional<double> expected_loss_floor(int T) const;
};

}  // namespace actorpipe
