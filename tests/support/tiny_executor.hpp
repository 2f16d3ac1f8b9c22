// A SerialExecutor over the tiny model's kB × kT microbatches: `o` says the rest; the test stops
// with the reason when it cannot be created.
#pragma once

#include <doctest/doctest.h>

#include <memory>
#include <utility>

#include "engine/execution/serial_executor.hpp"
#include "tests/support/tiny_model.hpp"

namespace actorpipe::testing {

inline std::unique_ptr<SerialExecutor> tiny_executor(const Model& model, const Partition& p,
                                                     const OptimizerOptions& opt,
                                                     SerialExecutorOptions o) {
  o.B = kB;
  o.T = kT;
  auto e = SerialExecutor::create(model, p, opt, o);
  REQUIRE_MESSAGE(e.ok(), (e.ok() ? "" : e.error().message));
  return std::move(e).value();
}

}  // namespace actorpipe::testing
