// DataLoader tests: determinism and O(1) resumption for every source and architecture, GPT
// shift, the synthetic loss floor reached by the true model, BERT batch layout, option errors.
#include "engine/data/loader.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "engine/data/markov.hpp"
#include "engine/data/mask.hpp"
#include "engine/data/token_file.hpp"
#include "kernels/crossentropy.hpp"
#include "tests/support/files.hpp"
#include "tests/support/temp_dir.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

// A token file whose tokens are all distinct: token i = 7·i mod 1009, i < 1000.
constexpr int kPrime = 1009;
constexpr int kFileTokens = 1000;
std::vector<uint16_t> distinct_tokens() {
  std::vector<uint16_t> v(kFileTokens);
  for (int i = 0; i < kFileTokens; ++i) v[i] = static_cast<uint16_t>(7 * i % kPrime);
  return v;
}
// The index of a token of distinct_tokens(): 7⁻¹ mod 1009 = 865.
int index_of(int32_t token) {
  return static_cast<int>(int64_t{token} * 865 % kPrime);
}

std::string sample_text() {
  std::string s;
  for (int i = 0; s.size() < 3000; ++i) {
    s += "Ligne " + std::to_string(i) + ": déjà vu, naïve café — ∑ " + std::to_string(i * i % 97) +
         "\n";
  }
  return s;
}

// Files shared by the tests of this executable.
struct Fixture {
  TempDir dir;
  std::string text_path = dir.file("corpus.txt");
  std::string raw_path = dir.file("raw.bin");
  std::string llmc_path = dir.file("llmc.bin");
  std::string text = sample_text();
  Fixture() {
    dump(text_path, text);
    REQUIRE(write_token_file(raw_path, distinct_tokens(), TokenFileLayout::raw).ok());
    REQUIRE(write_token_file(llmc_path, distinct_tokens(), TokenFileLayout::llmc).ok());
  }
};

struct Source {
  std::string name;
  DataOptions opts;
  Arch arch;
  int vocab;
};

std::vector<Source> all_sources(const Fixture& f) {
  std::vector<Source> out;
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    const bool bert = arch == Arch::bert;
    DataOptions syn;
    syn.kind = "synthetic";
    out.push_back({"synthetic", syn, arch, 64});
    DataOptions text;
    text.kind = "text";
    text.path = f.text_path;
    out.push_back({"text", text, arch, bert ? 257 : 256});
    for (const auto& p : {f.raw_path, f.llmc_path}) {
      DataOptions tok;
      tok.kind = "tokens";
      tok.path = p;
      out.push_back({"tokens " + p, tok, arch, bert ? kPrime + 1 : kPrime});
    }
  }
  return out;
}

std::unique_ptr<DataLoader> must_open(const DataOptions& o, Arch arch, int V, int B, int T) {
  auto l = DataLoader::open(o, arch, V, B, T);
  REQUIRE_MESSAGE(l.ok(), (l.ok() ? "" : l.error().message));
  return std::move(*l);
}

bool same(const Microbatch& a, const Microbatch& b) {
  return a.B == b.B && a.T == b.T && a.index == b.index && a.tokens == b.tokens &&
         a.targets == b.targets && a.segments == b.segments && a.key_mask == b.key_mask;
}

std::string open_error(const DataOptions& o, Arch arch, int V, int B, int T) {
  auto l = DataLoader::open(o, arch, V, B, T);
  REQUIRE_FALSE(l.ok());
  return l.error().message;
}

const char* arch_name(Arch a) {
  return a == Arch::gpt ? "gpt" : "bert";
}

}  // namespace

