// A TCP port held by the launcher for the job's coordinator, so that nothing else on the host takes
// it between the launcher picking it and rank 0 listening on it, or while rank 0 is relaunched.
#pragma once

#include <string>

#include "engine/expected.hpp"

namespace actorpipe {

/// A TCP socket bound to address:port with SO_REUSEADDR and never listening. While it is open:
/// - a program that also sets SO_REUSEADDR (the coordinator does: CAF's publish with reuse) can
///   bind the port and listen on it, and bind and listen again after it ended;
/// - the kernel gives the port to no connect() (whose source ports skip explicitly bound ports),
///   no bind to port 0, and no bind without SO_REUSEADDR.
/// So the port a launcher picks stays the coordinator's for the whole job. Move-only; the socket
/// is closed (the port released) by the destructor or release().
class PortReservation {
 public:
  PortReservation() = default;
  PortReservation(PortReservation&& other) noexcept;
  PortReservation& operator=(PortReservation&& other) noexcept;
  PortReservation(const PortReservation&) = delete;
  PortReservation& operator=(const PortReservation&) = delete;
  ~PortReservation();

  /// Binds `port` on `address` (a numeric IPv4 or IPv6 address); port 0: a free port. Errors
  /// name the address and the port.
  static Expected<PortReservation> reserve(const std::string& address, int port);

  int port() const { return port_; }      ///< the bound port; 0 when nothing is held
  bool held() const { return fd_ >= 0; }  ///< the socket is open
  void release();                         ///< closes the socket: the port is free again

 private:
  int fd_ = -1;
  int port_ = 0;
};

/// A free TCP port on `address`, released at once: for a program that binds it itself without
/// SO_REUSEADDR (another process may take it before that program binds it; the window is short).
Expected<int> pick_free_port(const std::string& address);

}  // namespace actorpipe
