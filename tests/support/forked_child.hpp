// Forked child processes for tests that need a second process without a second program: a
// Pipe carries lines between the test and its children, a Child runs a function in a fork and
// is killed and reaped when it leaves scope.
#pragma once

#include <doctest/doctest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>

namespace actorpipe::testing {

// A pipe carrying lines between a test and its child processes.
class Pipe {
 public:
  Pipe() { REQUIRE(::pipe(fd_) == 0); }
  ~Pipe() {
    ::close(fd_[0]);
    ::close(fd_[1]);
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;

  void write_line(const std::string& s) {
    const std::string line = s + "\n";
    size_t off = 0;
    while (off < line.size()) {
      const ssize_t n = ::write(fd_[1], line.data() + off, line.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
  }
  std::optional<std::string> read_line(std::chrono::steady_clock::duration limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (;;) {
      if (auto nl = buf_.find('\n'); nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{fd_[0], POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 100))) <= 0) continue;
      char b[4096];
      const ssize_t n = ::read(fd_[0], b, sizeof b);
      if (n <= 0) return std::nullopt;
      buf_.append(b, static_cast<size_t>(n));
    }
  }
  // The first line that starts with `prefix` within `limit` (others are dropped).
  std::optional<std::string> read_until(const std::string& prefix,
                                        std::chrono::steady_clock::duration limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      auto l = read_line(deadline - std::chrono::steady_clock::now());
      if (!l) return std::nullopt;
      if (l->rfind(prefix, 0) == 0) return l;
    }
    return std::nullopt;
  }

 private:
  int fd_[2] = {-1, -1};
  std::string buf_;
};

// A forked child process running `body`; killed (if still running) and reaped when destroyed.
class Child {
 public:
  explicit Child(const std::function<int()>& body) {
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      int rc = 97;
      try {
        rc = body();
      } catch (...) {
        rc = 98;
      }
      std::fflush(nullptr);
      ::_exit(rc);
    }
    REQUIRE(pid_ > 0);
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      static_cast<void>(wait(std::chrono::seconds(10)));
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  void kill9() { ::kill(pid_, SIGKILL); }
  void signal(int sig) { ::kill(pid_, sig); }
  // Its exit code (128 + signal when killed) if it ends within `limit`.
  std::optional<int> wait(std::chrono::steady_clock::duration limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (;;) {
      int st = 0;
      const pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        reaped_ = true;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      if (r < 0) {
        reaped_ = true;
        return -1;
      }
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // Peak resident memory in KiB (VmHWM), 0 when unknown.
  long peak_rss_kib() const {
    std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind("VmHWM:", 0) == 0) return std::atol(line.c_str() + 6);
    }
    return 0;
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

}  // namespace actorpipe::testing