TEST_CASE("every source: deterministic, resumable by seek, seed-dependent") {
  Fixture f;
  const int B = 4, T = 16, n = 6;
  for (const Source& s : all_sources(f)) {
    INFO(s.name << " " << arch_name(s.arch));
    auto a = must_open(s.opts, s.arch, s.vocab, B, T);
    auto b = must_open(s.opts, s.arch, s.vocab, B, T);
    CHECK(a->vocab_size() == s.vocab);
    std::vector<Microbatch> seq;
    for (int i = 0; i < n; ++i) {
      CHECK(a->position() == static_cast<uint64_t>(i));
      seq.push_back(a->next());
      CHECK(seq.back().index == i);
      CHECK(seq.back().B == B);
      CHECK(seq.back().T == T);
      CHECK(same(seq.back(), b->next()));
    }
    CHECK(a->position() == static_cast<uint64_t>(n));
    // Consecutive microbatches and rows differ.
    CHECK(seq[0].tokens != seq[1].tokens);
    CHECK(std::vector<int32_t>(seq[0].tokens.begin(), seq[0].tokens.begin() + T) !=
          std::vector<int32_t>(seq[0].tokens.begin() + T, seq[0].tokens.begin() + 2 * T));
    // seek(k) then next() is the (k+1)-th microbatch of a fresh loader; also backwards.
    auto c = must_open(s.opts, s.arch, s.vocab, B, T);
    c->seek(4);
    CHECK(c->position() == 4);
    CHECK(same(c->next(), seq[4]));
    CHECK(c->position() == 5);
    c->seek(1);
    CHECK(same(c->next(), seq[1]));
    CHECK(same(c->next(), seq[2]));
    a->seek(0);
    CHECK(same(a->next(), seq[0]));
    // A far position is reached in O(1) and is reproducible.
    c->seek(1'000'000'000'000ULL);
    const Microbatch far = c->next();
    CHECK(far.index == 1'000'000'000'000LL);
    b->seek(1'000'000'000'000ULL);
    CHECK(same(b->next(), far));
    // Another data seed gives another stream.
    DataOptions other = s.opts;
    other.seed += 1;
    auto d = must_open(other, s.arch, s.vocab, B, T);
    const Microbatch d0 = d->next();
    CHECK(d0.tokens != seq[0].tokens);
    if (s.arch == Arch::bert) CHECK(d0.targets != seq[0].targets);
  }
}

TEST_CASE("synthetic: another chain seed gives another chain and entropy") {
  DataOptions o;
  auto a = must_open(o, Arch::gpt, 64, 2, 8);
  o.synthetic_seed += 1;
  auto b = must_open(o, Arch::gpt, 64, 2, 8);
  CHECK(*a->entropy_rate() != *b->entropy_rate());
  CHECK(a->next().tokens != b->next().tokens);
}

TEST_CASE("GPT targets are the next tokens of a contiguous window") {
  Fixture f;
  const int B = 8, T = 24;
  // Token file: every token is distinct, so tokens[0] locates the window.
  for (const auto& path : {f.raw_path, f.llmc_path}) {
    DataOptions o;
    o.kind = "tokens";
    o.path = path;
    auto l = must_open(o, Arch::gpt, kPrime, B, T);
    const auto file = distinct_tokens();
    std::set<int> offsets;
    for (int i = 0; i < 20; ++i) {
      const Microbatch mb = l->next();
      CHECK(mb.segments.empty());
      CHECK(mb.key_mask.empty());
      for (int b = 0; b < B; ++b) {
        const int o0 = index_of(mb.tokens[b * T]);
        offsets.insert(o0);
        REQUIRE(o0 + T < kFileTokens);
        for (int t = 0; t < T; ++t) {
          CHECK(mb.tokens[b * T + t] == file[o0 + t]);
          CHECK(mb.targets[b * T + t] == file[o0 + t + 1]);
        }
      }
    }
    CHECK(offsets.size() > 100);  // 160 windows at seeded random offsets, few repeats
  }
  // Text: the bytes of some window text[o, o+T] are tokens then the last target.
  {
    DataOptions o;
    o.kind = "text";
    o.path = f.text_path;
    auto l = must_open(o, Arch::gpt, 256, B, T);
    for (int i = 0; i < 5; ++i) {
      const Microbatch mb = l->next();
      for (int b = 0; b < B; ++b) {
        std::string window(T + 1, '\0');
        for (int t = 0; t < T; ++t) window[t] = static_cast<char>(mb.tokens[b * T + t]);
        window[T] = static_cast<char>(mb.targets[b * T + T - 1]);
        CHECK(f.text.find(window) != std::string::npos);
        for (int t = 0; t + 1 < T; ++t) CHECK(mb.targets[b * T + t] == mb.tokens[b * T + t + 1]);
      }
    }
  }
  // Synthetic: targets shift the tokens and every step is a transition of the chain.
  {
    DataOptions o;
    auto l = must_open(o, Arch::gpt, 64, B, T);
    const MarkovChain chain = *MarkovChain::random(64, o.synthetic_branching, o.synthetic_seed);
    for (int i = 0; i < 5; ++i) {
      const Microbatch mb = l->next();
      for (int b = 0; b < B; ++b) {
        for (int t = 0; t < T; ++t) {
          if (t + 1 < T) CHECK(mb.targets[b * T + t] == mb.tokens[b * T + t + 1]);
          CHECK(chain.transition(mb.tokens[b * T + t], mb.targets[b * T + t]) > 0);
        }
      }
    }
  }
}

