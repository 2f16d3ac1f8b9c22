// Checkpoint directory: the lock file (flock, released by the kernel when its holder ends) and the
// checks a run makes on the directory before it trains.
#include "engine/checkpoint/checkpoint_dir.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <filesystem>
#include <system_error>

#include "engine/internal/file_io.hpp"

namespace actorpipe {
namespace {

namespace fs = std::filesystem;
using internal::errno_text;

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string mib(uint64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

}  // namespace

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

CheckpointDirLock::CheckpointDirLock(CheckpointDirLock&& other) noexcept
    : fd_(other.fd_), dir_(std::move(other.dir_)) {
  other.fd_ = -1;
}

CheckpointDirLock& CheckpointDirLock::operator=(CheckpointDirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    dir_ = std::move(other.dir_);
    other.fd_ = -1;
  }
  return *this;
}

Expected<CheckpointDirLock> CheckpointDirLock::acquire(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return make_error("checkpoint.dir = \"{}\": cannot create it: {}", dir, ec.message());
  const std::string path = (fs::path(dir) / kCheckpointLockFile).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return make_error("checkpoint.dir = \"{}\": cannot open its lock file {}: {}", dir, path,
                      errno_text());
  }
  internal::Fd guard(fd);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) {
      return make_error("checkpoint.dir = \"{}\": cannot lock {}: {}", dir, path, errno_text());
    }
    auto holder = internal::read_file(path);
    std::string who = holder && !holder->empty() ? *holder : std::string("an unknown process");
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    return make_error(
        "checkpoint.dir = \"{}\" is in use by another run ({}); give this run its own "
        "directory, or stop that run first",
        dir, who);
  }
  const std::string text = fmt::format("pid {} on host {} since {}\n",
                                       static_cast<long>(::getpid()), host_name(), utc_now());
  if (::ftruncate(fd, 0) != 0) {
    return make_error("checkpoint.dir = \"{}\": cannot write its lock file {}: {}", dir, path,
                      errno_text());
  }
  if (Status ok = internal::write_all(fd, text.data(), text.size(), path); !ok) {
    return make_error("checkpoint.dir = \"{}\": {}", dir, ok.error().message);
  }
  CheckpointDirLock lock;
  lock.fd_ = guard.release();
  lock.dir_ = dir;
  return lock;
}

Expected<CheckpointDirLock> prepare_checkpoint_dir(const CheckpointDirPlan& plan) {
  const std::string& dir = plan.dir;
  if (dir.empty()) return make_error("checkpoint.dir: empty (no directory to prepare)");
  auto lock = CheckpointDirLock::acquire(dir);
  if (!lock) return lock.error();

  // a test write: what the first checkpoint would find, found now
  const std::string probe = internal::temp_sibling((fs::path(dir) / ".write-test").string());
  {
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      return make_error("checkpoint.dir = \"{}\": not writable (creating {} failed: {})", dir,
                        probe, errno_text());
    }
    internal::Fd f(fd);
    const char byte = 0;
    Status ok = internal::write_all(fd, &byte, 1, probe);
    if (ok) ok = f.close(probe);
    ::unlink(probe.c_str());
    if (!ok)
      return make_error("checkpoint.dir = \"{}\": not writable: {}", dir, ok.error().message);
  }

  const std::vector<std::string> found = checkpoints_in(dir);
  if (!found.empty() && !plan.resuming_here) {
    const std::string names = fmt::format("{}", fmt::join(found, ", "));
    if (!plan.overwrite) {
      return make_error(
          "checkpoint.dir = \"{}\" holds checkpoints of another run ({}); resume from them "
          "(checkpoint.resume = \"{}\"), choose another directory, or set "
          "checkpoint.overwrite = true to remove them",
          dir, names, dir);
    }
    for (const std::string& name : found) {
      std::error_code ec;
      fs::remove_all(fs::path(dir) / name, ec);
      if (ec) {
        return make_error("checkpoint.dir = \"{}\": checkpoint.overwrite could not remove {}: {}",
                          dir, name, ec.message());
      }
    }
  }

  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) == 0) {
    const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (free_bytes < plan.checkpoint_bytes) {
      return make_error(
          "checkpoint.dir = \"{}\": {} free on its file system, a checkpoint of this run needs "
          "{}",
          dir, mib(free_bytes), mib(plan.checkpoint_bytes));
    }
  }
  return lock;
}

}  // namespace actorpipe
