// The built-in data sources: one batch builder (GPT shift / BERT masking, seeded per position
// and row) over two sequence sources, the synthetic Markov chain and a token corpus; and the
// DataLoader, a cursor over any DataSource.
#include "engine/data/loader.hpp"

#include <fmt/format.h>

#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "engine/data/data_rng.hpp"
#include "engine/data/markov.hpp"
#include "engine/data/mask.hpp"
#include "engine/data/token_file.hpp"
#include "kernels/crossentropy.hpp"

namespace actorpipe {
namespace {

// Independent random streams of one (seed, position, row); the held-out data has its own pair.
constexpr uint64_t kStreamSequence = 1;  // chain path or file offset
constexpr uint64_t kStreamMask = 2;      // BERT masking
constexpr uint64_t kStreamHeldOutSequence = 3;
constexpr uint64_t kStreamHeldOutMask = 4;

// Which part of the data a source makes.
enum class Split { training, held_out };

// Builds microbatches from sequences of L = T+1 (GPT) or T (BERT) corpus tokens; a subclass
// says how row b of microbatch n is drawn, from a generator derived from (seed, n, b).
class SequenceSource : public DataSource {
 public:
  SequenceSource(const DataOptions& opts, Arch arch, int vocab_size, int B, int T,
                 int32_t random_vocab, Split split)
      : arch_(arch),
        vocab_(vocab_size),
        B_(B),
        T_(T),
        seed_(opts.seed),
        split_(split),
        stream_sequence_(split == Split::training ? kStreamSequence : kStreamHeldOutSequence),
        stream_mask_(split == Split::training ? kStreamMask : kStreamHeldOutMask) {
    masking_.mask_prob = opts.mask_prob;
    masking_.mask_token = bert_mask_token(vocab_size);
    masking_.random_vocab = random_vocab;
  }

  Microbatch microbatch(uint64_t n) const override {
    Microbatch mb;
    mb.B = B_;
    mb.T = T_;
    mb.index = static_cast<int64_t>(n);
    const size_t BT = static_cast<size_t>(B_) * T_;
    mb.tokens.resize(BT);
    mb.targets.resize(BT);
    std::vector<int32_t> seq(static_cast<size_t>(sequence_length()));
    for (int b = 0; b < B_; ++b) {
      DataRng rng = DataRng::derive(seed_, stream_sequence_, n, static_cast<uint64_t>(b));
      fill(rng, seq);
      const std::span<int32_t> tokens(mb.tokens.data() + static_cast<size_t>(b) * T_, T_);
      const std::span<int32_t> targets(mb.targets.data() + static_cast<size_t>(b) * T_, T_);
      if (arch_ == Arch::gpt) {
        for (int t = 0; t < T_; ++t) {
          tokens[t] = seq[t];
          targets[t] = seq[t + 1];
        }
      } else {
        for (int t = 0; t < T_; ++t) tokens[t] = seq[t];
        DataRng mask_rng = DataRng::derive(seed_, stream_mask_, n, static_cast<uint64_t>(b));
        apply_bert_mask(tokens, targets, masking_, mask_rng);
      }
    }
    if (arch_ == Arch::bert) {
      mb.segments.resize(BT);
      for (size_t i = 0; i < BT; ++i) {
        mb.segments[i] = static_cast<int>(i % T_) < (T_ + 1) / 2 ? 0 : 1;
      }
      mb.key_mask.assign(BT, 1);
    }
    return mb;
  }

  int vocab_size() const override { return vocab_; }
  int batch_size() const override { return B_; }
  int seq_len() const override { return T_; }

 protected:
  // Writes the sequence_length() corpus tokens of one row, drawing from rng only.
  virtual void fill(DataRng& rng, std::span<int32_t> seq) const = 0;
  int sequence_length() const { return arch_ == Arch::gpt ? T_ + 1 : T_; }
  Arch arch() const { return arch_; }

