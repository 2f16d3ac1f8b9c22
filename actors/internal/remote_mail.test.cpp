// Remote mail tests: two UCX workers of this process stand for two ranks of a job; messages that
// send_to addresses to an actor of the other rank arrive there whole and in order without CAF's
// middleman; one too long for the messenger and those to an actor of the sender's own rank take
// CAF; an unreadable message or one for an actor the rank does not hold fails the run, naming
// the cause.
#include "actors/internal/remote_mail.hpp"

#include <doctest/doctest.h>

#include <caf/all.hpp>
#include <chrono>
#include <string>
#include <vector>

#include "actors/internal/messages.hpp"
#include "transport/tools/ucx_test_job.hpp"
#include "transport/ucx_messenger.hpp"

namespace actorpipe::internal {
namespace {

using namespace std::chrono_literals;

using test::why;

// Function actors here take an argument: CAF 0.17 spawns one without any through a null
// std::tuple<> pointer, which UBSan reports.

/// An actor that hands every message on to `to`, prefixed by its name.
caf::behavior forwarder(caf::event_based_actor* self, std::string name, caf::actor to) {
  self->set_default_handler(
      [name, to](caf::scheduled_actor*, caf::message_view& m) -> caf::result<caf::message> {
        caf::anon_send(to, name, m.move_content_to_message());
        return caf::message{};
      });
  return {[](int) {}};  // every real message goes through the default handler
}

/// Two ranks of a run of two stages, stage r on rank r, the driver on rank 0 (st0 and st1: each
/// rank's view of it); every actor is a forwarder to `self` named by its role, so the test sees
/// who got what.
struct TwoRanks {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::unique_ptr<caf::scoped_actor> self;
  std::map<std::string, caf::actor> actors;
  RunState st0, st1;
  test::UcxTestJob job = test::connected_workers(2);

  TwoRanks() {
    add_message_types(cfg);
    cfg.set("scheduler.max-threads", 1);
    sys = std::make_unique<caf::actor_system>(cfg);
    self = std::make_unique<caf::scoped_actor>(*sys);
    for (std::string name : {"driver", "stage 0", "stage 1", "shard 0", "shard 1"})
      actors[name] = sys->spawn(forwarder, name, caf::actor{*self});
    for (int rank : {0, 1}) {
      RunState& st = rank == 0 ? st0 : st1;
      st.stages = 2;
      st.rank_of_stage = {0, 1};
      st.driver_rank = 0;
      st.rank = rank;
      st.directory.driver = actors.at("driver");
      st.directory.stages = {actors.at("stage 0"), actors.at("stage 1")};
      st.directory.optimizers = {actors.at("shard 0"), actors.at("shard 1")};
    }
  }
  ~TwoRanks() {
    for (auto& [name, a] : actors) (*self)->send_exit(a, caf::exit_reason::user_shutdown);
  }

