// Token file tests: text and both uint16 layouts round-trip through files built byte by byte,
// and every kind of bad file is rejected with a message naming the path and the problem.
#include "engine/data/token_file.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/support/files.hpp"
#include "tests/support/temp_dir.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

// Little-endian encodings, written out independently of the reader.
std::string le16s(const std::vector<uint16_t>& v) {
  std::string s;
  for (uint16_t x : v) {
    s.push_back(static_cast<char>(x & 0xFF));
    s.push_back(static_cast<char>(x >> 8));
  }
  return s;
}

std::string llmc_header(int32_t magic, int32_t version, int32_t count) {
  std::string s(1024, '\0');
  const int32_t words[3] = {magic, version, count};
  for (int w = 0; w < 3; ++w) {
    const auto u = static_cast<uint32_t>(words[w]);
    for (int i = 0; i < 4; ++i) s[4 * w + i] = static_cast<char>((u >> (8 * i)) & 0xFF);
  }
  return s;
}

std::vector<uint16_t> sample_tokens() {
  std::vector<uint16_t> v;
  for (int i = 0; i < 300; ++i) v.push_back(static_cast<uint16_t>((i * 7919) % 50257));
  v.push_back(0);
  v.push_back(50256);
  return v;
}

// The error message of a failed open, which must mention every fragment.
void check_error(const Expected<TokenCorpus>& c, const std::string& path,
                 std::initializer_list<std::string> fragments) {
  REQUIRE_FALSE(c.ok());
  const std::string& msg = c.error().message;
  INFO("message: " << msg);
  CHECK(msg.find(path) != std::string::npos);
  for (const auto& f : fragments) CHECK_MESSAGE(msg.find(f) != std::string::npos, f);
}

}  // namespace

TEST_CASE("UTF-8 text round-trips byte by byte") {
  TempDir dir;
  const std::string text = "héllo, wörld ✓ 🎉\nline two\tend\n";
  const std::string p = dir.file("a.txt");
  dump(p, text);
  auto c = TokenCorpus::open_text(p, 4);
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? "" : c.error().message));
  CHECK(c->size() == text.size());
  CHECK(c->format() == "utf-8 text");
  CHECK_FALSE(c->layout().has_value());
  std::vector<int32_t> all(c->size());
  c->copy(0, all);
  CHECK(all == byte_encode(text));
  CHECK(byte_decode(all) == text);
  CHECK((*c)[1] == 0xC3);  // first byte of 'é'
  std::vector<int32_t> window(3);
  c->copy(6, window);  // "é" is two bytes: "h" 0, "é" 1-2, "llo" 3-5
  CHECK(window == std::vector<int32_t>{',', ' ', 'w'});
}

TEST_CASE("raw uint16 and llm.c files round-trip") {
  TempDir dir;
  const auto tokens = sample_tokens();
  const std::string raw = dir.file("raw.bin"), llmc = dir.file("llmc.bin");
  dump(raw, le16s(tokens));
  dump(llmc, llmc_header(20240520, 1, static_cast<int32_t>(tokens.size())) + le16s(tokens));
  for (const auto& [path, layout, format] :
       {std::tuple{raw, TokenFileLayout::raw, "uint16 raw"},
        std::tuple{llmc, TokenFileLayout::llmc, "uint16 llm.c v1"}}) {
    auto c = TokenCorpus::open_tokens(path, 50257, 10);
    REQUIRE_MESSAGE(c.ok(), (c.ok() ? "" : c.error().message));
    CHECK(c->layout() == layout);
    CHECK(c->format() == format);
    REQUIRE(c->size() == tokens.size());
    std::vector<int32_t> all(c->size());
    c->copy(0, all);
    for (size_t i = 0; i < tokens.size(); ++i) CHECK(all[i] == tokens[i]);
    CHECK((*c)[tokens.size() - 1] == 50256);
  }
  // The writer produces exactly these bytes.
  const std::string raw2 = dir.file("raw2.bin"), llmc2 = dir.file("llmc2.bin");
  REQUIRE(write_token_file(raw2, tokens, TokenFileLayout::raw).ok());
  REQUIRE(write_token_file(llmc2, tokens, TokenFileLayout::llmc).ok());
  CHECK(slurp(raw2) == slurp(raw));
  CHECK(slurp(llmc2) == slurp(llmc));
  const auto bad = write_token_file(dir.file("no/such/dir.bin"), tokens, TokenFileLayout::raw);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("no/such/dir.bin: cannot create") != std::string::npos);
}