TEST_CASE("synthetic GPT: the true model's loss equals the floor H at every position") {
  DataOptions o;
  o.synthetic_branching = 4;
  const int V = 64, B = 16, T = 32, batches = 600;
  auto l = must_open(o, Arch::gpt, V, B, T);
  const MarkovChain chain = *MarkovChain::random(V, o.synthetic_branching, o.synthetic_seed);
  const double H = chain.entropy_rate();
  CHECK(*l->entropy_rate() == H);
  CHECK(*l->expected_loss_floor(T) == H);
  CHECK(*l->expected_loss_floor(1) == H);
  // −log P(target | token) under the true chain, overall and at the first position.
  double sum = 0, sq = 0, first = 0, first_sq = 0, init = 0;
  for (int i = 0; i < batches; ++i) {
    const Microbatch mb = l->next();
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        const double nll = -std::log(chain.transition(mb.tokens[b * T + t], mb.targets[b * T + t]));
        sum += nll;
        sq += nll * nll;
        if (t == 0) {
          first += nll;
          first_sq += nll * nll;
          init -= std::log(chain.stationary()[mb.tokens[b * T]]);
        }
      }
    }
  }
  const double n = static_cast<double>(batches) * B * T, n0 = static_cast<double>(batches) * B;
  const double mean = sum / n, mean0 = first / n0;
  const double se = std::sqrt((sq / n - mean * mean) / n);
  const double se0 = std::sqrt((first_sq / n0 - mean0 * mean0) / n0);
  MESSAGE("H = " << H << ", loss " << mean << " (se " << se << "), first position " << mean0
                 << ", H(pi) = " << chain.stationary_entropy() << " vs " << init / n0);
  // Rows are independent; within a row the chain mixes fast, so allow 8 naive standard errors.
  CHECK(std::abs(mean - H) < 8 * se);
  CHECK(std::abs(mean0 - H) < 6 * se0);
  // The first input token is drawn from π: its mean surprisal is H(π).
  CHECK(std::abs(init / n0 - chain.stationary_entropy()) < 0.05);
}

