// TokenCorpus and MappedFile: memory-mapped token files (UTF-8 text, raw uint16, llm.c uint16),
// with every format error reported as a value naming the file and the problem.
#include "engine/data/token_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "kernels/check.hpp"

namespace actorpipe {
namespace {

uint16_t load_le16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (static_cast<unsigned>(p[1]) << 8));
}

int32_t load_le32(const uint8_t* p) {
  const uint32_t u = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                     (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
  return static_cast<int32_t>(u);
}

void store_le16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v & 0xff);
  p[1] = static_cast<uint8_t>(v >> 8);
}

void store_le32(uint8_t* p, int32_t v) {
  const auto u = static_cast<uint32_t>(v);
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>((u >> (8 * i)) & 0xff);
}

// Magics of the other llm.c files, which a token file must not be confused with.
const char* other_llmc_file(int32_t magic) {
  switch (magic) {
    case 20240326:
      return "model checkpoint";
    case 20240327:
      return "debug state";
    case 20240328:
      return "tokenizer";
    default:
      return nullptr;
  }
}

}  // namespace

// ---- MappedFile ----

Expected<MappedFile> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return make_error("{}: cannot stat: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error("{}: not a regular file", path);
  }
  MappedFile f;
  f.path_ = path;
  f.size_ = static_cast<size_t>(st.st_size);
  if (f.size_ > 0) {
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return make_error("{}: cannot map {} bytes: {}", path, f.size_, std::strerror(err));
    }
    f.data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return f;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

// ---- UTF-8 ----

std::optional<size_t> find_invalid_utf8(std::span<const uint8_t> b) {
  const size_t n = b.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t c = b[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    uint8_t lo = 0x80, hi = 0xbf;  // allowed range of the second byte (RFC 3629, section 4)
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;  // no overlong forms
      if (c == 0xed) hi = 0x9f;  // no surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;  // no overlong forms
      if (c == 0xf4) hi = 0x8f;  // nothing above U+10FFFF
    } else {
      return i;  // continuation byte without a lead, C0/C1 overlong leads, F5..FF
    }
    if (i + static_cast<size_t>(len) > n) return i;
    if (b[i + 1] < lo || b[i + 1] > hi) return i;
    for (int k = 2; k < len; ++k) {
      if (b[i + k] < 0x80 || b[i + k] > 0xbf) return i;
    }
    i += static_cast<size_t>(len);
  }
  return std::nullopt;
}

// ---- TokenCorpus ----

Expected<TokenCorpus> TokenCorpus::open_text(const std::string& path, size_t min_tokens) {
  auto file = MappedFile::open(path);
  if (!file) return file.error();
  const auto bytes = file->bytes();
  if (bytes.empty()) return make_error("{}: empty file (0 bytes)", path);
  if (const auto bad = find_invalid_utf8(bytes)) {
    return make_error(
        "{}: invalid UTF-8 at byte offset {} (byte {:#04x}): a text source must be UTF-8 (for a "
        "binary uint16 token file use data.kind = \"tokens\")",
        path, *bad, bytes[*bad]);
  }
  if (bytes.size() < min_tokens) {
    return make_error("{}: truncated: {} bytes (tokens), fewer than the {} one sequence needs",
                      path, bytes.size(), min_tokens);
  }
  TokenCorpus c(std::move(*file));
  c.base_ = c.file_.bytes().data();
  c.count_ = c.file_.bytes().size();
  c.width_ = 1;
  c.format_ = "utf-8 text";
  return c;
}

