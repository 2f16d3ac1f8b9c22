// TokenCorpus and DataFile: token files read at offsets (UTF-8 text, raw uint16, llm.c uint16),
// with every format error reported as a value naming the file and the problem.
#include "engine/data/token_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

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

// ---- DataFile ----

namespace {

int64_t mtime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

constexpr size_t kScanChunk = size_t{1} << 20;  // validation reads the file in 1 MiB pieces

}  // namespace

Expected<DataFile> DataFile::open(const std::string& path) {
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
  DataFile f;
  f.path_ = path;
  f.fd_ = fd;
  f.size_ = static_cast<uint64_t>(st.st_size);
  f.mtime_ns_ = mtime_ns(st);
  f.inode_ = static_cast<uint64_t>(st.st_ino);
  return f;
}

DataFile::DataFile(DataFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      size_(other.size_),
      mtime_ns_(other.mtime_ns_),
      inode_(other.inode_) {}

DataFile& DataFile::operator=(DataFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
    mtime_ns_ = other.mtime_ns_;
    inode_ = other.inode_;
  }
  return *this;
}

DataFile::~DataFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status DataFile::read(uint64_t offset, std::span<uint8_t> out) const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return make_error("{}: cannot stat: {}", path_, std::strerror(errno));
  const uint64_t now_size = static_cast<uint64_t>(st.st_size);
  if (now_size != size_ || mtime_ns(st) != mtime_ns_ ||
      static_cast<uint64_t>(st.st_ino) != inode_) {
    return make_error(
        "{}: changed while in use ({} bytes when opened, {} now{}): the data must stay as it was "
        "when the run opened it (write a new file and start or resume a run on it)",
        path_, size_, now_size, now_size == size_ ? ", modified since" : "");
  }
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n =
        ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return make_error("{}: read at byte offset {} failed: {}", path_, offset + done,
                        std::strerror(errno));
    }
    if (n == 0) {
      return make_error(
          "{}: short read at byte offset {}: the file ends there (it was {} bytes "
          "when opened)",
          path_, offset + done, size_);
    }
    done += static_cast<size_t>(n);
  }
  return {};
}

// ---- TokenCorpus ----

Expected<TokenCorpus> TokenCorpus::open_text(const std::string& path, size_t min_tokens) {
  auto file = DataFile::open(path);
  if (!file) return file.error();
  const uint64_t size = file->size();
  if (size == 0) return make_error("{}: empty file (0 bytes)", path);
  // validated piece by piece; a sequence cut by the end of a piece starts the next one
  std::vector<uint8_t> buf(static_cast<size_t>(std::min<uint64_t>(size, kScanChunk)));
  for (uint64_t pos = 0; pos < size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - pos));
    if (Status ok = file->read(pos, std::span(buf.data(), n)); !ok) return ok.error();
    const auto bad = find_invalid_utf8(std::span<const uint8_t>(buf.data(), n));
    if (!bad) {
      pos += n;
    } else if (pos + n<size&& * bad + 4> n && *bad > 0) {
      pos += *bad;
    } else {
      return make_error(
          "{}: invalid UTF-8 at byte offset {} (byte {:#04x}): a text source must be UTF-8 (for a "
          "binary uint16 token file use data.kind = \"tokens\")",
          path, pos + *bad, buf[*bad]);
    }
  }
  if (size < min_tokens) {
    return make_error("{}: truncated: {} bytes (tokens), fewer than the {} one sequence needs",
                      path, size, min_tokens);
  }
  TokenCorpus c(std::move(*file));
  c.header_ = 0;
  c.count_ = static_cast<size_t>(size);
  c.width_ = 1;
  c.id_limit_ = 256;
  c.format_ = "utf-8 text";
  return c;
}

Expected<TokenCorpus> TokenCorpus::open_tokens(const std::string& path, int64_t id_limit,
                                               size_t min_tokens, std::string_view limit_note) {
  auto file = DataFile::open(path);
  if (!file) return file.error();
  const size_t size = static_cast<size_t>(file->size());
  if (size == 0) return make_error("{}: empty file (0 bytes)", path);
  // the first bytes: an llm.c header, when there is one
  std::vector<uint8_t> head(std::min(size, kLlmcHeaderBytes));
  if (Status ok = file->read(0, head); !ok) return ok.error();
  const uint8_t* first = head.data();

  size_t header = 0;
  size_t count = 0;
  const int32_t magic = size >= 4 ? load_le32(first) : 0;
  if (magic == kLlmcTokenMagic) {
    if (size < kLlmcHeaderBytes) {
      return make_error("{}: truncated llm.c header: {} bytes, the header needs {}", path, size,
                        kLlmcHeaderBytes);
    }
    const int32_t version = load_le32(first + 4);
    if (version != kLlmcTokenVersion) {
      return make_error(
          "{}: unsupported llm.c token file version {} (supported: {} = uint16 tokens)", path,
          version, kLlmcTokenVersion);
    }
    const int32_t declared = load_le32(first + 8);
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
    if (size >= kLlmcHeaderBytes && load_le32(first + 4) == kLlmcTokenVersion) {
      const int32_t declared = load_le32(first + 8);
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
  std::vector<uint8_t> buf(std::min<size_t>(2 * count, kScanChunk));
  for (size_t i0 = 0; i0 < count;) {
    const size_t n = std::min(count - i0, buf.size() / 2);
    if (Status ok = file->read(header + 2 * i0, std::span(buf.data(), 2 * n)); !ok)
      return ok.error();
    for (size_t k = 0; k < n; ++k) {
      const uint16_t v = load_le16(buf.data() + 2 * k);
      if (v >= id_limit) {
        const size_t i = i0 + k;
        return make_error(
            "{}: token {} at index {} (byte offset {}) is out of range: ids must be < {}{}", path,
            v, i, header + 2 * i, id_limit, limit_note);
      }
    }
    i0 += n;
  }
  TokenCorpus c(std::move(*file));
  c.header_ = header;
  c.id_limit_ = id_limit;
  c.count_ = count;
  c.width_ = 2;
  c.layout_ = header == 0 ? TokenFileLayout::raw : TokenFileLayout::llmc;
  c.format_ = header == 0 ? "uint16 raw" : "uint16 llm.c v1";
  return c;
}

int32_t TokenCorpus::operator[](size_t i) const {
  int32_t v = 0;
  copy(i, std::span(&v, 1));
  return v;
}

void TokenCorpus::copy(size_t offset, std::span<int32_t> out) const {
  AP_CHECK(offset + out.size() <= count_, "tokens [{}, {}) of {}", offset, offset + out.size(),
           count_);
  thread_local std::vector<uint8_t> buf;
  buf.resize(out.size() * static_cast<size_t>(width_));
  Status ok = file_.read(header_ + offset * static_cast<uint64_t>(width_), buf);
  if (!ok) throw std::runtime_error(ok.error().message);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = width_ == 1 ? buf[i] : load_le16(buf.data() + 2 * i);
    if (out[i] >= id_limit_) {
      throw std::runtime_error(fmt::format(
          "{}: token {} at index {} is out of range (ids must be < {}): the file changed since "
          "it was validated",
          file_.path(), out[i], offset + i, id_limit_));
    }
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
