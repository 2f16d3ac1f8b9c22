// Subprocess: runs a program with extra environment variables and captures its standard
// output (standard error passes through), for the per-configuration child and the peer.
#include "bench/subprocess.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

extern char** environ;

namespace actorpipe::bench {

Expected<ProcessResult> run_process(const std::vector<std::string>& argv,
                                    const std::vector<std::pair<std::string, std::string>>& env) {
  if (argv.empty()) return make_error("run_process: empty command line");
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv(*e);
    const std::string key = kv.substr(0, kv.find('='));
    bool replaced = false;
    for (const auto& [k, v] : env) replaced = replaced || k == key;
    if (!replaced) env_strings.push_back(kv);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return make_error("pipe: {}", std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return make_error("cannot run '{}': {}", argv[0], std::strerror(rc));
  }
  ProcessResult res;
  char buf[4096];
  while (true) {
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n > 0) {
      res.out.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  res.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return res;
}

std::string self_executable() {
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("/proc/self/exe") : p.string();
}

std::string peer_script_path(const std::string& given, const std::string& file) {
  if (!given.empty()) return given;
  if (const char* src = std::getenv("ACTORPIPE_SOURCE_DIR"))
    return std::string(src) + "/bench/peers/" + file;
  return std::string(ACTORPIPE_BENCH_PEERS_DIR) + "/" + file;
}

}  // namespace actorpipe::bench
