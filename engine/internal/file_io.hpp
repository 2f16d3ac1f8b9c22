// File I/O helpers for durable writes: whole-buffer writes, fsync of files and directories,
// atomic replace via a temporary name, and the CRC-32 used to checksum checkpoint files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/expected.hpp"

namespace actorpipe::internal {

/// An open file descriptor closed on destruction.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept;
  ~Fd();
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  /// Gives up ownership: the descriptor is returned and no longer closed by this object.
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  /// Closes now and reports a failure of close(2) (which can report delayed write errors).
  Status close(const std::string& path);

 private:
  int fd_;
};

/// The text of the current errno, e.g. "No such file or directory".
std::string errno_text();

/// Writes all `n` bytes (retrying short writes and EINTR).
Status write_all(int fd, const void* data, std::size_t n, const std::string& path);

/// Reads exactly `n` bytes at `offset`; a short read is an error naming the file.
Status read_exact(int fd, void* data, std::size_t n, uint64_t offset, const std::string& path);

/// fsync(2) of a directory, making a rename or create inside it durable.
Status fsync_dir(const std::string& dir);

/// The directory part of a path ("." when there is none).
std::string parent_dir(const std::string& path);

/// A name for a temporary sibling of `path`, unique within this process and between processes:
/// "<path>.tmp-<pid>-<counter>".
std::string temp_sibling(const std::string& path);

/// Removes every entry of `dir` named like a temp_sibling ("<name>.tmp-<pid>-<counter>") whose
/// process no longer exists: what a writer killed mid-write left behind. Temporaries of live
/// processes (this one included) stay. Returns the paths removed; unreadable directories and
/// entries that cannot be removed are passed over (the next save tries again).
std::vector<std::string> remove_stale_temporaries(const std::string& dir);

/// Writes `content` to a temporary sibling of `path`, fsyncs it, renames it over `path` and
/// fsyncs the directory.
Status write_file_atomic(const std::string& path, std::string_view content);

/// Reads a whole file.
Expected<std::string> read_file(const std::string& path);

/// CRC-32 (IEEE 802.3, the zlib/PNG polynomial; Python: zlib.crc32), continuing from `crc`.
uint32_t crc32(const void* data, std::size_t n, uint32_t crc = 0);

/// CRC-32 of a whole file.
Expected<uint32_t> crc32_file(const std::string& path);

}  // namespace actorpipe::internal
