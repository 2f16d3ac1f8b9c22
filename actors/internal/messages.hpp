// Messages of the actor engine: atoms and the small structs the driver, the stage actors and
// the optimizer shards exchange. Plain data with an inspect() each: no pointer and no tensor
// payload travels inside them (tensors go on channels, announced by an Announcement).
#pragma once

#include <bit>
#include <caf/all.hpp>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "actors/actor_engine.hpp"
#include "transport/channel.hpp"
#include "transport/wire.hpp"

namespace actorpipe::internal {

// driver <-> engine
using run_atom = caf::atom_constant<caf::atom("run")>;
// driver -> stages
using mb_atom = caf::atom_constant<caf::atom("mb")>;  // (int64 mb): take it from the feed
// (int32 repeats): a stop was asked; the run ends after that many repetitions of the schedule
using cut_atom = caf::atom_constant<caf::atom("cut")>;
// stages -> driver
// (int64 mb, uint64 sum, int64 n): the sum's bits (CAF 0.17's double encoding turns a NaN into
// -1 and loops on an infinity, and a skipped step's loss may be either: train.nonfinite)
using loss_atom = caf::atom_constant<caf::atom("loss")>;
using credit_atom = caf::atom_constant<caf::atom("credit")>;  // (int64 mb)
using commit_atom = caf::atom_constant<caf::atom("commit")>;  // (Commit)
using done_atom = caf::atom_constant<caf::atom("done")>;      // (int stage, StageTimes)
using fail_atom = caf::atom_constant<caf::atom("fail")>;      // (Failure)
// process group -> driver: a rank of the job was lost
using lost_atom = caf::atom_constant<caf::atom("lostrank")>;  // (int32 rank, string reason)
// stage <-> stage
using ann_atom = caf::atom_constant<caf::atom("ann")>;  // (Announcement)
// stage <-> its optimizer shard
using update_atom = caf::atom_constant<caf::atom("update")>;        // (UpdateTicket)
using published_atom = caf::atom_constant<caf::atom("published")>;  // (UpdateTicket, int64 ns)
// optimizer shards <-> driver, each other and the stages
using sumsq_atom = caf::atom_constant<caf::atom("sumsq")>;      // (SumSq)
using scale_atom = caf::atom_constant<caf::atom("scale")>;      // (int64 ordinal, float)
using tgrad_atom = caf::atom_constant<caf::atom("tgrad")>;      // (TiedAnnouncement)
using tweight_atom = caf::atom_constant<caf::atom("tweight")>;  // (TiedAnnouncement)
// driver of replica q > 0 -> replica 0's driver (pipeline.replicas): the loss of its k-th step
// of the run (int32 q, int64 k, uint64 bits of the double)
using rloss_atom = caf::atom_constant<caf::atom("rloss")>;
// a replica's driver -> the others': its run failed (int32 replica, string error)
using rfail_atom = caf::atom_constant<caf::atom("rfail")>;
// driver's watchdog
using tick_atom = caf::atom_constant<caf::atom("tick")>;
// driver -> stages, request: what the stage waits for (-> std::string)
using status_atom = caf::atom_constant<caf::atom("status")>;
// engine -> migration manager
using segment_atom = caf::atom_constant<caf::atom("segment")>;      // (): a segment starts
using steptimes_atom = caf::atom_constant<caf::atom("steptimes")>;  // (vector<StageTimes>)
// a segment's end: (int64 step, vector<int32> counts) -> (bool due, MigrationEvent): a forced
// move or the move a check decided, made
using boundary_atom = caf::atom_constant<caf::atom("boundary")>;
// a check step of the automatic rule, during a run: (int64 step, vector<int32> counts) ->
// (bool due, bool move, MigrationEvent): a verdict to report now, or a move to make at the
// next segment end (the engine then cuts the run short)
using check_atom = caf::atom_constant<caf::atom("check")>;

/// The clip scale (`scale`) that tells every optimizer shard to drop the step
/// (train.nonfinite = "skip"; OptimizerShard::skip_update). A real scale is in (0, 1]; CAF 0.17
/// carries a NaN float as 1, so the sign says it.
inline constexpr float kSkipScale = -1.0f;

/// An update a stage hands to its optimizer shard (`update`) and gets back applied
/// (`published`). The update itself is the stage worker's open UpdateJob, which the shard (in
/// the stage's process) reaches through the worker and only it touches in between.
struct UpdateTicket {
  int64_t index = 0;    ///< the stage's pc at the OPT_STEP
  double handed = 0.0;  ///< when the stage handed it over, seconds since the run started
  friend bool operator==(const UpdateTicket&, const UpdateTicket&) = default;
};

/// One side of a tied parameter, posted on its tied channel: a gradient contribution (keyed by
/// update ordinal) or a weight value (keyed by version id, and in xpipe the lookahead of the
/// owner's prediction).
struct TiedAnnouncement {
  int64_t key = 0;
  int32_t lookahead = 0;  ///< weights: 0 for a version as it is, s for a prediction s ahead
  int32_t tied = 0;       ///< index into Model::tied()
  int32_t from_stage = 0;
  Announcement payload;  ///< the tensor on the channel
  friend bool operator==(const TiedAnnouncement&, const TiedAnnouncement&) = default;
};

/// Posts `t` on tied channel `ch` as value `key` (`lookahead`: as TiedAnnouncement) and returns
/// its announcement. Everything in it travels in the payload's Announcement, so that a channel
/// that delivers its announcements itself (UCX, TensorChannel::announces) carries the whole of
/// it: the channel names the parameter and the sending stage, `version` holds the key and
/// `microbatch` (a tied value belongs to no microbatch) holds -1 - lookahead.
inline Expected<TiedAnnouncement> post_tied_value(TensorChannel& ch, Tensor t, int64_t key,
                                                  int lookahead) {
  auto ann = ch.post(std::move(t), -1 - static_cast<int64_t>(lookahead), static_cast<int32_t>(key));
  if (!ann) return ann.error();
  TiedAnnouncement a;
  a.key = key;
  a.lookahead = lookahead;
  a.tied = ch.ends().tied;
  a.from_stage = ch.ends().from;
  a.payload = *ann;
  return a;
}

/// The TiedAnnouncement of `payload`, which arrived on tied channel `ends` (post_tied_value's
/// encoding).
inline TiedAnnouncement tied_announcement(const ChannelEnds& ends, const Announcement& payload) {
  TiedAnnouncement a;
  a.key = payload.version;
  a.lookahead = static_cast<int32_t>(-1 - payload.microbatch);
  a.tied = ends.tied;
  a.from_stage = ends.from;
  a.payload = payload;
  return a;
}

/// Σg² per layer of one stage for one update.
struct SumSq {
  int64_t ordinal = 0;
  int32_t stage = 0;
  std::vector<double> per_layer;
  friend bool operator==(const SumSq&, const SumSq&) = default;
};

/// A stage committed its `update`-th update of the run (0-based) at `seconds` since the run
/// started; `times` are its cumulative times then.
struct Commit {
  int32_t stage = 0;
  int64_t update = 0;
  double seconds = 0.0;
  StageTimes times;
  friend bool operator==(const Commit&, const Commit&) = default;
};

/// Why an actor gave up: the driver turns the first one into the run's error.
struct Failure {
  int32_t stage = -1;       ///< -1: the driver itself
  int64_t microbatch = -1;  ///< global microbatch index, -1 when none
  std::string action;       ///< text form of the action, empty when none
  std::string cause;
  friend bool operator==(const Failure&, const Failure&) = default;
};

/// The driver's answer to the engine.
struct RunOutcome {
  bool ok = false;
  std::string error;
  std::vector<double> losses;
  int32_t peak_ahead = 0;
  std::vector<StageTimes> stages;  ///< per stage, as each reported when it finished
  /// A stop was asked of the driver (ActorCallbacks::stop): the run ended early, after the step
  /// in flight (sync modes), or at its end; every process ends its training after this run.
  bool stopped = false;
  /// The run was cut short for a migration (RunState::cut_request): it ended after the step in
  /// flight, and the engine moves layers before it goes on.
  bool cut = false;
  friend bool operator==(const RunOutcome&, const RunOutcome&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, UpdateTicket& x) {
  return f(caf::meta::type_name("UpdateTicket"), x.index, x.handed);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TiedAnnouncement& x) {
  return f(caf::meta::type_name("TiedAnnouncement"), x.key, x.lookahead, x.tied, x.from_stage,
           x.payload);
}

/// Σg² crosses processes as the doubles' bit patterns: CAF 0.17 writes a double through its own
/// pack754, which loops forever on an infinity, turns a NaN into a number and garbles a
/// subnormal, and a non-finite Σg² is what the driver must see. Printed as numbers.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SumSq& x) {
  if constexpr (std::is_same_v<Inspector, caf::serializer> ||
                std::is_same_v<Inspector, caf::deserializer>) {
    std::vector<uint64_t> bits(x.per_layer.size());
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = std::bit_cast<uint64_t>(x.per_layer[i]);
    return f(caf::meta::type_name("SumSq"), x.ordinal, x.stage, bits,
             caf::meta::load_callback([&]() -> caf::error {
               x.per_layer.resize(bits.size());
               for (size_t i = 0; i < bits.size(); ++i)
                 x.per_layer[i] = std::bit_cast<double>(bits[i]);
               return caf::none;
             }));
  } else {
    return f(caf::meta::type_name("SumSq"), x.ordinal, x.stage, x.per_layer);
  }
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Commit& x) {
  return f(caf::meta::type_name("Commit"), x.stage, x.update, x.seconds, x.times);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Failure& x) {
  return f(caf::meta::type_name("Failure"), x.stage, x.microbatch, x.action, x.cause);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RunOutcome& x) {
  return f(caf::meta::type_name("RunOutcome"), x.ok, x.error, x.losses, x.peak_ahead, x.stages,
           x.stopped, x.cut);
}

/// Registers every message type of the engine with a CAF system config, so they can cross
/// processes (both sides must register the same names).
void add_message_types(caf::actor_system_config& cfg);

}  // namespace actorpipe::internal

namespace actorpipe {

/// Serialisation, printing and debugging of an announcement.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Announcement& a) {
  static_assert(Tensor::kMaxDims == 4, "inspect lists every dimension");
  return f(caf::meta::type_name("Announcement"), a.tag, a.sequence, a.microbatch, a.version,
           a.dtype, a.ndim, a.dims[0], a.dims[1], a.dims[2], a.dims[3]);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, MigrationEvent& x) {
  return f(caf::meta::type_name("MigrationEvent"), x.step, x.forced, x.moved, x.from, x.to,
           x.reason, x.imbalance, x.busy, x.speed, x.predicted_now, x.predicted_new, x.layers_moved,
           x.bytes_moved, x.bytes_sent, x.move_seconds, x.decided, x.error);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StageTimes& x) {
  return f(caf::meta::type_name("StageTimes"), x.busy_seconds, x.idle_seconds, x.actions);
}

}  // namespace actorpipe
