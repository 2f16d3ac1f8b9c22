// What the harnesses share: a check that stops the run (libFuzzer keeps the input that failed
// it) and an in-memory file for the readers that take a path.
#pragma once

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace actorpipe::fuzz {

/// The bytes of a fuzz input as text.
inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// Stops the run with `what` when `cond` is false: a property of the parser does not hold.
#define FUZZ_CHECK(cond, ...)                                                               \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s: %s\n", __FILE__, __LINE__, #cond, \
                   ::fmt::format(__VA_ARGS__).c_str());                                     \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

/// A regular file that lives in memory (memfd), reachable by path as /proc/self/fd/<n>, so the
/// readers open, stat and pread it as any file without touching a disk.
class MemFile {
 public:
  MemFile() : fd_(::memfd_create("actorpipe-fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path_ = fmt::format("/proc/self/fd/{}", fd_);
  }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  ~MemFile() { ::close(fd_); }

  /// Makes the file hold exactly these bytes.
  void assign(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0) std::abort();
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
  }
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace actorpipe::fuzz
