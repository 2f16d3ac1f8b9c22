// Tests' output capture: what a process writes to one of its file descriptors (stderr by default)
// while the object lives goes to a temporary file instead, for the test to read.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace actorpipe::testing {

/// Redirects `fd` (2: stderr, 1: stdout) into a temporary file until restore() or destruction.
class OutputCapture {
 public:
  explicit OutputCapture(int fd = 2) : target_(fd) {
    flush();
    char path[] = "/tmp/actorpipe-output-XXXXXX";
    fd_ = ::mkstemp(path);
    REQUIRE(fd_ >= 0);
    path_ = path;
    saved_ = ::dup(target_);
    ::dup2(fd_, target_);
  }
  ~OutputCapture() {
    restore();
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  OutputCapture(const OutputCapture&) = delete;
  OutputCapture& operator=(const OutputCapture&) = delete;

  /// Everything written so far.
  std::string text() {
    flush();
    std::ifstream f(path_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  /// Writes to the descriptor go where they went before again.
  void restore() {
    if (saved_ < 0) return;
    flush();
    ::dup2(saved_, target_);
    ::close(saved_);
    saved_ = -1;
  }

 private:
  static void flush() {
    std::fflush(stdout);
    std::fflush(stderr);
  }
  int target_;
  int fd_ = -1;
  int saved_ = -1;
  std::string path_;
};

}  // namespace actorpipe::testing
