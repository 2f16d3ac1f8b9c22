// actorpipe-launch: starts N local processes of a program as ranks 0..N-1 of one job, with the
// coordinator's address and a fresh job secret in their environment; see docs/launch.md.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <iostream>
#include <string>
#include <vector>

#include "examples/launch/launcher.hpp"

extern char** environ;

using namespace actorpipe;

namespace {

int g_signal_pipe = -1;  // write end: the handler writes each signal's number as one byte
StopFlag g_stop;         // a signal came: no relaunch of the job after it

void on_signal(int sig) {
  const int saved = errno;
  g_stop.request(sig);
  const unsigned char byte = static_cast<unsigned char>(sig);
  (void)!::write(g_signal_pipe, &byte, 1);
  errno = saved;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  auto options = parse_launch_args(args);
  if (!options) {
    std::cerr << "actorpipe-launch: " << options.error().message << "\n";
    return 2;
  }
  if (options->help) {
    std::cout << kLaunchUsage;
    return 0;
  }
  const char* path = std::getenv("PATH");
  auto program = resolve_program(options->command.front(), path != nullptr ? path : "");
  if (!program) {
    std::cerr << "actorpipe-launch: " << program.error().message << "\n";
    return 127;
  }
  std::vector<std::string> base_env;
  for (char** e = environ; *e != nullptr; ++e) base_env.emplace_back(*e);

  // SIGINT and SIGTERM become bytes on a pipe that the launch loop reads and forwards.
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    std::cerr << "actorpipe-launch: cannot create a pipe for signals\n";
    return 1;
  }
  g_signal_pipe = pipe_fds[1];
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the launcher and orphan the ranks

  LaunchIo io = launch_io_to(STDOUT_FILENO, STDERR_FILENO);
  io.interrupt_fd = pipe_fds[0];
  return run_job(*options, *program, base_env, io, &g_stop).exit_code;
}
