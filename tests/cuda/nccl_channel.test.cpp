// The NCCL channel between two processes on the GPU (the peer, tools/nccl_channel_peer.cpp, sends;
// this process receives): every payload bit for bit whether posted from the GPU or the host,
// receives in post order only, a payload that never comes times out and aborts the link, and an
// interrupt ends a waiting receive at once. The two processes may share one GPU: each gets a
// host id of its own (NCCL_HOSTID), so NCCL connects them with sockets on loopback. Skipped
// without a GPU.
#include "transport/nccl_channel.hpp"

#include <doctest/doctest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "kernels/compute_backend.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "tests/cuda/tools/nccl_peer_script.hpp"
#include "tests/support/gpu_skip.hpp"
#include "tests/support/text.hpp"

extern char** environ;

using namespace actorpipe;
using actorpipe::testing::contains;
using actorpipe::testing::why;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// The peer next to this program (the build folder, or a GPU bundle's bin/).
std::string peer_path() {
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "nccl_channel_peer")
      .string();
}

// The peer, started with its own NCCL host id; its stdin is a pipe this process closes to end it.
struct Peer {
  pid_t pid = -1;
  int stdin_fd = -1;

  Peer(const std::string& id_a, const std::string& id_b) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[0], STDIN_FILENO);
    posix_spawn_file_actions_addclose(&fa, fds[1]);
    std::vector<std::string> env_text;
    for (char** e = environ; *e != nullptr; ++e)
      if (std::strncmp(*e, "NCCL_HOSTID=", 12) != 0) env_text.emplace_back(*e);
    env_text.emplace_back("NCCL_HOSTID=actorpipe-test-peer");
    std::vector<char*> env;
    for (auto& s : env_text) env.push_back(s.data());
    env.push_back(nullptr);
    const std::string path = peer_path();
    std::vector<std::string> args_text{path, id_a, id_b};
    std::vector<char*> args;
    for (auto& s : args_text) args.push_back(s.data());
    args.push_back(nullptr);
    const int rc = posix_spawn(&pid, path.c_str(), &fa, nullptr, args.data(), env.data());
    posix_spawn_file_actions_destroy(&fa);
    ::close(fds[0]);
    stdin_fd = fds[1];
    REQUIRE_MESSAGE(rc == 0, "cannot start " << path << ": " << std::strerror(rc));
  }
  // closes its stdin and waits (at most 30 s, then kills it): its exit status, or -1
  int finish() {
    if (stdin_fd >= 0) ::close(stdin_fd);
    stdin_fd = -1;
    const auto deadline = Clock::now() + 30s;
    int status = 0;
    while (pid > 0) {
      const pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      if (Clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        pid = -1;
        return -1;
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }
  ~Peer() {
    if (pid > 0) finish();
  }
};

Announcement announcement(size_t k) {
  const nccl_peer::Item item = nccl_peer::script()[k];
  Announcement a;
  a.tag = channel_tag(0, Direction::forward);
  a.sequence = k;
  a.microbatch = static_cast<int64_t>(k);
  a.version = 3;
  a.dtype = item.dtype;
  a.ndim = static_cast<int32_t>(item.shape.size());
  for (size_t i = 0; i < item.shape.size(); ++i) a.dims[i] = item.shape[i];
  return a;
}

}  // namespace

TEST_CASE(
    "two processes over NCCL: payloads bit for bit, post order kept, a missing payload times out, "
    "an interrupt ends a wait") {
  if (testing::skip_without_gpu()) return;
  // this process is a host of its own for NCCL, as the peer is (loopback sockets between them)
  ::setenv("NCCL_HOSTID", "actorpipe-test-main", 1);
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  auto id_a = nccl_unique_id();
  auto id_b = nccl_unique_id();
  REQUIRE_MESSAGE(id_a.ok(), why(id_a));
  REQUIRE_MESSAGE(id_b.ok(), why(id_b));
  Peer peer(*id_a, *id_b);
  auto backend = make_cuda_backend(0);
  BackendMemory& memory = backend->lasting_memory();

  auto a = NcclLink::connect(*id_a, false, memory, 60s);
  REQUIRE_MESSAGE(a.ok(), why(a));
  NcclChannelOptions opts;
  opts.receive_timeout = 2s;
  auto rx = NcclChannel::receiver(*a, channel_ends(0, Direction::forward), opts);
  CHECK_FALSE(rx->announces());

  // out of post order: refused before NCCL sees it, the link stays up
  auto early = rx->receive(announcement(1));
  REQUIRE_FALSE(early.ok());
  CHECK(contains(early.error().message, "out of order"));
  CHECK(contains(early.error().message, "sequence 0 is next"));
  CHECK_FALSE((*a)->dead());

  const size_t n = nccl_peer::script().size();
  for (size_t k = 0; k < n; ++k) {
    CAPTURE(k);
    auto got = rx->receive(announcement(k));
    REQUIRE_MESSAGE(got.ok(), why(got));
    CHECK(got->memory() == &memory);  // on the GPU, in its lasting memory
    CHECK(got->shape() == nccl_peer::script()[k].shape);
    CHECK(got->dtype() == nccl_peer::script()[k].dtype);
    const Tensor back = host_copy(*got);
    const Tensor want = nccl_peer::patterned(k);
    CHECK(std::memcmp(back.storage()->data(), want.storage()->data(), want.nbytes()) == 0);
  }
  CHECK(rx->pool_size() >= 1);
  CHECK(rx->pool_size() <= static_cast<size_t>(opts.pool_capacity));

  // a payload the peer never posts: the receive times out and the link is aborted
  const auto t0 = Clock::now();
  Announcement never = announcement(0);
  never.sequence = n;
  auto missing = rx->receive(never);
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  REQUIRE_FALSE(missing.ok());
  CHECK(contains(missing.error().message, "no payload"));
  CHECK(waited >= 1.9);
  CHECK(waited < 15.0);
  CHECK((*a)->dead());
  auto after = rx->receive(never);
  REQUIRE_FALSE(after.ok());
  CHECK(contains(after.error().message, "aborted"));

  // link B: a receive waits for a payload that never comes until an interrupt ends it
  auto b = NcclLink::connect(*id_b, false, memory, 60s);
  REQUIRE_MESSAGE(b.ok(), why(b));
  NcclChannelOptions long_wait;
  long_wait.receive_timeout = 60s;
  auto rx_b = NcclChannel::receiver(*b, channel_ends(0, Direction::forward), long_wait);
  Expected<Tensor> waiting = make_error("not run");
  double interrupted_after = 0;
  std::thread t([&] {
    const auto s = Clock::now();
    waiting = rx_b->receive(announcement(0));
    interrupted_after = std::chrono::duration<double>(Clock::now() - s).count();
  });
  std::this_thread::sleep_for(300ms);
  rx_b->interrupt("rank 1 lost (test)");
  t.join();
  REQUIRE_FALSE(waiting.ok());
  CHECK(contains(waiting.error().message, "rank 1 lost (test)"));
  CHECK(interrupted_after < 5.0);
  CHECK((*b)->dead());

  CHECK(peer.finish() == 0);
}
