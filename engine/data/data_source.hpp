// DataSource: where a run's microbatches come from, as a pure function of their position; the
// built-in sources (synthetic Markov corpus, byte-level text, token file) and a user's own.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "engine/batch.hpp"
#include "engine/expected.hpp"
#include "engine/options.hpp"

namespace actorpipe {

/// The microbatches of a run. Microbatch n (n = 0, 1, 2, ...) is a pure function of n: asked
/// again, after a resume from a checkpoint's data position or in another process, it has the
/// same values, which is what keeps resumed and multi-process runs equal to uninterrupted ones.
/// A run reads n = 0, 1, 2, ... in order from one thread; the source is shared (const) and may
/// be asked from any thread, one call at a time.
class DataSource {
 public:
  virtual ~DataSource();

  /// Microbatch n: B = batch_size() rows of T = seq_len() tokens (row-major (B,T) vectors):
  /// tokens and targets in [0, vocab_size()) (targets may be kIgnoreIndex, -1: no loss there),
  /// optionally segments and key_mask (BERT-style; empty or B·T entries). Microbatch::index is
  /// set by the caller. An exception fails the run with its message, naming n.
  virtual Microbatch microbatch(uint64_t n) const = 0;
  /// Every token and target id is below this (at most model.vocab_size).
  virtual int vocab_size() const = 0;
  /// B: sequences per microbatch (pipeline.microbatch_size).
  virtual int batch_size() const = 0;
  /// T: tokens per sequence (pipeline.seq_len, or model.context when that is 0).
  virtual int seq_len() const = 0;
  /// The lowest mean loss a model can reach on this data, when known (the synthetic corpus for
  /// GPT: its entropy rate); shown beside the loss. nullopt by default.
  virtual std::optional<double> loss_floor() const;
  /// The entropy rate of the token process in nats/token, when known. nullopt by default.
  virtual std::optional<double> entropy_rate() const;
  /// One line for logs: what the data is, its sizes.
  virtual std::string describe() const = 0;
};

/// Whether `mb` has the source's shape and ids in range; the error names the field and entry.
Status check_microbatch(const DataSource& source, const Microbatch& mb);

/// The built-in source of data.kind (synthetic | text | tokens) for a model of `arch` and
/// `vocab_size`, microbatches of B × T; a file without its held-out part (data.holdout).
/// Errors name the key or the file and the problem.
Expected<std::shared_ptr<const DataSource>> open_data_source(const DataOptions& opts, Arch arch,
                                                             int vocab_size, int B, int T);

/// The held-out data for evaluation ([eval]), microbatches of B × T: the file `eval_path` (in
/// opts.kind's format, read whole) when not empty; otherwise the held-out part of opts' own
/// data, which the training source of the same options never reads: a file's last
/// opts.holdout fraction (an error when it is 0), or the synthetic corpus's held-out stream
/// (the same chain; sequences drawn from their own seeded stream). Errors name the key or the
/// file.
Expected<std::shared_ptr<const DataSource>> open_heldout_source(const DataOptions& opts,
                                                                const std::string& eval_path,
                                                                Arch arch, int vocab_size, int B,
                                                                int T);

}  // namespace actorpipe