  /// Rank `rank`'s remote mail on `stream`, made its run state's mail.
  std::unique_ptr<RemoteMail> mail(int rank, uint32_t stream) {
    RunState& st = rank == 0 ? st0 : st1;
    auto m = RemoteMail::create(*sys, st, job.workers[static_cast<size_t>(rank)], rank,
                                job.peers[static_cast<size_t>(rank)], stream);
    REQUIRE_MESSAGE(m.ok(), why(m));
    st.mail = m->get();
    return std::move(*m);
  }
};

}  // namespace

TEST_CASE(
    "remote mail: send_to reaches the other rank's actors in order, and its own through CAF") {
  TwoRanks t;
  caf::scoped_actor& self = *t.self;
  auto m0 = t.mail(0, 11);
  auto m1 = t.mail(1, 11);

  // rank 1's stage sends the driver (rank 0) losses and a commit; rank 0's driver sends rank
  // 1's shard a scale and its stage microbatches; rank 1's shard sends rank 0's shard a tied
  // announcement; rank 0 sends its own stage 0 a microbatch (CAF: same rank)
  const Commit commit{1, 0, 1.5, {0.25, 0.5, 7}};
  const TiedAnnouncement tied{3, 0, 0, 1, Announcement{}};
  auto sender = t.sys->spawn(
      [&](caf::event_based_actor* a, int) -> caf::behavior {
        for (int64_t mb = 0; mb < 50; ++mb)
          send_to(a, t.st1, MailAddress::driver(), loss_atom::value, mb, uint64_t{42} + mb,
                  int64_t{8});
        send_to(a, t.st1, MailAddress::driver(), commit_atom::value, commit);
        send_to(a, t.st0, MailAddress::shard(1), scale_atom::value, int64_t{4}, 0.5f);
        for (int64_t mb = 0; mb < 3; ++mb)
          send_to(a, t.st0, MailAddress::stage(1), mb_atom::value, mb);
        send_to(a, t.st1, MailAddress::shard(0), tgrad_atom::value, tied);
        send_to(a, t.st0, MailAddress::stage(0), mb_atom::value, int64_t{99});
        return {};
      },
      0);
  std::vector<int64_t> losses, mbs_at_1;
  int commits = 0, scales = 0, tgrads = 0, own = 0;
  for (int i = 0; i < 50 + 1 + 1 + 3 + 1 + 1; ++i) {
    self->receive(
        [&](const std::string& who, caf::message& m) {
          if (who == "driver" && m.match_elements<loss_atom, int64_t, uint64_t, int64_t>()) {
            CHECK(m.get_as<uint64_t>(2) == 42 + static_cast<uint64_t>(m.get_as<int64_t>(1)));
            losses.push_back(m.get_as<int64_t>(1));
          } else if (who == "driver" && m.match_elements<commit_atom, Commit>()) {
            CHECK(m.get_as<Commit>(1) == commit);
            ++commits;
          } else if (who == "shard 1" && m.match_elements<scale_atom, int64_t, float>()) {
            CHECK(m.get_as<int64_t>(1) == 4);
            CHECK(m.get_as<float>(2) == 0.5f);
            ++scales;
          } else if (who == "stage 1" && m.match_elements<mb_atom, int64_t>()) {
            mbs_at_1.push_back(m.get_as<int64_t>(1));
          } else if (who == "shard 0" && m.match_elements<tgrad_atom, TiedAnnouncement>()) {
            CHECK(m.get_as<TiedAnnouncement>(1) == tied);
            ++tgrads;
          } else if (who == "stage 0" && m.match_elements<mb_atom, int64_t>()) {
            CHECK(m.get_as<int64_t>(1) == 99);
            ++own;
          } else {
            FAIL("unexpected message to ", who, ": ", caf::to_string(m));
          }
        },
        caf::after(10s) >> [&] { FAIL("a message did not arrive"); });
  }
  std::vector<int64_t> in_order(50);
  for (int64_t i = 0; i < 50; ++i) in_order[static_cast<size_t>(i)] = i;
  CHECK(losses == in_order);
  CHECK(mbs_at_1 == std::vector<int64_t>{0, 1, 2});
  CHECK(commits == 1);
  CHECK(scales == 1);
  CHECK(tgrads == 1);
  CHECK(own == 1);
  // everything but the same-rank microbatch crossed on UCX
  CHECK(m0->delivered() == 50 + 1 + 1);
  CHECK(m1->delivered() == 1 + 3);
  self->send_exit(sender, caf::exit_reason::user_shutdown);
}

TEST_CASE("remote mail: a message too long for the messenger takes CAF") {
  TwoRanks t;
  caf::scoped_actor& self = *t.self;
  auto m0 = t.mail(0, 12);
  auto m1 = t.mail(1, 12);
  SumSq big{7, 1, std::vector<double>(4096, 0.125)};  // 32 KiB of sums: over the 16 KiB limit
  auto sender = t.sys->spawn(
      [&](caf::event_based_actor* a, int) -> caf::behavior {
        send_to(a, t.st1, MailAddress::driver(), sumsq_atom::value, big);
        return {};
      },
      0);
  self->receive(
      [&](const std::string& who, caf::message& m) {
        CHECK(who == "driver");
        REQUIRE(m.match_elements<sumsq_atom, SumSq>());
        CHECK(m.get_as<SumSq>(1) == big);
      },
      caf::after(10s) >> [&] { FAIL("the sums did not arrive"); });
  CHECK(m0->delivered() == 0);
  self->send_exit(sender, caf::exit_reason::user_shutdown);
}

TEST_CASE("remote mail: an unreadable message and one for an actor of another rank fail the run") {
  TwoRanks t;
  caf::scoped_actor& self = *t.self;
  // rank 0 is a bare messenger on the same stream, sending what it likes
  auto raw = UcxMessenger::create(t.job.workers[0], 0, t.job.peers[0], 13, {}, {});
  REQUIRE_MESSAGE(raw.ok(), why(raw));
  auto m1 = t.mail(1, 13);
  auto expect_failure = [&](const std::string& words) {
    self->receive(
        [&](const std::string& who, caf::message& m) {
          CHECK(who == "driver");
          REQUIRE(m.match_elements<fail_atom, Failure>());
          const std::string cause = m.get_as<Failure>(1).cause;
          CHECK_MESSAGE(cause.find(words) != std::string::npos, cause);
          CHECK_MESSAGE(cause.find("rank 0") != std::string::npos, cause);
        },
        caf::after(10s) >> [&] { FAIL("no failure reached the driver"); });
  };
  const std::vector<std::byte> garbage(40, std::byte{0xAB});
  REQUIRE((*raw)->send(1, garbage).ok());
  expect_failure("could not be read");
  // a well-formed message for the driver, which runs on rank 0, not on rank 1
  std::vector<char> buf;
  caf::binary_serializer sink{*t.sys, buf};
  uint8_t kind = static_cast<uint8_t>(MailAddress::Kind::driver);
  int32_t index = 0;
  caf::message msg = caf::make_message(credit_atom::value, int64_t{3});
  REQUIRE_FALSE(sink(kind, index, msg));
  REQUIRE((*raw)->send(1, std::as_bytes(std::span<const char>(buf))).ok());
  expect_failure("for the driver, which does not run in this process");
}

}  // namespace actorpipe::internal