TEST_CASE("BERT batches: segments, key mask, masked targets, [MASK] off the corpus") {
  Fixture f;
  const int B = 6, T = 21;
  const int k = bert_selected_count(T, 0.15);  // round(3.15) = 3
  CHECK(k == 3);
  for (const Source& s : all_sources(f)) {
    if (s.arch != Arch::bert) continue;
    INFO(s.name);
    auto l = must_open(s.opts, s.arch, s.vocab, B, T);
    const int32_t mask = bert_mask_token(s.vocab);
    CHECK(mask == s.vocab - 1);
    CHECK_FALSE(l->expected_loss_floor(T).has_value());
    const MarkovChain chain =
        *MarkovChain::random(s.vocab - 1, s.opts.synthetic_branching, s.opts.synthetic_seed);
    double masked = 0, selected = 0;
    for (int i = 0; i < 40; ++i) {
      const Microbatch mb = l->next();
      REQUIRE(mb.segments.size() == static_cast<size_t>(B * T));
      REQUIRE(mb.key_mask.size() == static_cast<size_t>(B * T));
      for (int b = 0; b < B; ++b) {
        int row_selected = 0;
        std::vector<int32_t> original(T);
        for (int t = 0; t < T; ++t) {
          const int j = b * T + t;
          CHECK(mb.segments[j] == (t < 11 ? 0 : 1));  // first ⌈T/2⌉ positions: segment 0
          CHECK(mb.key_mask[j] == 1);
          CHECK(mb.tokens[j] >= 0);
          CHECK(mb.tokens[j] < s.vocab);
          if (mb.targets[j] == -1) {
            CHECK(mb.tokens[j] != mask);
            original[t] = mb.tokens[j];
          } else {
            ++row_selected;
            original[t] = mb.targets[j];
            masked += mb.tokens[j] == mask;
          }
          CHECK(original[t] < mask);  // the corpus never produces [MASK]
        }
        CHECK(row_selected == k);
        selected += row_selected;
        // The unmasked sequence is a real piece of the corpus.
        if (s.opts.kind == "synthetic") {
          for (int t = 0; t + 1 < T; ++t) CHECK(chain.transition(original[t], original[t + 1]) > 0);
        } else if (s.opts.kind == "tokens") {
          const int o0 = index_of(original[0]);
          for (int t = 0; t < T; ++t) CHECK(original[t] == distinct_tokens()[o0 + t]);
        } else {
          CHECK(f.text.find(byte_decode(original)) != std::string::npos);
        }
      }
    }
    CHECK(masked / selected > 0.6);  // 80% expected (exact shares: data_mask tests)
    CHECK(masked / selected < 0.95);
  }
}

TEST_CASE("entropy rate, loss floor and description per source") {
  Fixture f;
  for (const Source& s : all_sources(f)) {
    INFO(s.name << " " << arch_name(s.arch));
    auto l = must_open(s.opts, s.arch, s.vocab, 2, 8);
    const std::string d = l->describe();
    CHECK(d.find(arch_name(s.arch)) != std::string::npos);
    CHECK(d.find("B=2 T=8") != std::string::npos);
    if (s.opts.kind == "synthetic") {
      const int states = s.arch == Arch::bert ? s.vocab - 1 : s.vocab;
      const MarkovChain chain =
          *MarkovChain::random(states, s.opts.synthetic_branching, s.opts.synthetic_seed);
      REQUIRE(l->entropy_rate().has_value());
      CHECK(*l->entropy_rate() == chain.entropy_rate());
      CHECK(d.find("synthetic Markov corpus: " + std::to_string(states) + " states") !=
            std::string::npos);
    } else {
      CHECK_FALSE(l->entropy_rate().has_value());
      CHECK_FALSE(l->expected_loss_floor(8).has_value());
      CHECK(d.find(s.opts.path) != std::string::npos);
    }
    if (s.arch == Arch::bert) {
      CHECK(d.find("[MASK] = " + std::to_string(s.vocab - 1)) != std::string::npos);
    }
  }
}

