// Messages of the actor engine: atoms and the small structs the driver, the stage actors and
// the optimizer shards exchange in one process (local only: no tensor travels inside them).
#pragma once

#include <caf/all.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/internal/run_state.hpp"
#include "engine/batch.hpp"
#include "engine/execution/update_job.hpp"
#include "transport/wire.hpp"

namespace actorpipe::internal {

// driver <-> engine
using run_atom = caf::atom_constant<caf::atom("run")>;
// driver -> stages
using mb_atom = caf::atom_constant<caf::atom("mb")>;            // (int64 mb, MicrobatchPtr)
using release_atom = caf::atom_constant<caf::atom("release")>;  // (int flush ordinal)
// stages -> driver
using loss_atom = caf::atom_constant<caf::atom("loss")>;      // (int64 mb, double sum, int64 n)
using credit_atom = caf::atom_constant<caf::atom("credit")>;  // (int64 mb)
using flush_atom = caf::atom_constant<caf::atom("flush")>;    // (int stage, int ordinal)
using done_atom = caf::atom_constant<caf::atom("done")>;      // (int stage)
using fail_atom = caf::atom_constant<caf::atom("fail")>;      // (Failure)
// stage <-> stage
using ann_atom = caf::atom_constant<caf::atom("ann")>;  // (Announcement)
// stage <-> its optimizer shard
using update_atom = caf::atom_constant<caf::atom("update")>;        // (UpdateTicket)
using published_atom = caf::atom_constant<caf::atom("published")>;  // (UpdateTicket, int64 ns)
// optimizer shards <-> driver, each other and the stages
using sumsq_atom = caf::atom_constant<caf::atom("sumsq")>;      // (SumSq)
using scale_atom = caf::atom_constant<caf::atom("scale")>;      // (int64 ordinal, float)
using tgrad_atom = caf::atom_constant<caf::atom("tgrad")>;      // (TiedTensor)
using tweight_atom = caf::atom_constant<caf::atom("tweight")>;  // (TiedTensor)
// driver's watchdog
using tick_atom = caf::atom_constant<caf::atom("tick")>;

/// A microbatch shared read-only by every stage (in-process: one copy).
using MicrobatchPtr = std::shared_ptr<const Microbatch>;

/// An update a stage hands to its optimizer shard (`update`) and gets back applied
/// (`published`): the worker's job, which only the shard touches in between (null when
/// skipping compute), and the OPT_STEP's place in the stage's run.
struct UpdateTicket {
  UpdateJob* job = nullptr;
  int64_t index = 0;    ///< the stage's pc at the OPT_STEP
  double handed = 0.0;  ///< when the stage handed it over, seconds since the run started
};

/// Σg² per layer of one stage for one update.
struct SumSq {
  int64_t ordinal = 0;
  int stage = 0;
  std::vector<double> per_layer;
};

/// Why an actor gave up: the driver turns the first one into the run's error.
struct Failure {
  int stage = -1;           ///< -1: the driver itself
  int64_t microbatch = -1;  ///< global microbatch index, -1 when none
  std::string action;       ///< text form of the action, empty when none
  std::string cause;
};

/// The driver's answer to the engine.
struct RunOutcome {
  bool ok = false;
  std::string error;
  std::vector<double> losses;
  int peak_ahead = 0;
};

}  // namespace actorpipe::internal

namespace actorpipe {

/// Serialisation, printing and debugging of an announcement (the one message that will cross
/// process boundaries as it is: it carries no pointer).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Announcement& a) {
  static_assert(Tensor::kMaxDims == 4, "inspect lists every dimension");
  return f(caf::meta::type_name("Announcement"), a.tag, a.sequence, a.microbatch, a.version,
           a.dtype, a.ndim, a.dims[0], a.dims[1], a.dims[2], a.dims[3]);
}

}  // namespace actorpipe

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(actorpipe::internal::MicrobatchPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(actorpipe::internal::UpdateTicket)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(actorpipe::internal::TiedTensor)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(actorpipe::internal::SumSq)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(actorpipe::internal::Failure)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(actorpipe::internal::RunOutcome)
