// The sending process of the NCCL channel test (tests/cuda/nccl_channel.test.cpp): joins link A as
// its sender and posts the script's tensors (even ones from the GPU, odd ones from the host),
// waits until all were taken, joins link B (on which it posts nothing), then waits for its stdin
// to close and exits without tearing NCCL down (the test has aborted both links by then).
// Usage: nccl_channel_peer ID_A ID_B. Exit 0 when every step worked, 1 otherwise (on stderr).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "kernels/compute_backend.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "tests/cuda/tools/nccl_peer_script.hpp"
#include "transport/nccl_channel.hpp"

using namespace actorpipe;
using namespace std::chrono_literals;

namespace {
[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "nccl_channel_peer: %s\n", what.c_str());
  std::fflush(stderr);
  _exit(1);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) fail("usage: nccl_channel_peer ID_A ID_B");
  auto backend = make_cuda_backend(0);
  BackendMemory& memory = backend->lasting_memory();
  auto a = NcclLink::connect(argv[1], true, memory, 60s);
  if (!a) fail(a.error().message);
  auto tx = NcclChannel::sender(*a, channel_ends(0, Direction::forward));
  const auto items = nccl_peer::script();
  for (size_t k = 0; k < items.size(); ++k) {
    Tensor host = nccl_peer::patterned(k);
    Tensor t = host;
    if (k % 2 == 0) {
      t = Tensor::zeros(host.shape(), host.dtype(), memory);
      memory.to_backend(static_cast<float*>(t.storage()->data()),
                        static_cast<const float*>(host.storage()->data()), host.nbytes() / 4);
    }
    auto ann = tx->post(t, static_cast<int64_t>(k), 3);
    if (!ann) fail(ann.error().message);
    if (ann->sequence != k) fail("post " + std::to_string(k) + " got another sequence");
  }
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (tx->pending() > 0) {
    if (std::chrono::steady_clock::now() > deadline) fail("sends still pending after 60 s");
    std::this_thread::sleep_for(1ms);
  }
  auto b = NcclLink::connect(argv[2], true, memory, 60s);
  if (!b) fail(b.error().message);
  std::printf("peer: posted %zu tensors\n", items.size());
  std::fflush(stdout);
  char c = 0;
  while (::read(STDIN_FILENO, &c, 1) > 0) {
  }
  _exit(0);
}