TEST_CASE("bad options and files are errors naming the key or file and the problem") {
  Fixture f;
  auto has = [](const std::string& msg, std::initializer_list<std::string> parts) {
    INFO("message: " << msg);
    for (const auto& p : parts) CHECK_MESSAGE(msg.find(p) != std::string::npos, p);
  };
  DataOptions syn;
  DataOptions bad_kind;
  bad_kind.kind = "synth";
  has(open_error(bad_kind, Arch::gpt, 64, 2, 8),
      {"data.kind = \"synth\"", "allowed: synthetic, text, tokens"});
  has(open_error(syn, Arch::gpt, 64, 0, 8), {"B = 0"});
  has(open_error(syn, Arch::gpt, 64, 2, 0), {"T = 0"});
  DataOptions mask0 = syn;
  mask0.mask_prob = 0;
  has(open_error(mask0, Arch::bert, 64, 2, 8), {"data.mask_prob = 0", "(0, 1]"});
  mask0.mask_prob = 1.5;
  has(open_error(mask0, Arch::bert, 64, 2, 8), {"data.mask_prob = 1.5"});
  CHECK(DataLoader::open(mask0, Arch::gpt, 64, 2, 8).ok());  // GPT ignores mask_prob
  DataOptions branch = syn;
  branch.synthetic_branching = 0;
  has(open_error(branch, Arch::gpt, 64, 2, 8), {"data.synthetic_branching = 0"});
  branch.synthetic_branching = 9;
  has(open_error(branch, Arch::gpt, 8, 2, 8), {"data.synthetic_branching = 9", "[1, 8]"});
  has(open_error(branch, Arch::bert, 9, 2, 8), {"[1, 8]"});  // BERT: 8 states + [MASK]
  has(open_error(syn, Arch::bert, 1, 2, 8), {"model.vocab_size = 1", "[MASK]"});

  DataOptions text;
  text.kind = "text";
  has(open_error(text, Arch::gpt, 256, 2, 8), {"data.path is empty", "\"text\""});
  text.path = f.text_path;
  has(open_error(text, Arch::gpt, 255, 2, 8), {f.text_path, "vocab_size = 255", "≥ 256"});
  has(open_error(text, Arch::bert, 256, 2, 8), {f.text_path, "vocab_size = 256", "≥ 257"});
  text.path = f.dir.file("nope.txt");
  has(open_error(text, Arch::gpt, 256, 2, 8), {text.path, "cannot open"});
  const std::string latin1 = f.dir.file("latin1.txt");
  dump(latin1, "caf\xE9 au lait, caf\xE9 noir");
  text.path = latin1;
  has(open_error(text, Arch::gpt, 256, 2, 8), {latin1, "invalid UTF-8 at byte offset 3"});

  DataOptions tok;
  tok.kind = "tokens";
  tok.path = f.dir.file("missing.bin");
  has(open_error(tok, Arch::gpt, kPrime, 2, 8), {tok.path, "cannot open"});
  // A file of exactly T tokens: enough for BERT (T), truncated for GPT (T+1).
  const std::string exact = f.dir.file("exact.bin");
  REQUIRE(write_token_file(exact, std::vector<uint16_t>(8, 5), TokenFileLayout::llmc).ok());
  tok.path = exact;
  has(open_error(tok, Arch::gpt, kPrime, 2, 8), {exact, "truncated", "8 tokens", "9"});
  CHECK(DataLoader::open(tok, Arch::bert, kPrime, 2, 8).ok());
  // Token 1008 fits a GPT vocabulary of 1009 but is [MASK] in a BERT vocabulary of 1009.
  tok.path = f.raw_path;
  CHECK(DataLoader::open(tok, Arch::gpt, kPrime, 2, 8).ok());
  has(open_error(tok, Arch::bert, kPrime, 2, 8),
      {f.raw_path, "token 1008 at index", "reserved for [MASK]"});
  has(open_error(tok, Arch::gpt, 1000, 2, 8), {f.raw_path, "< 1000 (vocab_size)"});
}

