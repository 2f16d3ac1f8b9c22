// File I/O helpers for durable writes: whole-buffer writes, fsync of files and directories,
// atomic replace via a temporary name, and the CRC-32 used to checksum checkpoint files.
#include "engine/internal/file_io.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

namespace actorpipe::internal {

namespace fs = std::filesystem;

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

Status Fd::close(const std::string& path) {
  if (fd_ < 0) return {};
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) return make_error("{}: close failed: {}", path, errno_text());
  return {};
}

std::string errno_text() {
  return std::strerror(errno);
}

Status write_all(int fd, const void* data, std::size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return make_error("{}: write failed: {}", path, errno_text());
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return {};
}

Status read_exact(int fd, void* data, std::size_t n, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return make_error("{}: read failed at byte {}: {}", path, offset, errno_text());
    }
    if (r == 0) return make_error("{}: unexpected end of file at byte {}", path, offset);
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return {};
}

Status fsync_dir(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return make_error("{}: cannot open directory for fsync: {}", dir, errno_text());
  if (::fsync(fd.get()) != 0)
    return make_error("{}: fsync of directory failed: {}", dir, errno_text());
  return fd.close(dir);
}

std::string parent_dir(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string temp_sibling(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return fmt::format("{}.tmp-{}-{}", p, static_cast<long>(::getpid()), counter.fetch_add(1));
}

std::vector<std::string> remove_stale_temporaries(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    // "<name>.tmp-<pid>-<counter>", pid and counter decimal
    const size_t at = name.rfind(".tmp-");
    if (at == std::string::npos || at == 0) continue;
    const std::string rest = name.substr(at + 5);
    const size_t dash = rest.find('-');
    if (dash == std::string::npos || dash == 0 || dash + 1 == rest.size()) continue;
    const std::string pid_text = rest.substr(0, dash), count_text = rest.substr(dash + 1);
    auto digits = [](const std::string& s) {
      return s.size() <= 18 &&
             std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    if (!digits(pid_text) || !digits(count_text)) continue;
    const long long pid = std::stoll(pid_text);
    if (pid <= 0 || pid > std::numeric_limits<pid_t>::max() || pid == ::getpid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive, or not ours
    std::error_code rm;
    fs::remove_all(it->path(), rm);
    if (!rm) removed.push_back(it->path().string());
  }
  return removed;
}

Status write_file_atomic(const std::string& path, std::string_view content) {
  const std::string tmp = temp_sibling(path);
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.valid()) return make_error("{}: cannot create: {}", tmp, errno_text());
  auto fail = [&](Error e) -> Status {
    fd = Fd();
    ::unlink(tmp.c_str());
    return e;
  };
  if (auto s = write_all(fd.get(), content.data(), content.size(), tmp); !s) return fail(s.error());
  if (::fsync(fd.get()) != 0) return fail(make_error("{}: fsync failed: {}", tmp, errno_text()));
  if (auto s = fd.close(tmp); !s) return fail(s.error());
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return fail(make_error("{}: cannot rename {} into place: {}", path, tmp, errno_text()));
  }
  return fsync_dir(parent_dir(path));
}

Expected<std::string> read_file(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return make_error("{}: cannot open: {}", path, errno_text());
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return make_error("{}: cannot stat: {}", path, errno_text());
  if (!S_ISREG(st.st_mode)) return make_error("{}: not a regular file", path);
  std::string out(static_cast<std::size_t>(st.st_size), '\0');
  if (auto s = read_exact(fd.get(), out.data(), out.size(), 0, path); !s) return s.error();
  return out;
}

namespace {

std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  return t;
}

}  // namespace

uint32_t crc32(const void* data, std::size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = make_crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (std::size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
  return ~c;
}

Expected<uint32_t> crc32_file(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return make_error("{}: cannot open: {}", path, errno_text());
  std::vector<char> buf(1 << 20);
  uint32_t crc = 0;
  for (;;) {
    ssize_t r = ::read(fd.get(), buf.data(), buf.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      return make_error("{}: read failed: {}", path, errno_text());
    }
    if (r == 0) break;
    crc = crc32(buf.data(), static_cast<std::size_t>(r), crc);
  }
  return crc;
}

}  // namespace actorpipe::internal
