// UCX channel peer: the second process of the two-process UCX channel test. It takes the parent's
// tensors on forward channel 0 and sends each back, every byte XOR 0xA5, on backward channel 0.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "transport/tools/ucx_peer_protocol.hpp"
#include "transport/ucx_channel.hpp"

using namespace actorpipe;
using namespace std::chrono_literals;

namespace {

constexpr auto kSocketTimeout = 30s;

Status run(int fd, const std::string& tls) {
  UcxWorkerOptions options;
  options.name = "ucx peer";
  if (!tls.empty()) options.config.emplace_back("TLS", tls);
  auto worker = UcxWorker::create(options);
  if (!worker.ok()) return worker.error();
  const auto& own = (*worker)->address();
  Status s =
      ucx_peer::send_frame(fd, ucx_peer::Kind::address, own.data(), own.size(), kSocketTimeout);
  if (!s.ok()) return s;
  auto peer_address = ucx_peer::recv_frame(fd, kSocketTimeout);
  if (!peer_address.ok()) return peer_address.error();
  if (peer_address->kind != ucx_peer::Kind::address)
    return make_error("expected the parent's address, got a frame of kind {}",
                      static_cast<uint32_t>(peer_address->kind));
  auto ep = (*worker)->connect(peer_address->payload);
  if (!ep.ok()) return ep.error();

  UcxChannelOptions channel_options;
  channel_options.receive_timeout = 20s;
  auto forward =
      UcxChannel::receiver(*worker, channel_ends(0, Direction::forward), channel_options);
  auto backward =
      UcxChannel::sender(*worker, channel_ends(0, Direction::backward), *ep, channel_options);

  for (int frames = 0; frames < 1000; ++frames) {
    auto f = ucx_peer::recv_frame(fd, kSocketTimeout);
    if (!f.ok()) return f.error();
    if (f->kind == ucx_peer::Kind::done) break;
    auto a = ucx_peer::announcement_of(*f);
    if (!a.ok()) return a.error();
    auto t = forward->receive(*a);
    if (!t.ok()) return t.error();
    const auto* got = static_cast<const std::byte*>(t->storage()->data());
    Tensor reply = Tensor::zeros(t->shape(), t->dtype());
    auto* out = static_cast<std::byte*>(reply.storage()->data());
    for (size_t i = 0; i < t->nbytes(); ++i) {
      if (got[i] != ucx_peer::pattern(a->sequence, i))
        return make_error("payload {}: byte {} is {:#x}, expected {:#x}", to_string(*a), i,
                          static_cast<unsigned>(got[i]),
                          static_cast<unsigned>(ucx_peer::pattern(a->sequence, i)));
      out[i] = got[i] ^ ucx_peer::kReplyMask;
    }
    auto r = backward->post(std::move(reply), a->microbatch, a->version);
    if (!r.ok()) return r.error();
    s = ucx_peer::send_frame(fd, ucx_peer::Kind::announcement, &*r, sizeof(Announcement),
                             kSocketTimeout);
    if (!s.ok()) return s;
  }
  s = backward->wait_sent(kSocketTimeout);
  if (!s.ok()) return s;
  s = ucx_peer::send_frame(fd, ucx_peer::Kind::done, nullptr, 0, kSocketTimeout);
  if (!s.ok()) return s;
  // Stay until the parent has taken every reply: then both ends tear down.
  auto bye = ucx_peer::recv_frame(fd, kSocketTimeout);
  if (!bye.ok()) return bye.error();
  return {};
}

}  // namespace

/// Usage: ucx_channel_peer <socket fd> [UCX transports, e.g. tcp]. Exit status 0: all checked.
int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <socket fd> [UCX transports]\n", argv[0]);
    return 2;
  }
  const int fd = std::atoi(argv[1]);
  const std::string tls = argc > 2 ? argv[2] : "";
  Status s;
  try {
    s = run(fd, tls);
  } catch (const std::exception& e) {
    s = make_error("exception: {}", e.what());
  }
  if (s.ok()) return 0;
  std::fprintf(stderr, "ucx_channel_peer: %s\n", s.error().message.c_str());
  // Best effort: the parent reports this message next to the exit status.
  (void)ucx_peer::send_frame(fd, ucx_peer::Kind::failure, s.error().message.data(),
                             s.error().message.size(), 1s);
  return 1;
}
