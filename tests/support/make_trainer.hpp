// A Trainer for a test: created from a Config on the given backend, the test stopped with the
// error's message if creation fails.
#pragma once

#include <doctest/doctest.h>

#include <memory>

#include "actors/api/actorpipe/trainer.hpp"

namespace actorpipe::testing {

inline std::unique_ptr<Trainer> make_trainer(const Config& c, Backend backend = Backend::actors) {
  TrainerOptions o;
  o.backend = backend;
  auto t = Trainer::create(c, o);
  REQUIRE_MESSAGE(t.ok(), t.error().message);
  return std::move(*t);
}

}  // namespace actorpipe::testing