TEST_CASE("bad text files are errors naming the path and the problem") {
  TempDir dir;
  const std::string missing = dir.file("missing.txt");
  check_error(TokenCorpus::open_text(missing, 2), missing, {"cannot open", "No such file"});
  const std::string empty = dir.file("empty.txt");
  dump(empty, "");
  check_error(TokenCorpus::open_text(empty, 2), empty, {"empty file"});
  const std::string shortf = dir.file("short.txt");
  dump(shortf, "abc");
  check_error(TokenCorpus::open_text(shortf, 9), shortf, {"truncated", "3 bytes", "9"});
  const std::string binary = dir.file("binary.txt");
  dump(binary, "good text\xFF\xFE more");
  check_error(TokenCorpus::open_text(binary, 2), binary,
              {"invalid UTF-8 at byte offset 9", "0xff"});
  check_error(TokenCorpus::open_text(dir.path.string(), 2), dir.path.string(),
              {"not a regular file"});
}

TEST_CASE("bad token files are errors naming the path and the problem") {
  TempDir dir;
  const auto tokens = sample_tokens();
  const auto n = static_cast<int32_t>(tokens.size());
  auto open = [](const std::string& p) { return TokenCorpus::open_tokens(p, 50257, 65); };

  const std::string missing = dir.file("missing.bin");
  check_error(open(missing), missing, {"cannot open", "No such file"});

  const std::string empty = dir.file("empty.bin");
  dump(empty, "");
  check_error(open(empty), empty, {"empty file"});

  const std::string odd = dir.file("odd.bin");
  dump(odd, le16s(tokens) + "x");
  check_error(open(odd), odd, {"odd size 605 bytes"});

  const std::string short_raw = dir.file("short_raw.bin");
  dump(short_raw, le16s({1, 2, 3}));
  check_error(open(short_raw), short_raw, {"truncated", "3 tokens", "65"});

  const std::string short_llmc = dir.file("short_llmc.bin");
  dump(short_llmc, llmc_header(20240520, 1, 3) + le16s({1, 2, 3}));
  check_error(open(short_llmc), short_llmc, {"truncated", "3 tokens", "65"});

  const std::string cut_body = dir.file("cut_body.bin");
  dump(cut_body, llmc_header(20240520, 1, n + 10) + le16s(tokens));
  check_error(open(cut_body), cut_body,
              {"truncated", "declares " + std::to_string(n + 10) + " tokens",
               "only " + std::to_string(2 * n) + " bytes"});

  const std::string trailing = dir.file("trailing.bin");
  dump(trailing, llmc_header(20240520, 1, n - 1) + le16s(tokens));
  check_error(open(trailing), trailing, {"size mismatch", "2 trailing"});

  const std::string cut_header = dir.file("cut_header.bin");
  dump(cut_header, llmc_header(20240520, 1, n).substr(0, 100));
  check_error(open(cut_header), cut_header, {"truncated llm.c header", "100 bytes"});

  const std::string version = dir.file("version.bin");
  dump(version, llmc_header(20240520, 2, n) + le16s(tokens));
  check_error(open(version), version, {"unsupported llm.c token file version 2"});

  const std::string negative = dir.file("negative.bin");
  dump(negative, llmc_header(20240520, 1, -5) + le16s(tokens));
  check_error(open(negative), negative, {"negative token count -5"});

  const std::string magic = dir.file("magic.bin");
  dump(magic, llmc_header(20240521, 1, n) + le16s(tokens));
  check_error(open(magic), magic, {"bad magic 20240521", "layout of an llm.c token file"});

  const std::string model = dir.file("model.bin");
  dump(model, llmc_header(20240326, 3, n) + le16s(tokens));
  check_error(open(model), model, {"bad magic 20240326", "model checkpoint"});

  // Out of range: the value, its index, its byte offset and the limit are named.
  const std::string range = dir.file("range.bin");
  auto big = tokens;
  big[123] = 60000;
  dump(range, le16s(big));
  check_error(TokenCorpus::open_tokens(range, 50257, 65, " (vocab_size)"), range,
              {"token 60000 at index 123 (byte offset 246)", "< 50257 (vocab_size)"});
  const std::string range_llmc = dir.file("range_llmc.bin");
  dump(range_llmc, llmc_header(20240520, 1, n) + le16s(big));
  check_error(TokenCorpus::open_tokens(range_llmc, 50257, 65), range_llmc,
              {"token 60000 at index 123 (byte offset 1270)"});
  // The limit is exclusive: 50256 is the largest id allowed by 50257, and not by 50256.
  const std::string edge = dir.file("edge.bin");
  dump(edge, le16s(tokens));
  CHECK(TokenCorpus::open_tokens(edge, 50257, 65).ok());
  check_error(TokenCorpus::open_tokens(edge, 50256, 65), edge,
              {"token 50256 at index " + std::to_string(tokens.size() - 1)});
}

