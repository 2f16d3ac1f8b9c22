// Safetensors tests: round trips, the exact byte layout the Python implementation uses, and one
// rejection (with its reason named) for every kind of corrupt file.
#include "engine/checkpoint/safetensors.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>

#include "tests/support/files.hpp"
#include "tests/support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return s;
}

// A file with the given JSON header (unpadded) followed by `data`.
std::string make_file(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

std::string floats(std::initializer_list<float> xs) {
  std::string s;
  for (float x : xs) {
    char b[4];
    std::memcpy(b, &x, 4);
    s.append(b, 4);
  }
  return s;
}

// Writes `bytes` to a file and returns the reader's error message (fails the test if it reads).
std::string reject(const TempDir& dir, const std::string& bytes) {
  const std::string p = dir.file("bad.safetensors");
  dump(p, bytes);
  auto r = read_safetensors(p);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find(p) != std::string::npos);  // every error names the file
  return r.error().message;
}

const std::string kOneTensor = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

}  // namespace

TEST_CASE("round trip of F32, I32, scalar and empty tensors with metadata") {
  TempDir dir;
  const std::string p = dir.file("m.safetensors");
  std::vector<float> w(2 * 3 * 5);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.25f * static_cast<float>(i) - 3.0f;
  w[7] = -0.0f;
  w[8] = std::numeric_limits<float>::denorm_min();
  std::vector<int32_t> ids = {7, -1, 2147483647, -2147483647 - 1};
  float scalar = 3.5f;
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", "12"}, {"ü", "ñ"}};
  REQUIRE(write_safetensors(p,
                            {{"layers.0.w", {2, 3, 5}, w.data()},
                             {.name = "ids", .shape = {4}, .i32 = ids.data()},
                             {"s", {}, &scalar},
                             {"empty", {0, 3}, nullptr}},
                            meta)
              .ok());
  auto r = read_safetensors(p);
  REQUIRE(r.ok());
  REQUIRE(r->size() == 4);
  // Returned in the order written (the order of the data offsets).
  CHECK((*r)[0].name == "layers.0.w");
  CHECK((*r)[1].name == "ids");
  CHECK((*r)[2].name == "s");
  CHECK((*r)[3].name == "empty");
  const NamedTensor* t = find_tensor(*r, "layers.0.w");
  REQUIRE(t);
  CHECK(t->dtype == "F32");
  CHECK(t->shape == std::vector<int64_t>{2, 3, 5});
  CHECK(t->numel() == 30);
  REQUIRE(t->f32.size() == w.size());
  CHECK(std::memcmp(t->f32.data(), w.data(), w.size() * 4) == 0);  // bitwise, incl. -0 and denormal
  CHECK(t->i32.empty());
  t = find_tensor(*r, "ids");
  REQUIRE(t);
  CHECK(t->dtype == "I32");
  CHECK(t->i32 == ids);
  t = find_tensor(*r, "s");
  REQUIRE(t);
  CHECK(t->shape.empty());
  CHECK(t->numel() == 1);
  CHECK(t->f32 == std::vector<float>{3.5f});
  t = find_tensor(*r, "empty");
  REQUIRE(t);
  CHECK(t->shape == std::vector<int64_t>{0, 3});
  CHECK(t->f32.empty());
  CHECK(find_tensor(*r, "nope") == nullptr);
  auto m = read_safetensors_metadata(p);
  REQUIRE(m.ok());
  CHECK(*m == meta);
  // Data section starts 8-byte aligned.
  const std::string bytes = slurp(p);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  CHECK(n % 8 == 0);
  CHECK(bytes.size() == 8 + n + 30 * 4 + 4 * 4 + 4);
}

TEST_CASE("byte layout equals the Python safetensors layout") {
  TempDir dir;
  const std::string p = dir.file("x.safetensors");
  std::vector<float> a = {1.0f, -2.0f};
  REQUIRE(write_safetensors(p, {{"a", {2}, a.data()}}, {{"k", "v"}}).ok());
  // What safetensors.torch.save_file({"a": torch.tensor([1., -2.])}, p, {"k": "v"}) writes:
  // the header JSON without spaces, "__metadata__" first, dtype/shape/data_offsets in that order,
  // padded with spaces to a multiple of 8, then little-endian float32 data.
  const std::string header =
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  REQUIRE(header.size() == 79);  // padded to 80
  const unsigned char expected_prefix[8] = {80, 0, 0, 0, 0, 0, 0, 0};
  const unsigned char expected_data[8] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0};
  std::string expected(reinterpret_cast<const char*>(expected_prefix), 8);
  expected += header + " ";
  expected.append(reinterpret_cast<const char*>(expected_data), 8);
  CHECK(slurp(p) == expected);
}

