// A fresh directory under the system's temporary directory for one test, removed with all it
// holds when the test leaves its scope.
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <system_error>

namespace actorpipe::testing {

/// An empty directory `<tmp>/actorpipe-test-<pid>-<n>`, unique within the machine's running
/// tests; removed (with everything in it) by the destructor.
struct TempDir {
  std::filesystem::path path;

  TempDir() {
    static std::atomic<int> n{0};
    path = std::filesystem::temp_directory_path() /
           ("actorpipe-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  /// The directory itself.
  std::string str() const { return path.string(); }
  /// `name` (a relative path) inside the directory.
  std::string file(const std::string& name) const { return (path / name).string(); }
};

}  // namespace actorpipe::testing
