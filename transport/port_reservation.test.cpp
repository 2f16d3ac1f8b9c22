// PortReservation: the coordinator binds and listens beside it; no other bind takes the port.
#include "transport/port_reservation.hpp"

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <set>
#include <string>
#include <vector>

using namespace actorpipe;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// An open TCP socket on 127.0.0.1, closed with the object.
struct Socket {
  int fd = -1;
  explicit Socket(bool reuse_addr) : fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    REQUIRE(fd >= 0);
    const int one = 1;
    if (reuse_addr) REQUIRE(::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { ::close(fd); }
  // 0 or the errno of bind
  int bind_to(int port) const {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    return ::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0 ? 0 : errno;
  }
  int local_port() const {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    return ntohs(a.sin_port);
  }
};

// Binds `port` with SO_REUSEADDR and listens, as the coordinator does, then takes one connection.
void listen_and_accept(int port) {
  Socket server(true);
  REQUIRE(server.bind_to(port) == 0);
  REQUIRE(::listen(server.fd, 4) == 0);
  Socket client(false);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  REQUIRE(::connect(client.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  const int accepted = ::accept(server.fd, nullptr, nullptr);
  CHECK(accepted >= 0);
  if (accepted >= 0) ::close(accepted);
}

}  // namespace

TEST_CASE(
    "a reserved port: a program that sets SO_REUSEADDR listens on it, and again after it "
    "ended, and a bind without it is refused until the port is released") {
  auto r = PortReservation::reserve("127.0.0.1", 0);
  REQUIRE(r.ok());
  CHECK(r->held());
  const int port = r->port();
  CHECK(port >= 1);
  CHECK(port <= 65535);

  listen_and_accept(port);
  listen_and_accept(port);  // rank 0 relaunched

  CHECK(Socket(false).bind_to(port) == EADDRINUSE);

  // a port nobody connected to (the one above is in TIME_WAIT after its connections)
  auto other = PortReservation::reserve("127.0.0.1", 0);
  REQUIRE(other.ok());
  const int quiet = other->port();
  PortReservation moved = std::move(*other);
  CHECK_FALSE(other->held());
  CHECK(moved.port() == quiet);
  CHECK(Socket(false).bind_to(quiet) == EADDRINUSE);
  moved.release();
  CHECK_FALSE(moved.held());
  CHECK(moved.port() == 0);
  CHECK(Socket(false).bind_to(quiet) == 0);
}

TEST_CASE("no bind to port 0 and no connect gets a reserved port") {
  // 200 ports held, 2000 binds to port 0 and 2000 connections. Ports merely picked and closed
  // again are handed out by bind(0) about 20 times in such a run (Linux reuses them soon), so a
  // reservation that held nothing would fail here.
  std::vector<PortReservation> held;
  std::set<int> ports;
  for (int i = 0; i < 200; ++i) {
    auto r = PortReservation::reserve("127.0.0.1", 0);
    REQUIRE(r.ok());
    ports.insert(r->port());
    held.push_back(std::move(*r));
  }
  REQUIRE(ports.size() == held.size());
  int bind_hits = 0;
  for (int i = 0; i < 2000; ++i) {
    Socket s(false);
    REQUIRE(s.bind_to(0) == 0);
    bind_hits += static_cast<int>(ports.count(s.local_port()));
  }
  CHECK(bind_hits == 0);

  Socket server(false);
  REQUIRE(server.bind_to(0) == 0);
  REQUIRE(::listen(server.fd, 64) == 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(static_cast<uint16_t>(server.local_port()));
  int connect_hits = 0;
  for (int i = 0; i < 2000; ++i) {
    Socket client(false);
    REQUIRE(::connect(client.fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0);
    connect_hits += static_cast<int>(ports.count(client.local_port()));
    const int accepted = ::accept(server.fd, nullptr, nullptr);
    REQUIRE(accepted >= 0);
    ::close(accepted);
  }
  CHECK(connect_hits == 0);
}

TEST_CASE("a port in use, a bad address or a bad port: errors that name them") {
  Socket listening(false);
  REQUIRE(listening.bind_to(0) == 0);
  REQUIRE(::listen(listening.fd, 1) == 0);
  const int busy = listening.local_port();
  auto taken = PortReservation::reserve("127.0.0.1", busy);
  REQUIRE_FALSE(taken.ok());
  CHECK(contains(taken.error().message, fmt::format("cannot bind TCP port {} on 127.0.0.1", busy)));

  auto bad = PortReservation::reserve("localhost", 0);
  REQUIRE_FALSE(bad.ok());
  CHECK(contains(bad.error().message, "--bind: 'localhost' is not allowed"));

  auto range = PortReservation::reserve("127.0.0.1", 70000);
  REQUIRE_FALSE(range.ok());
  CHECK(contains(range.error().message, "TCP port 70000 is not allowed"));

  auto v6 = PortReservation::reserve("::1", 0);
  if (v6.ok()) CHECK(v6->port() > 0);  // a machine without IPv6 loopback refuses ::1

  auto picked = pick_free_port("127.0.0.1");
  REQUIRE(picked.ok());
  CHECK(Socket(false).bind_to(*picked) == 0);  // released: free for a program that binds it
}