TEST_CASE("reads a hand-made file with another key order, padding and no metadata") {
  TempDir dir;
  // Tensors listed out of data order, fields in another order, trailing spaces (Python pads).
  const std::string header = R"({"b":{"data_offsets":[8,12],"shape":[1,1],"dtype":"I32"},)"
                             R"("a":{"shape":[2],"dtype":"F32","data_offsets":[0,8]}})"
                             "      ";
  std::string data = floats({0.5f, -1.5f});
  data += std::string("\x2a\x00\x00\x00", 4);  // int32 42
  const std::string p = dir.file("h.safetensors");
  dump(p, make_file(header, data));
  auto r = read_safetensors(p);
  REQUIRE(r.ok());
  REQUIRE(r->size() == 2);
  CHECK((*r)[0].name == "a");
  CHECK((*r)[0].f32 == std::vector<float>{0.5f, -1.5f});
  CHECK((*r)[1].name == "b");
  CHECK((*r)[1].shape == std::vector<int64_t>{1, 1});
  CHECK((*r)[1].i32 == std::vector<int32_t>{42});
  auto m = read_safetensors_metadata(p);
  REQUIRE(m.ok());
  CHECK(m->empty());
  // An empty file of tensors is valid too.
  dump(p, make_file("{}", ""));
  auto e = read_safetensors(p);
  REQUIRE(e.ok());
  CHECK(e->empty());
}