TEST_CASE("held-out data never overlaps training data: a file's tail, the corpus's own stream") {
  const Fixture f;
  // a token file of distinct tokens: each token names its position in the file
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    CAPTURE(arch_name(arch));
    DataOptions o;
    o.kind = "tokens";
    o.path = f.raw_path;
    o.holdout = 0.2;  // the last 200 of the 1000 tokens
    const int V = arch == Arch::bert ? kPrime + 1 : kPrime;
    auto train = must_open(o, arch, V, 4, 8);
    auto held = open_heldout_source(o, "", arch, V, 4, 8);
    REQUIRE(held.ok());
    CHECK((*held)->describe().find("tokens [800, 1000) of it") != std::string::npos);
    std::set<int> train_positions, held_positions;
    for (uint64_t n = 0; n < 300; ++n) {
      const Microbatch a = train->next();
      const Microbatch b = (*held)->microbatch(n);
      for (int32_t t : a.tokens)
        if (arch == Arch::gpt || t != bert_mask_token(V)) train_positions.insert(index_of(t));
      for (int32_t t : a.targets)
        if (t != kIgnoreIndex) train_positions.insert(index_of(t));
      for (int32_t t : b.tokens)
        if (arch == Arch::gpt || t != bert_mask_token(V)) held_positions.insert(index_of(t));
    }
    // BERT's random replacement draws any id: only GPT's positions are all in their part
    if (arch == Arch::gpt) {
      CHECK(*train_positions.rbegin() < 800);
      CHECK(*held_positions.begin() >= 800);
    }
    CHECK(held_positions.size() > 150);  // the held-out part is read, not one sequence
    // without holdout training reads the whole file, and there is no held-out part
    o.holdout = 0.0;
    auto whole = must_open(o, arch, V, 4, 8);
    int beyond = 0;
    for (int n = 0; n < 300; ++n)
      for (int32_t t : whole->next().tokens) beyond += index_of(t) >= 800 ? 1 : 0;
    CHECK(beyond > 0);
    CHECK(open_heldout_source(o, "", arch, V, 4, 8).error().message ==
          f.raw_path + ": no held-out part (data.holdout = 0): set data.holdout or eval.path");
  }
  // the synthetic corpus: the same chain, other sequences
  DataOptions syn;
  auto train = open_data_source(syn, Arch::gpt, 64, 2, 16);
  auto held = open_heldout_source(syn, "", Arch::gpt, 64, 2, 16);
  REQUIRE(train.ok());
  REQUIRE(held.ok());
  CHECK((*held)->describe().find("held-out gpt batches") != std::string::npos);
  CHECK((*held)->loss_floor() == (*train)->loss_floor());
  std::set<std::vector<int32_t>> rows;
  for (uint64_t n = 0; n < 200; ++n) {
    const Microbatch a = (*train)->microbatch(n);
    for (int b = 0; b < 2; ++b)
      rows.insert(std::vector<int32_t>(a.tokens.begin() + b * 16, a.tokens.begin() + b * 16 + 16));
  }
  for (uint64_t n = 0; n < 200; ++n) {
    const Microbatch a = (*held)->microbatch(n);
    CHECK(same(a, (*held)->microbatch(n)));  // a pure function of n
    for (int b = 0; b < 2; ++b)
      CHECK(rows.count(std::vector<int32_t>(a.tokens.begin() + b * 16,
                                            a.tokens.begin() + b * 16 + 16)) == 0);
  }
}

TEST_CASE("held-out data: eval.path read whole, a holdout too small for a sequence") {
  const Fixture f;
  DataOptions o;
  o.kind = "text";
  o.path = f.text_path;
  auto held = open_heldout_source(o, f.text_path, Arch::gpt, 256, 2, 8);
  REQUIRE(held.ok());
  CHECK((*held)->describe().find("tokens [") == std::string::npos);  // the whole file
  o.holdout = 0.001;                                                 // 3 of the text's bytes
  const std::string e = open_error(o, Arch::gpt, 256, 2, 8);
  CHECK(e.find("data.holdout = 0.001 splits its") != std::string::npos);
  CHECK(e.find("each part needs at least one sequence of 9 tokens") != std::string::npos);
  DataOptions syn;
  CHECK(open_heldout_source(syn, "x.txt", Arch::gpt, 64, 2, 8).error().message ==
        "eval.path = \"x.txt\": a held-out file needs data.kind text or tokens");
}