TEST_CASE("a file that shrinks, grows or changes after open is an error naming it, not SIGBUS") {
  TempDir dir;
  const auto tokens = sample_tokens();
  const std::string raw = dir.file("raw.bin"), text = dir.file("t.txt");
  std::vector<int32_t> some(50);
  auto fails = [](const TokenCorpus& c, size_t offset, std::span<int32_t> out,
                  const std::string& part) {
    try {
      c.copy(offset, out);
      FAIL("copy succeeded");
    } catch (const std::runtime_error& e) {
      MESSAGE(std::string(e.what()));
      CHECK(std::string(e.what()).find(c.path() + ": " + part) != std::string::npos);
    }
  };
  SUBCASE("shrinks: reading past the new end (a memory map would raise SIGBUS)") {
    dump(raw, le16s(tokens));
    auto c = TokenCorpus::open_tokens(raw, 50257, 10);
    REQUIRE(c.ok());
    std::filesystem::resize_file(raw, 100);
    fails(*c, 250, some, "changed while in use (604 bytes when opened, 100 now)");
  }
  SUBCASE("grows") {
    dump(text, std::string(400, 'a'));
    auto c = TokenCorpus::open_text(text, 10);
    REQUIRE(c.ok());
    dump(text, std::string(500, 'a'));
    fails(*c, 0, some, "changed while in use (400 bytes when opened, 500 now)");
  }
  SUBCASE("rewritten in place with the same size") {
    dump(raw, le16s(tokens));
    auto c = TokenCorpus::open_tokens(raw, 50257, 10);
    REQUIRE(c.ok());
    std::vector<uint16_t> other(tokens.size(), 60000);  // ids the file was not validated with
    dump(raw, le16s(other));
    // the write's time may fall in the clock tick of the first one: make it later
    std::filesystem::last_write_time(
        raw, std::filesystem::last_write_time(raw) + std::chrono::seconds(1));
    fails(*c, 0, some, "changed while in use (604 bytes when opened, 604 now, modified since)");
  }
  SUBCASE("a file as it was opened reads on") {
    dump(raw, le16s(tokens));
    auto c = TokenCorpus::open_tokens(raw, 50257, 10);
    REQUIRE(c.ok());
    c->copy(250, some);
    CHECK(some[0] == tokens[250]);
  }
}

TEST_CASE("validation reads a large file in pieces: an error deep in it names its offset") {
  TempDir dir;
  // 3 MiB of text, one bad byte past the second piece; a 3-byte character cut by the first
  // piece's end is valid
  std::string t((3u << 20) + 10, 'x');
  const size_t cut = (1u << 20) - 1;
  t.replace(cut, 3, "\xe2\x82\xac");  // U+20AC, bytes 1048575..1048577
  t[(2u << 20) + 5] = '\xff';
  dump(dir.file("big.txt"), t);
  check_error(TokenCorpus::open_text(dir.file("big.txt"), 10), dir.file("big.txt"),
              {"invalid UTF-8 at byte offset 2097157 (byte 0xff)"});
  t[(2u << 20) + 5] = 'y';
  dump(dir.file("big.txt"), t);
  auto ok = TokenCorpus::open_text(dir.file("big.txt"), 10);
  REQUIRE_MESSAGE(ok.ok(), (ok.ok() ? "" : ok.error().message));
  CHECK(ok->size() == t.size());
  // a token file: an id out of range in the third piece
  std::vector<uint16_t> many((3u << 20) / 2 + 7, 5);
  many[(2u << 20) / 2 + 3] = 60000;
  dump(dir.file("big.bin"), le16s(many));
  check_error(TokenCorpus::open_tokens(dir.file("big.bin"), 50257, 10), dir.file("big.bin"),
              {"token 60000 at index 1048579 (byte offset 2097158) is out of range"});
}
