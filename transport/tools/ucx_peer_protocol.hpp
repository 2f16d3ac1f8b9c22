// UCX peer protocol: the framed messages that the two-process UCX channel test and its peer
// process exchange on a socket (worker addresses, announcements, done), with bounded waits.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/expected.hpp"
#include "transport/wire.hpp"

namespace actorpipe::ucx_peer {

/// What a frame carries.
enum class Kind : uint32_t {
  address = 1,       ///< a packed UCX worker address
  announcement = 2,  ///< an Announcement, as its bytes
  done = 3,          ///< no more announcements (parent) / all replies posted (peer)
  failure = 4,       ///< the peer's error message, before it exits with status 1
};

struct Frame {
  Kind kind = Kind::done;
  std::vector<std::byte> payload;
};

static_assert(std::is_trivially_copyable_v<Announcement>);

/// Byte i of the payload the parent posts with sequence `seq`.
inline std::byte pattern(uint64_t seq, size_t i) {
  return static_cast<std::byte>((i * 131 + seq * 7 + 1) & 0xFF);
}
/// What the peer sends back: every byte of the received payload XOR this.
inline constexpr std::byte kReplyMask{0xA5};

/// Moves exactly `n` bytes to/from socket `fd`, waiting at most `timeout` in all. Errors: timeout,
/// end of stream, a failing read or write.
inline Status transfer(int fd, std::byte* data, size_t n, bool writing,
                       std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  size_t done = 0;
  while (done < n) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0)
      return make_error("socket {}: {} {} of {} B timed out after {} ms", fd,
                        writing ? "writing" : "reading", n - done, n, timeout.count());
    pollfd p{fd, static_cast<short>(writing ? POLLOUT : POLLIN), 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return make_error("socket {}: poll: {}", fd, std::strerror(errno));
    if (ready == 0) continue;
    // send() with MSG_NOSIGNAL: a peer that died is an error here, not a SIGPIPE
    const ssize_t k = writing ? ::send(fd, data + done, n - done, MSG_NOSIGNAL)
                              : ::recv(fd, data + done, n - done, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k < 0)
      return make_error("socket {}: {}: {}", fd, writing ? "write" : "read", std::strerror(errno));
    if (k == 0) return make_error("socket {}: the other side closed it", fd);
    done += static_cast<size_t>(k);
  }
  return {};
}

/// Writes one frame: kind, payload length (both u32, host order: one host) and payload.
inline Status send_frame(int fd, Kind kind, const void* payload, size_t bytes,
                         std::chrono::milliseconds timeout) {
  uint32_t header[2] = {static_cast<uint32_t>(kind), static_cast<uint32_t>(bytes)};
  Status s = transfer(fd, reinterpret_cast<std::byte*>(header), sizeof header, true, timeout);
  if (!s.ok() || bytes == 0) return s;
  return transfer(fd, static_cast<std::byte*>(const_cast<void*>(payload)), bytes, true, timeout);
}

/// Reads one frame. Errors: those of transfer(), a payload above 1 MiB.
inline Expected<Frame> recv_frame(int fd, std::chrono::milliseconds timeout) {
  uint32_t header[2] = {0, 0};
  Status s = transfer(fd, reinterpret_cast<std::byte*>(header), sizeof header, false, timeout);
  if (!s.ok()) return s.error();
  if (header[1] > (1u << 20))
    return make_error("socket {}: frame of kind {} announces {} B", fd, header[0], header[1]);
  Frame f;
  f.kind = static_cast<Kind>(header[0]);
  f.payload.resize(header[1]);
  s = transfer(fd, f.payload.data(), f.payload.size(), false, timeout);
  if (!s.ok()) return s.error();
  return f;
}

/// The announcement a frame carries. Errors: another kind, another size.
inline Expected<Announcement> announcement_of(const Frame& f) {
  if (f.kind != Kind::announcement || f.payload.size() != sizeof(Announcement))
    return make_error("expected an announcement frame of {} B, got kind {} of {} B",
                      sizeof(Announcement), static_cast<uint32_t>(f.kind), f.payload.size());
  Announcement a;
  std::memcpy(&a, f.payload.data(), sizeof a);
  return a;
}

}  // namespace actorpipe::ucx_peer