Expected<TokenCorpus> TokenCorpus::open_tokens(const std::string& path, int64_t id_limit,
                                               size_t min_tokens, std::string_view limit_note) {
  auto file = MappedFile::open(path);
  if (!file) return file.error();
  const auto bytes = file->bytes();
  const size_t size = bytes.size();
  if (size == 0) return make_error("{}: empty file (0 bytes)", path);

  size_t header = 0;
  size_t count = 0;
  const int32_t magic = size >= 4 ? load_le32(bytes.data()) : 0;
  if (magic == kLlmcTokenMagic) {
    if (size < kLlmcHeaderBytes) {
      return make_error("{}: truncated llm.c header: {} bytes, the header needs {}", path, size,
                        kLlmcHeaderBytes);
    }
    const int32_t version = load_le32(bytes.data() + 4);
    if (version != kLlmcTokenVersion) {
      return make_error(
          "{}: unsupported llm.c token file version {} (supported: {} = uint16 tokens)", path,
          version, kLlmcTokenVersion);
    }
    const int32_t declared = load_le32(bytes.data() + 8);
    if (declared < 0) {
      return make_error("{}: llm.c header declares a negative token count {}", path, declared);
    }
    const size_t body = size - kLlmcHeaderBytes;
    const size_t need = 2 * static_cast<size_t>(declared);
    if (need > body) {
      return make_error(
          "{}: truncated: the llm.c header declares {} tokens ({} bytes) but only {} bytes follow "
          "the header",
          path, declared, need, body);
    }
    if (need < body) {
      return make_error(
          "{}: size mismatch: the llm.c header declares {} tokens ({} bytes) but {} bytes follow "
          "the header ({} trailing)",
          path, declared, need, body, body - need);
    }
    header = kLlmcHeaderBytes;
    count = static_cast<size_t>(declared);
  } else {
    if (const char* what = other_llmc_file(magic)) {
      return make_error(
          "{}: bad magic {}: that is the magic of an llm.c {} file, not of a token file ({})", path,
          magic, what, kLlmcTokenMagic);
    }
    // The exact layout of an llm.c token file (version 1, matching count) with another magic is
    // a damaged header, not raw tokens.
    if (size >= kLlmcHeaderBytes && load_le32(bytes.data() + 4) == kLlmcTokenVersion) {
      const int32_t declared = load_le32(bytes.data() + 8);
      if (declared > 0 && size == kLlmcHeaderBytes + 2 * static_cast<size_t>(declared)) {
        return make_error(
            "{}: bad magic {}: the file has the layout of an llm.c token file (version 1, {} "
            "tokens) but its magic is not {}",
            path, magic, declared, kLlmcTokenMagic);
      }
    }
    if (size % 2 != 0) {
      return make_error(
          "{}: odd size {} bytes: a raw uint16 token file holds 2 bytes per token (truncated?)",
          path, size);
    }
    count = size / 2;
  }
  if (count < min_tokens) {
    return make_error("{}: truncated: {} tokens, fewer than the {} one sequence needs", path, count,
                      min_tokens);
  }
  const uint8_t* base = bytes.data() + header;
  for (size_t i = 0; i < count; ++i) {
    const uint16_t v = load_le16(base + 2 * i);
    if (v >= id_limit) {
      return make_error(
          "{}: token {} at index {} (byte offset {}) is out of range: ids must be < {}{}", path, v,
          i, header + 2 * i, id_limit, limit_note);
    }
  }
  TokenCorpus c(std::move(*file));
  c.base_ = c.file_.bytes().data() + header;
  c.count_ = count;
  c.width_ = 2;
  c.layout_ = header == 0 ? TokenFileLayout::raw : TokenFileLayout::llmc;
  c.format_ = header == 0 ? "uint16 raw" : "uint16 llm.c v1";
  return c;
}

int32_t TokenCorpus::operator[](size_t i) const {
  AP_CHECK(i < count_, "token {} of {}", i, count_);
  return width_ == 1 ? base_[i] : load_le16(base_ + 2 * i);
}

void TokenCorpus::copy(size_t offset, std::span<int32_t> out) const {
  AP_CHECK(offset + out.size() <= count_, "tokens [{}, {}) of {}", offset, offset + out.size(),
           count_);
  if (width_ == 1) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = base_[offset + i];
  } else {
    for (size_t i = 0; i < out.size(); ++i) out[i] = load_le16(base_ + 2 * (offset + i));
  }
}

// ---- writing ----

Status write_token_file(const std::string& path, std::span<const uint16_t> tokens,
                        TokenFileLayout layout) {
  const bool llmc = layout == TokenFileLayout::llmc;
  if (llmc && tokens.size() > static_cast<size_t>(INT32_MAX)) {
    return make_error("{}: {} tokens do not fit the int32 count of an llm.c header", path,
                      tokens.size());
  }
  std::vector<uint8_t> buf((llmc ? kLlmcHeaderBytes : 0) + 2 * tokens.size(), 0);
  uint8_t* p = buf.data();
  if (llmc) {
    store_le32(p, kLlmcTokenMagic);
    store_le32(p + 4, kLlmcTokenVersion);
    store_le32(p + 8, static_cast<int32_t>(tokens.size()));
    p += kLlmcHeaderBytes;
  }
  for (size_t i = 0; i < tokens.size(); ++i) store_le16(p + 2 * i, tokens[i]);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return make_error("{}: cannot create: {}", path, std::strerror(errno));
  const size_t written = std::fwrite(buf.data(), 1, buf.size(), f);
  const int write_err = errno;
  const int closed = std::fclose(f);
  const int close_err = errno;
  if (written != buf.size()) {
    return make_error("{}: write failed after {} of {} bytes: {}", path, written, buf.size(),
                      std::strerror(write_err));
  }
  if (closed != 0) return make_error("{}: cannot close: {}", path, std::strerror(close_err));
  return {};
}

// ---- byte tokenizer ----

std::vector<int32_t> byte_encode(std::string_view text) {
  std::vector<int32_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<uint8_t>(text[i]);
  return out;
}

std::string byte_decode(std::span<const int32_t> tokens) {
  std::string out(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    AP_CHECK(tokens[i] >= 0 && tokens[i] < 256, "byte token {} at index {}", tokens[i], i);
    out[i] = static_cast<char>(static_cast<uint8_t>(tokens[i]));
  }
  return out;
}

}  // namespace actorpipe