  std::string batch_description() const {
    const char* part = split_ == Split::held_out ? "held-out " : "";
    if (arch_ == Arch::gpt) {
      return fmt::format("{}gpt batches B={} T={}, vocab {}, data seed {}", part, B_, T_, vocab_,
                         seed_);
    }
    return fmt::format(
        "{}bert batches B={} T={}, vocab {}, data seed {}, mask_prob {} ({} positions/sequence), "
        "[MASK] = {}",
        part, B_, T_, vocab_, seed_, masking_.mask_prob,
        bert_selected_count(T_, masking_.mask_prob), masking_.mask_token);
  }

 private:
  Arch arch_;
  int vocab_;
  int B_;
  int T_;
  uint64_t seed_;
  Split split_;
  uint64_t stream_sequence_;
  uint64_t stream_mask_;
  BertMasking masking_;
};

class SyntheticSource final : public SequenceSource {
 public:
  SyntheticSource(const DataOptions& opts, Arch arch, int vocab_size, int B, int T,
                  MarkovChain chain, int branching, Split split)
      : SequenceSource(opts, arch, vocab_size, B, T, chain.states(), split),
        chain_(std::move(chain)),
        branching_(branching),
        chain_seed_(opts.synthetic_seed) {}

  std::optional<double> entropy_rate() const override { return chain_.entropy_rate(); }

  std::optional<double> loss_floor() const override {
    if (arch() != Arch::gpt) return std::nullopt;
    return chain_.entropy_rate();  // every target x[t+1] is predicted from x[t] ~ π: H each
  }

  std::string describe() const override {
    return fmt::format(
        "synthetic Markov corpus: {} states, branching {}, chain seed {}, entropy rate {:.6f} "
        "nats/token, H(pi) {:.6f}; {}",
        chain_.states(), branching_, chain_seed_, chain_.entropy_rate(),
        chain_.stationary_entropy(), batch_description());
  }

 protected:
  void fill(DataRng& rng, std::span<int32_t> seq) const override { chain_.sample(seq, rng); }

 private:
  MarkovChain chain_;
  int branching_;
  uint64_t chain_seed_;
};

class FileSource final : public SequenceSource {
 public:
  // Sequences lie inside tokens [begin, end) of the corpus (open() checked end - begin >= L).
  FileSource(const DataOptions& opts, Arch arch, int vocab_size, int B, int T, TokenCorpus corpus,
             int32_t random_vocab, Split split, size_t begin, size_t end)
      : SequenceSource(opts, arch, vocab_size, B, T, random_vocab, split),
        corpus_(std::move(corpus)),
        begin_(begin),
        end_(end) {}

  std::string describe() const override {
    const std::string range = begin_ == 0 && end_ == corpus_.size()
                                  ? std::string()
                                  : fmt::format(", tokens [{}, {}) of it", begin_, end_);
    return fmt::format("{} ({}, {} tokens{}, sequences at seeded random offsets); {}",
                       corpus_.path(), corpus_.format(), corpus_.size(), range,
                       batch_description());
  }

 protected:
  void fill(DataRng& rng, std::span<int32_t> seq) const override {
    const size_t starts = end_ - begin_ - seq.size() + 1;
    corpus_.copy(begin_ + static_cast<size_t>(rng.below(starts)), seq);
  }

 private:
  TokenCorpus corpus_;
  size_t begin_;
  size_t end_;
};

// The token range of `split` in a corpus of `size` tokens: training gets [0, cut), held-out
// [cut, size) with cut = size − ⌊size · holdout⌋ (holdout 0: training reads everything). Each
// part must hold one sequence of L tokens.
Expected<std::pair<size_t, size_t>> split_range(const std::string& path, size_t size, size_t L,
                                                double holdout, Split split) {
  const size_t held = static_cast<size_t>(static_cast<double>(size) * holdout);
  const size_t cut = size - held;
  if (holdout > 0 && (cut < L || held < L)) {
    return make_error(
        "{}: data.holdout = {} splits its {} tokens into {} for training and {} held out; each "
        "part needs at least one sequence of {} tokens",
        path, holdout, size, cut, held, L);
  }
  if (split == Split::training) return std::pair{size_t{0}, cut};
  if (holdout == 0) {
    return make_error("{}: no held-out part (data.holdout = 0): set data.holdout or eval.path",
                      path);
  }
  return std::pair{cut, size};
}

// A cursor over a source: microbatch(position), checked against the source's own shape.
class SourceLoader final : public DataLoader {
 public:
  explicit SourceLoader(std::shared_ptr<const DataSource> source) : source_(std::move(source)) {}

