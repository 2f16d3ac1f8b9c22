// PortReservation: one bound, never listening TCP socket per reserved port.
#include "transport/port_reservation.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace actorpipe {

PortReservation::PortReservation(PortReservation&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), port_(std::exchange(other.port_, 0)) {}

PortReservation& PortReservation::operator=(PortReservation&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::exchange(other.fd_, -1);
    port_ = std::exchange(other.port_, 0);
  }
  return *this;
}

PortReservation::~PortReservation() {
  release();
}

void PortReservation::release() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  port_ = 0;
}

Expected<PortReservation> PortReservation::reserve(const std::string& address, int port) {
  if (port < 0 || port > 65535) {
    return make_error("TCP port {} is not allowed: expected 0 (any free port) to 65535", port);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(address.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return make_error("--bind: '{}' is not allowed: {}; expected a numeric IPv4 or IPv6 address",
                      address, ::gai_strerror(rc));
  }
  PortReservation r;
  r.fd_ = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (r.fd_ < 0) {
    const int e = errno;
    ::freeaddrinfo(found);
    return make_error("cannot create a TCP socket for {}: {}", address, std::strerror(e));
  }
  // SO_REUSEADDR: a port in TIME_WAIT counts as free, and the coordinator (which sets it too) can
  // bind and listen beside this socket, which never listens
  const int one = 1;
  ::setsockopt(r.fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const int bound = ::bind(r.fd_, found->ai_addr, found->ai_addrlen);
  const int bind_errno = errno;
  ::freeaddrinfo(found);
  if (bound != 0) {
    return make_error("cannot bind TCP port {} on {}: {}", port, address,
                      std::strerror(bind_errno));
  }
  sockaddr_storage name{};
  socklen_t len = sizeof name;
  if (::getsockname(r.fd_, reinterpret_cast<sockaddr*>(&name), &len) != 0) {
    return make_error("cannot read the port bound on {}: {}", address, std::strerror(errno));
  }
  r.port_ = name.ss_family == AF_INET
                ? static_cast<int>(ntohs(reinterpret_cast<sockaddr_in*>(&name)->sin_port))
                : static_cast<int>(ntohs(reinterpret_cast<sockaddr_in6*>(&name)->sin6_port));
  return r;
}

Expected<int> pick_free_port(const std::string& address) {
  auto r = PortReservation::reserve(address, 0);
  if (!r) return r.error();
  return r->port();
}

}  // namespace actorpipe
