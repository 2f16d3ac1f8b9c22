// Fuzzes the token file reader with the input as a file's bytes: as uint16 tokens
// (TokenCorpus::open_tokens: raw or behind the llm.c header, its magic, version and count, the
// size, every id against the limit) and as UTF-8 text (open_text). A file opens or is an error
// naming it; every token of one that opens reads back below its limit.
#include "engine/data/token_file.hpp"

#include <vector>

#include "tests/fuzz/fuzz_support.hpp"

using namespace actorpipe;

namespace {

constexpr int64_t kIdLimit = 50257;  // GPT-2's vocabulary
constexpr size_t kMinTokens = 17;    // one sequence of 16 and its last target

void read_all(const TokenCorpus& corpus, int64_t limit) {
  std::vector<int32_t> tokens(corpus.size());
  // in two pieces, as the loader reads windows
  const size_t half = tokens.size() / 2;
  corpus.copy(0, std::span(tokens.data(), half));
  corpus.copy(half, std::span(tokens.data() + half, tokens.size() - half));
  for (size_t i = 0; i < tokens.size(); ++i) {
    FUZZ_CHECK(tokens[i] >= 0 && tokens[i] < limit, "{}: token {} at {} beyond the limit {}",
               corpus.format(), tokens[i], i, limit);
  }
  if (!tokens.empty()) FUZZ_CHECK(corpus[tokens.size() - 1] == tokens.back(), "operator[]");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile file;
  file.assign(data, size);
  auto tokens = TokenCorpus::open_tokens(file.path(), kIdLimit, kMinTokens, " (fuzz)");
  if (tokens) {
    FUZZ_CHECK(tokens->size() >= kMinTokens, "{} tokens", tokens->size());
    read_all(*tokens, kIdLimit);
  } else {
    FUZZ_CHECK(tokens.error().message.find(file.path()) != std::string::npos,
               "the error does not name the file: {}", tokens.error().message);
  }
  auto text = TokenCorpus::open_text(file.path(), kMinTokens);
  if (text) {
    FUZZ_CHECK(text->size() == size, "{} tokens of text from {} bytes", text->size(), size);
    FUZZ_CHECK(!find_invalid_utf8(std::span(data, size)), "invalid UTF-8 accepted");
    read_all(*text, 256);
  } else {
    FUZZ_CHECK(text.error().message.find(file.path()) != std::string::npos,
               "the error does not name the file: {}", text.error().message);
  }
  return 0;
}