TEST_CASE("every corruption is rejected with its reason") {
  TempDir dir;
  const std::string d8 = floats({1.0f, 2.0f});
  auto entry = [](const std::string& body) { return R"({"a":)" + body + "}"; };

  SUBCASE("missing file") {
    auto r = read_safetensors(dir.file("absent.safetensors"));
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("absent.safetensors: cannot open") != std::string::npos);
  }
  SUBCASE("shorter than the length field") {
    CHECK(reject(dir, "abc").find("too short") != std::string::npos);
  }
  SUBCASE("header length beyond the file (truncated)") {
    std::string f = make_file(kOneTensor, d8);
    CHECK(reject(dir, f.substr(0, 40)).find("exceeds the") != std::string::npos);
  }
  SUBCASE("header length zero") {
    CHECK(reject(dir, le64(0) + d8).find("header length is 0") != std::string::npos);
  }
  SUBCASE("header length over the limit") {
    CHECK(reject(dir, le64(200'000'000) + d8).find("exceeds the limit") != std::string::npos);
  }
  SUBCASE("header does not start with a brace") {
    CHECK(reject(dir, make_file(" " + kOneTensor, d8)).find("does not start with '{'") !=
          std::string::npos);
  }
  SUBCASE("JSON syntax error") {
    std::string bad = kOneTensor;
    bad[5] = ';';
    CHECK(reject(dir, make_file(bad, d8)).find("not valid JSON") != std::string::npos);
  }
  SUBCASE("a number beyond a double is not JSON (it used to abort the reader)") {
    const std::string m = reject(
        dir, make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":1e400})", d8));
    CHECK(m.find("header is not valid JSON") != std::string::npos);
    CHECK(m.find("number overflow parsing '1e400'") != std::string::npos);
  }
  SUBCASE("NUL padding is not JSON") {
    CHECK(reject(dir, make_file(kOneTensor + std::string(2, '\0'), d8))
              .find("NUL byte at offset 54") != std::string::npos);
  }
  SUBCASE("entry is not an object") {
    CHECK(reject(dir, make_file(entry("[1,2]"), d8)).find("not an object") != std::string::npos);
  }
  SUBCASE("missing field") {
    auto m = reject(dir, make_file(entry(R"({"dtype":"F32","shape":[2]})"), d8));
    CHECK(m.find("missing field \"data_offsets\"") != std::string::npos);
  }
  SUBCASE("unknown field") {
    auto m = reject(
        dir, make_file(entry(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1})"), d8));
    CHECK(m.find("unknown field \"x\"") != std::string::npos);
  }
  SUBCASE("unsupported dtype") {
    auto m =
        reject(dir, make_file(entry(R"({"dtype":"BF16","shape":[4],"data_offsets":[0,8]})"), d8));
    CHECK(m.find("\"BF16\" is not supported (allowed: F32, I32)") != std::string::npos);
  }
  SUBCASE("unknown dtype") {
    auto m =
        reject(dir, make_file(entry(R"({"dtype":"F31","shape":[2],"data_offsets":[0,8]})"), d8));
    CHECK(m.find("\"F31\" is not a safetensors dtype") != std::string::npos);
  }
  SUBCASE("dtype not a string") {
    auto m = reject(dir, make_file(entry(R"({"dtype":4,"shape":[2],"data_offsets":[0,8]})"), d8));
    CHECK(m.find("dtype is 4, not a string") != std::string::npos);
  }
  SUBCASE("negative dimension") {
    auto m =
        reject(dir, make_file(entry(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"), d8));
    CHECK(m.find("shape [-2] contains -2") != std::string::npos);
  }
  SUBCASE("huge shape") {
    auto m = reject(dir, make_file(entry(R"({"dtype":"F32","shape":[4294967296,4294967296,16],)"
                                         R"("data_offsets":[0,8]})"),
                                   d8));
    CHECK(m.find("more than 2^60 elements") != std::string::npos);
  }
  SUBCASE("data_offsets of wrong length") {
    auto m = reject(dir, make_file(entry(R"({"dtype":"F32","shape":[2],"data_offsets":[0]})"), d8));
    CHECK(m.find("must have 2 entries") != std::string::npos);
  }
  SUBCASE("data_offsets begin after end") {
    auto m =
        reject(dir, make_file(entry(R"({"dtype":"F32","shape":[0],"data_offsets":[8,0]})"), d8));
    CHECK(m.find("begin > end") != std::string::npos);
  }
  SUBCASE("data_offsets beyond the data (truncated data)") {
    std::string f = make_file(kOneTensor, d8);
    CHECK(reject(dir, f.substr(0, f.size() - 3)).find("end beyond the 5 data bytes") !=
          std::string::npos);
  }
  SUBCASE("shape times dtype size differs from the byte span") {
    auto m = reject(
        dir, make_file(entry(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"), d8 + d8));
    CHECK(m.find("needs 12 bytes but data_offsets [0, 8] span 8") != std::string::npos);
  }
  SUBCASE("gap between tensors") {
    auto m = reject(dir, make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                   R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                                   d8 + d8.substr(0, 4)));
    CHECK(m.find("\"b\"") != std::string::npos);
    CHECK(m.find("leaves a gap at byte 4") != std::string::npos);
  }
  SUBCASE("overlapping tensors") {
    auto m = reject(dir, make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                   R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                   d8));
    CHECK(m.find("overlaps the previous tensor") != std::string::npos);
  }
  SUBCASE("trailing bytes after the last tensor") {
    CHECK(reject(dir, make_file(kOneTensor, d8 + "xyz")).find("trailing garbage") !=
          std::string::npos);
  }
  SUBCASE("duplicate tensor names") {
    auto m = reject(dir, make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                   R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                   d8));
    CHECK(m.find("duplicate key \"a\"") != std::string::npos);
  }
  SUBCASE("metadata value not a string") {
    auto m = reject(dir, make_file(R"({"__metadata__":{"step":3}})", ""));
    CHECK(m.find("metadata key \"step\" has value 3") != std::string::npos);
    const std::string p = dir.file("bad.safetensors");
    auto md = read_safetensors_metadata(p);
    REQUIRE_FALSE(md.ok());
    CHECK(md.error().message == m);
  }
}

TEST_CASE("the header must be a JSON object") {
  TempDir dir;
  CHECK(reject(dir, make_file("[1,2,3]", "")).find("does not start with '{'") != std::string::npos);
  CHECK(reject(dir, make_file("{\"a\":1", "")).find("not valid JSON") != std::string::npos);
}

TEST_CASE("the writer refuses bad input and leaves no temporary files") {
  TempDir dir;
  const std::string p = dir.file("w.safetensors");
  float x[2] = {1, 2};
  int32_t k[2] = {1, 2};
  auto message = [&](std::vector<TensorRef> ts) {
    auto s = write_safetensors(p, ts);
    REQUIRE_FALSE(s.ok());
    CHECK(s.error().message.find(p) != std::string::npos);
    return s.error().message;
  };
  CHECK(message({{"a", {2}, x}, {"a", {2}, x}}).find("duplicate tensor name \"a\"") !=
        std::string::npos);
  CHECK(message({{"", {2}, x}}).find("empty name") != std::string::npos);
  CHECK(message({{"__metadata__", {2}, x}}).find("reserved") != std::string::npos);
  CHECK(message({{"a", {2, -1}, x}}).find("negative dimension -1") != std::string::npos);
  CHECK(message({{"a", {2}, nullptr}}).find("no data pointer") != std::string::npos);
  CHECK(message({{"a", {2}, x, k}}).find("both") != std::string::npos);
  CHECK(message({{"bad\xff", {2}, x}}).find("UTF-8") != std::string::npos);
  CHECK_FALSE(fs::exists(p));

  // Overwriting replaces the file whole; nothing but the file is left in the directory.
  REQUIRE(write_safetensors(p, {{"a", {2}, x}}).ok());
  REQUIRE(write_safetensors(p, {{"b", {1}, x + 1}}, {{"v", "2"}}).ok());
  auto r = read_safetensors(p);
  REQUIRE(r.ok());
  REQUIRE(r->size() == 1);
  CHECK((*r)[0].name == "b");
  CHECK((*r)[0].f32 == std::vector<float>{2.0f});
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    CHECK(e.path().filename() == "w.safetensors");
    ++entries;
  }
  CHECK(entries == 1);

  // A directory that does not exist: the error names the temporary path in it.
  auto s = write_safetensors(dir.file("no/such/dir/x.safetensors"), {{"a", {2}, x}});
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().message.find("no/such/dir/x.safetensors") != std::string::npos);
  CHECK(s.error().message.find("cannot create") != std::string::npos);
}

TEST_CASE("in memory: the bytes of the file, and the same checks on reading them") {
  TempDir dir;
  const std::string p = dir.file("m.safetensors");
  std::vector<float> w = {1.0f, -0.0f, std::numeric_limits<float>::denorm_min(), 3.25f};
  std::vector<int32_t> ids = {5, -7};
  const std::vector<TensorRef> tensors = {{"layers.3.w", {2, 2}, w.data()},
                                          {.name = "ids", .shape = {2}, .i32 = ids.data()},
                                          {"empty", {0}, nullptr}};
  const std::map<std::string, std::string> meta = {{"model", "2"}};
  REQUIRE(write_safetensors(p, tensors, meta).ok());
  auto bytes = encode_safetensors(tensors, meta, "the test");
  REQUIRE(bytes.ok());
  const std::string file = slurp(p);
  REQUIRE(file.size() == bytes->size());
  CHECK(std::memcmp(file.data(), bytes->data(), file.size()) == 0);

  auto back = decode_safetensors(*bytes, "rank 1's layers");
  REQUIRE(back.ok());
  CHECK(back->metadata == meta);
  REQUIRE(back->tensors.size() == 3);
  CHECK(back->tensors[0].name == "layers.3.w");
  CHECK(back->tensors[0].shape == std::vector<int64_t>{2, 2});
  CHECK(std::memcmp(back->tensors[0].f32.data(), w.data(), w.size() * 4) == 0);
  CHECK(back->tensors[1].i32 == ids);
  CHECK(back->tensors[2].numel() == 0);

  // every corruption a file reader refuses, a buffer reader refuses too, naming the source
  auto refused = [](std::vector<std::byte> b) {
    auto r = decode_safetensors(b, "rank 1's layers");
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.rfind("rank 1's layers: ", 0) == 0);
    return r.error().message;
  };
  CHECK(refused({}).find("too short") != std::string::npos);
  std::vector<std::byte> cut(bytes->begin(), bytes->end() - 4);
  CHECK(refused(cut).find("truncated") != std::string::npos);
  std::vector<std::byte> longer = *bytes;
  longer.push_back(std::byte{0});
  CHECK(refused(longer).find("trailing garbage") != std::string::npos);
  std::vector<std::byte> huge = *bytes;
  huge[5] = std::byte{0x7f};  // a header length far beyond the buffer
  CHECK(refused(huge).find("exceeds") != std::string::npos);
  CHECK_FALSE(encode_safetensors({{"__x", {1}, w.data()}}, {}, "the test").ok());
}
