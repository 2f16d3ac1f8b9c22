// Messages of the actor engine: every type round-trips through CAF's binary serializer, alone
// and inside a message, as it would between processes.
#include "actors/internal/messages.hpp"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <iterator>
#include <limits>

#include "transport/local_channel.hpp"

namespace actorpipe::internal {
namespace {

struct Fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  Fixture() {
    add_message_types(cfg);
    cfg.set("scheduler.max-threads", 1);
    sys = std::make_unique<caf::actor_system>(cfg);
  }

  template <class T>
  T round_trip(T x) {
    std::vector<char> buf;
    caf::binary_serializer sink{*sys, buf};
    REQUIRE_FALSE(sink(x));
    T y{};
    caf::binary_deserializer source{*sys, buf};
    REQUIRE_FALSE(source(y));
    CHECK(source.remaining() == 0);
    return y;
  }
};

Announcement announcement() {
  Announcement a;
  a.tag = 5;
  a.sequence = 1234567890123ULL;
  a.microbatch = -1;
  a.version = 17;
  a.dtype = DType::i32;
  a.ndim = 3;
  a.dims = {8, 256, 384, 0};
  return a;
}

}  // namespace

TEST_CASE("messages: every type round-trips through the binary serializer") {
  Fixture f;
  CHECK(f.round_trip(announcement()) == announcement());
  const StageTimes times{1.25, 0.5, 42};
  CHECK(f.round_trip(times) == times);
  const UpdateTicket ticket{7, 3.5};
  CHECK(f.round_trip(ticket) == ticket);
  const TiedAnnouncement tied{9, 2, 1, 3, announcement()};
  CHECK(f.round_trip(tied) == tied);
  const SumSq sums{4, 2, {1.0, 1e-300, std::nextafter(2.0, 3.0)}};
  CHECK(f.round_trip(sums) == sums);
  const Commit commit{1, 5, 12.75, times};
  CHECK(f.round_trip(commit) == commit);
  const Failure failure{2, 99, "2B7", "non-finite loss nan over 12 targets"};
  CHECK(f.round_trip(failure) == failure);
  const RunOutcome outcome{true, "", {2.5, 2.25}, 3, {times, times}};
  CHECK(f.round_trip(outcome) == outcome);
  MigrationEvent event;
  event.step = 20;
  event.moved = true;
  event.from = {1, 7};
  event.to = {4, 4};
  event.reason = "imbalance 1.3 > 0.15";
  event.imbalance = 1.3;
  event.busy = {0.25, 1.75};
  event.speed = {1.0, 1.0};
  event.predicted_now = 2.5;
  event.predicted_new = 1.25;
  event.layers_moved = 3;
  event.bytes_moved = 1 << 20;
  event.move_seconds = 0.004;
  CHECK(f.round_trip(event) == event);
}

TEST_CASE("messages: Σg² crosses bit for bit, non-finite and subnormal values too") {
  // CAF's own encoding of a double turned a NaN into -1, a subnormal into garbage and looped
  // forever on an infinity (in the sending actor)
  Fixture f;
  const double values[] = {std::nan(""),
                           4.9e-324,
                           -0.0,
                           1e300,
                           std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity()};
  const SumSq sums{7, 1, std::vector<double>(std::begin(values), std::end(values))};
  const SumSq back = f.round_trip(sums);
  CHECK(back.ordinal == 7);
  CHECK(back.stage == 1);
  REQUIRE(back.per_layer.size() == std::size(values));
  for (size_t i = 0; i < std::size(values); ++i) {
    CHECK_MESSAGE(std::bit_cast<uint64_t>(back.per_layer[i]) == std::bit_cast<uint64_t>(values[i]),
                  "value ", i);
  }
  // printed as numbers
  CHECK(caf::deep_to_string(SumSq{1, 0, {0.5}}).find("0.5") != std::string::npos);
}

TEST_CASE("messages: a message holding them crosses as it would between processes") {
  Fixture f;
  const Commit commit{1, 5, 12.75, {1.0, 2.0, 3}};
  const TiedAnnouncement tied{9, 2, 1, 3, announcement()};
  caf::message in = caf::make_message(commit_atom::value, commit, tied, Failure{0, 1, "0F1", "x"});
  std::vector<char> buf;
  caf::binary_serializer sink{*f.sys, buf};
  REQUIRE_FALSE(sink(in));
  caf::message out;
  caf::binary_deserializer source{*f.sys, buf};
  REQUIRE_FALSE(source(out));
  REQUIRE(out.match_elements<commit_atom, Commit, TiedAnnouncement, Failure>());
  CHECK(out.get_as<Commit>(1) == commit);
  CHECK(out.get_as<TiedAnnouncement>(2) == tied);
  CHECK(out.get_as<Failure>(3).cause == "x");
  // a text form for logs, from the same inspect()
  CHECK(caf::to_string(commit).find("Commit") != std::string::npos);
}

TEST_CASE("messages: a tied value's announcement is whole in its payload's announcement") {
  // a channel that delivers its announcements itself hands the receiver only the payload's: the
  // key, the lookahead, the parameter and the sending stage must all come back from it
  const std::vector<ChannelEnds> layout = channel_layout(3, {TiedPair{0, 2}});
  for (const ChannelEnds& ends : layout) {
    if (ends.tied < 0) continue;
    LocalChannel ch(ends);
    for (const auto& [key, lookahead] : {std::pair<int64_t, int>{0, 0}, {7, 0}, {12, 3}}) {
      auto a = post_tied_value(ch, Tensor::zeros({4}), key, lookahead);
      REQUIRE(a.ok());
      CHECK(a->key == key);
      CHECK(a->lookahead == lookahead);
      CHECK(a->tied == 0);
      CHECK(a->from_stage == ends.from);
      CHECK(a->payload.tag == ends.tag);
      CHECK(a->payload.microbatch < 0);  // no microbatch's
      CHECK(tied_announcement(ends, a->payload) == *a);
      CHECK(ch.receive(a->payload).ok());
    }
  }
}

}  // namespace actorpipe::internal
