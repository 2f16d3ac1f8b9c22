// A TCP port on 127.0.0.1 held for a test that must name a port before the process listening on it
// starts: that process's coordinator binds it beside the hold, and no other program's bind or
// connection takes it meanwhile (transport/port_reservation.hpp; the launcher holds its port so).
#pragma once

#include <doctest/doctest.h>

#include <utility>

#include "transport/port_reservation.hpp"

namespace actorpipe::testing {

inline PortReservation held_port() {
  auto r = PortReservation::reserve("127.0.0.1", 0);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  return std::move(*r);
}

}  // namespace actorpipe::testing
