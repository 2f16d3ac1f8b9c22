// TokenCorpus: a whole token file, memory-mapped and validated once: UTF-8 text read byte by
// byte (vocab 256), or uint16 tokens, raw (nanoGPT .bin) or behind the llm.c 1024-byte header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/expected.hpp"
#include "engine/utf8.hpp"  // find_invalid_utf8, which open_text uses

namespace actorpipe {

/// llm.c token file header: 256 little-endian int32; [0] magic, [1] version, [2] token count.
inline constexpr int32_t kLlmcTokenMagic = 20240520;
inline constexpr int32_t kLlmcTokenVersion = 1;  // uint16 tokens (version 2 = uint32, unsupported)
inline constexpr size_t kLlmcHeaderBytes = 256 * 4;

enum class TokenFileLayout : uint8_t {
  raw,   // flat little-endian uint16 array (nanoGPT train.bin / val.bin)
  llmc,  // llm.c: kLlmcHeaderBytes header, then the uint16 tokens
};

/// An open regular file read at offsets (pread), never mapped: a file that shrinks under a
/// reader gives an error naming it, not SIGBUS. It remembers the file's size, modification time
/// and inode at open and notices when any of them changes. Move-only.
class DataFile {
 public:
  /// Errors: "<path>: cannot open: <reason>", not a regular file.
  static Expected<DataFile> open(const std::string& path);
  DataFile(DataFile&& other) noexcept;
  DataFile& operator=(DataFile&& other) noexcept;
  DataFile(const DataFile&) = delete;
  DataFile& operator=(const DataFile&) = delete;
  ~DataFile();
  /// The size at open.
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  /// Reads out.size() bytes at `offset`. Errors: the file changed since open (size,
  /// modification time or inode: "<path>: changed while in use ..."), a short or failed read
  /// (naming the offset).
  Status read(uint64_t offset, std::span<uint8_t> out) const;

 private:
  DataFile() = default;
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  int64_t mtime_ns_ = 0;
  uint64_t inode_ = 0;
};

/// The tokens of one file, validated once at open and read from the file as they are needed
/// (the file is not kept in memory).
class TokenCorpus {
 public:
  /// A UTF-8 text file; token i = byte i (0..255). Errors: missing, empty, invalid UTF-8 (with
  /// the byte offset), fewer than min_tokens bytes.
  static Expected<TokenCorpus> open_text(const std::string& path, size_t min_tokens);
  /// A uint16 token file, raw or llm.c (detected by the magic in the first int32). Every token
  /// must be < id_limit; `limit_note` is appended to that error (e.g. why the limit is what it
  /// is). Errors: missing, empty, odd size, truncated header or body, trailing bytes, bad magic,
  /// unsupported version, fewer than min_tokens tokens, token out of range (value, index, limit).
  static Expected<TokenCorpus> open_tokens(const std::string& path, int64_t id_limit,
                                           size_t min_tokens, std::string_view limit_note = {});

  size_t size() const { return count_; }
  /// Token i. Throws std::runtime_error as copy() does.
  int32_t operator[](size_t i) const;
  /// Copies tokens [offset, offset + out.size()) into out. Throws std::runtime_error naming the
  /// file when it changed since open (it was validated as it was then) or cannot be read, and
  /// when a token read is out of range.
  void copy(size_t offset, std::span<int32_t> out) const;
  const std::string& path() const { return file_.path(); }
  /// "utf-8 text", "uint16 raw" or "uint16 llm.c v1".
  std::string_view format() const { return format_; }
  std::optional<TokenFileLayout> layout() const { return layout_; }

 private:
  explicit TokenCorpus(DataFile file) : file_(std::move(file)) {}
  DataFile file_;
  uint64_t header_ = 0;   // byte offset of the first token
  int64_t id_limit_ = 0;  // every token is < id_limit_
  size_t count_ = 0;
  int width_ = 1;  // bytes per token
  std::string_view format_;
  std::optional<TokenFileLayout> layout_;
};

/// Writes tokens as a uint16 file in the given layout (little-endian). Errors name the path.
Status write_token_file(const std::string& path, std::span<const uint16_t> tokens,
                        TokenFileLayout layout);

/// Byte-level tokenizer: one token per byte of the UTF-8 string, ids 0..255.
std::vector<int32_t> byte_encode(std::string_view text);
/// Inverse of byte_encode; every id must be in [0, 256).
std::string byte_decode(std::span<const int32_t> tokens);

}  // namespace actorpipe
