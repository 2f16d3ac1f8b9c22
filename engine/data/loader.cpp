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

// Independent random streams of one (seed, position, row).
constexpr uint64_t kStreamSequence = 1;  // chain path or file offset
constexpr uint64_t kStreamMask = 2;      // BERT masking

// Builds microbatches from sequences of L = T+1 (GPT) or T (BERT) corpus tokens; a subclass
// says how row b of microbatch n is drawn, from a generator derived from (seed, n, b).
class SequenceSource : public DataSource {
 public:
  SequenceSource(const DataOptions& opts, Arch arch, int vocab_size, int B, int T,
                 int32_t random_vocab)
      : arch_(arch), vocab_(vocab_size), B_(B), T_(T), seed_(opts.seed) {
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
      DataRng rng = DataRng::derive(seed_, kStreamSequence, n, static_cast<uint64_t>(b));
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
        DataRng mask_rng = DataRng::derive(seed_, kStreamMask, n, static_cast<uint64_t>(b));
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
    if (arch_ == Arch::gpt) {
      return fmt::format("gpt batches B={} T={}, vocab {}, data seed {}", B_, T_, vocab_, seed_);
    }
    return fmt::format(
        "bert batches B={} T={}, vocab {}, data seed {}, mask_prob {} ({} positions/sequence), "
        "[MASK] = {}",
        B_, T_, vocab_, seed_, masking_.mask_prob, bert_selected_count(T_, masking_.mask_prob),
        masking_.mask_token);
  }

 private:
  Arch arch_;
  int vocab_;
  int B_;
  int T_;
  uint64_t seed_;
  BertMasking masking_;
};

class SyntheticSource final : public SequenceSource {
 public:
  SyntheticSource(const DataOptions& opts, Arch arch, int vocab_size, int B, int T,
                  MarkovChain chain, int branching)
      : SequenceSource(opts, arch, vocab_size, B, T, chain.states()),
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
  FileSource(const DataOptions& opts, Arch arch, int vocab_size, int B, int T, TokenCorpus corpus,
             int32_t random_vocab)
      : SequenceSource(opts, arch, vocab_size, B, T, random_vocab), corpus_(std::move(corpus)) {}

  std::string describe() const override {
    return fmt::format("{} ({}, {} tokens, sequences at seeded random offsets); {}", corpus_.path(),
                       corpus_.format(), corpus_.size(), batch_description());
  }

 protected:
  void fill(DataRng& rng, std::span<int32_t> seq) const override {
    const size_t starts = corpus_.size() - seq.size() + 1;  // open() checked size ≥ L
    corpus_.copy(static_cast<size_t>(rng.below(starts)), seq);
  }

 private:
  TokenCorpus corpus_;
};

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

Expected<std::shared_ptr<const DataSource>> open_data_source(const DataOptions& opts, Arch arch,
                                                             int vocab_size, int B, int T) {
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
        opts, arch, vocab_size, B, T, std::move(*chain), opts.synthetic_branching));
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
      return std::shared_ptr<const DataSource>(
          std::make_shared<FileSource>(opts, arch, vocab_size, B, T, std::move(*corpus), 256));
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
    return std::shared_ptr<const DataSource>(std::make_shared<FileSource>(
        opts, arch, vocab_size, B, T, std::move(*corpus), static_cast<int32_t>(limit)));
  }
  return make_error("data.kind = \"{}\": unknown (allowed: synthetic, text, tokens)", opts.kind);
}

}  // namespace actorpipe