  Microbatch next() override {
    Microbatch mb = source_->microbatch(position_);
    mb.index = static_cast<int64_t>(position_);
    if (Status ok = check_microbatch(*source_, mb); !ok)
      throw std::runtime_error(
          fmt::format("data: microbatch {}: {}", position_, ok.error().message));
    ++position_;
    return mb;
  }
  uint64_t position() const override { return position_; }
  void seek(uint64_t position) override { position_ = position; }
  int vocab_size() const override { return source_->vocab_size(); }
  std::optional<double> entropy_rate() const override { return source_->entropy_rate(); }
  std::string describe() const override { return source_->describe(); }
  std::optional<double> expected_loss_floor(int /*T*/) const override {
    return source_->loss_floor();
  }

 private:
  std::shared_ptr<const DataSource> source_;
  uint64_t position_ = 0;
};

}  // namespace

DataSource::~DataSource() = default;

std::optional<double> DataSource::loss_floor() const {
  return std::nullopt;
}

std::optional<double> DataSource::entropy_rate() const {
  return std::nullopt;
}

Status check_microbatch(const DataSource& source, const Microbatch& mb) {
  const int B = source.batch_size(), T = source.seq_len(), V = source.vocab_size();
  if (mb.B != B || mb.T != T)
    return make_error("shape (B, T) = ({}, {}), but the source makes ({}, {})", mb.B, mb.T, B, T);
  const size_t BT = static_cast<size_t>(B) * static_cast<size_t>(T);
  auto check_ids = [&](const std::vector<int32_t>& v, const char* what, bool ignore) -> Status {
    if (v.size() != BT)
      return make_error("{} has {} entries, expected B·T = {}", what, v.size(), BT);
    for (size_t i = 0; i < BT; ++i) {
      if ((v[i] >= 0 && v[i] < V) || (ignore && v[i] == kIgnoreIndex)) continue;
      return make_error("{}[{}] = {}: outside [0, vocab_size = {}){}", what, i, v[i], V,
                        ignore ? " and not the ignore index -1" : "");
    }
    return {};
  };
  if (Status ok = check_ids(mb.tokens, "tokens", false); !ok) return ok;
  if (Status ok = check_ids(mb.targets, "targets", true); !ok) return ok;
  if (!mb.segments.empty() && mb.segments.size() != BT)
    return make_error("segments has {} entries, expected 0 or B·T = {}", mb.segments.size(), BT);
  if (!mb.key_mask.empty() && mb.key_mask.size() != BT)
    return make_error("key_mask has {} entries, expected 0 or B·T = {}", mb.key_mask.size(), BT);
  return {};
}

DataLoader::~DataLoader() = default;

std::optional<double> DataLoader::expected_loss_floor(int /*T*/) const {
  return std::nullopt;
}

std::unique_ptr<DataLoader> DataLoader::over(std::shared_ptr<const DataSource> source) {
  return std::make_unique<SourceLoader>(std::move(source));
}

Expected<std::unique_ptr<DataLoader>> DataLoader::open(const DataOptions& opts, Arch arch,
                                                       int vocab_size, int B, int T) {
  auto source = open_data_source(opts, arch, vocab_size, B, T);
  if (!source) return source.error();
  return over(std::move(*source));
}

namespace {

Expected<std::shared_ptr<const DataSource>> open_source(const DataOptions& opts, Arch arch,
                                                        int vocab_size, int B, int T, Split split,
                                                        bool whole_file) {
  const bool bert = arch == Arch::bert;
  if (B < 1) return make_error("microbatch size B = {}: must be ≥ 1", B);
  if (T < 1) return make_error("sequence length T = {}: must be ≥ 1", T);
  if (bert && !(opts.mask_prob > 0 && opts.mask_prob <= 1)) {
    return make_error("data.mask_prob = {}: must be in (0, 1]", opts.mask_prob);
  }
  const size_t L = bert ? static_cast<size_t>(T) : static_cast<size_t>(T) + 1;

  if (opts.kind == "synthetic") {
    const int min_vocab = bert ? 2 : 1;
    if (vocab_size < min_vocab) {
      return make_error("model.vocab_size = {}: the synthetic {} corpus needs ≥ {}{}", vocab_size,
                        bert ? "BERT" : "GPT", min_vocab,
                        bert ? " (one corpus token and [MASK] = vocab_size − 1)" : "");
    }
    // BERT keeps the chain off [MASK] = vocab_size − 1.
    const int states = bert ? vocab_size - 1 : vocab_size;
    auto chain = MarkovChain::random(states, opts.synthetic_branching, opts.synthetic_seed);
    if (!chain) return chain.error();
    return std::shared_ptr<const DataSource>(std::make_shared<SyntheticSource>(
        opts, arch, vocab_size, B, T, std::move(*chain), opts.synthetic_branching, split));
  }
  if (opts.kind == "text" || opts.kind == "tokens") {
    if (opts.path.empty()) {
      return make_error("data.path is empty: data.kind = \"{}\" reads a file", opts.kind);
    }
    if (opts.kind == "text") {
      const int min_vocab = bert ? 257 : 256;
      if (vocab_size < min_vocab) {
        return make_error(
            "{}: model.vocab_size = {} is too small for byte-level text: {} needs ≥ {}{}",
            opts.path, vocab_size, bert ? "BERT" : "GPT", min_vocab,
            bert ? " (256 bytes and [MASK] = vocab_size − 1)" : " (256 bytes)");
      }
      auto corpus = TokenCorpus::open_text(opts.path, L);
      if (!corpus) return corpus.error();
      auto range = whole_file
                       ? Expected<std::pair<size_t, size_t>>(std::pair{size_t{0}, corpus->size()})
                       : split_range(opts.path, corpus->size(), L, opts.holdout, split);
      if (!range) return range.error();
      return std::shared_ptr<const DataSource>(
          std::make_shared<FileSource>(opts, arch, vocab_size, B, T, std::move(*corpus), 256, split,
                                       range->first, range->second));
    }
    const int min_vocab = bert ? 2 : 1;
    if (vocab_size < min_vocab) {
      return make_error("{}: model.vocab_size = {}: a {} token file needs ≥ {}", opts.path,
                        vocab_size, bert ? "BERT" : "GPT", min_vocab);
    }
    const int64_t limit = bert ? vocab_size - 1 : vocab_size;
    const std::string note = bert ? fmt::format(" (vocab_size {}; id {} is reserved for [MASK])",
                                                vocab_size, vocab_size - 1)
                                  : std::string(" (vocab_size)");
    auto corpus = TokenCorpus::open_tokens(opts.path, limit, L, note);
    if (!corpus) return corpus.error();
    auto range = whole_file
                     ? Expected<std::pair<size_t, size_t>>(std::pair{size_t{0}, corpus->size()})
                     : split_range(opts.path, corpus->size(), L, opts.holdout, split);
    if (!range) return range.error();
    return std::shared_ptr<const DataSource>(std::make_shared<FileSource>(
        opts, arch, vocab_size, B, T, std::move(*corpus), static_cast<int32_t>(limit), split,
        range->first, range->second));
  }
  return make_error("data.kind = \"{}\": unknown (allowed: synthetic, text, tokens)", opts.kind);
}

}  // namespace

Expected<std::shared_ptr<const DataSource>> open_data_source(const DataOptions& opts, Arch arch,
                                                             int vocab_size, int B, int T) {
  return open_source(opts, arch, vocab_size, B, T, Split::training, false);
}

Expected<std::shared_ptr<const DataSource>> open_heldout_source(const DataOptions& opts,
                                                                const std::string& eval_path,
                                                                Arch arch, int vocab_size, int B,
                                                                int T) {
  if (eval_path.empty()) return open_source(opts, arch, vocab_size, B, T, Split::held_out, false);
  if (opts.kind == "synthetic") {
    return make_error("eval.path = \"{}\": a held-out file needs data.kind text or tokens",
                      eval_path);
  }
  DataOptions file = opts;
  file.path = eval_path;
  return open_source(file, arch, vocab_size, B, T, Split::held_out, true);
}

}  // namespace actorpipe
