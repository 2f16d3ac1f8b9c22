// Process groups of two ranks, rank 0 in a forked child: the all-gather agrees on every rank's
// part, and a gather in progress fails within peer_timeout naming the lost rank, whether that
// rank was killed or went silent (stopped, its connection left open: a network gone).
#include "actors/process_group.hpp"

#include <doctest/doctest.h>
#include <signal.h>

#include <chrono>
#include <future>
#include <string>

#include "tests/support/forked_child.hpp"
#include "tests/support/held_port.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kLong = 30s;  // bound for what should take well under a second

ProcessGroupOptions options(int rank, int port) {
  ProcessGroupOptions o;
  o.rank = rank;
  o.world = 2;
  o.coordinator_port = port;
  o.secret = "process-group-test-secret";
  o.connect_timeout = kLong;  // a gather that waited for this would fail the bounds below
  o.peer_timeout = 1s;
  return o;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Rank 0 in a child: joins, reports "joined", gathers once with the text "zero" when told
// "gather" (reporting the texts it got), and stays in the job until told "quit".
int rank0(int port, Pipe& to_child, Pipe& from_child) {
  auto g = ProcessGroup::create(options(0, port));
  if (!g) {
    from_child.write_line("error " + g.error().message);
    return 1;
  }
  from_child.write_line("joined");
  for (;;) {
    auto line = to_child.read_line(2 * kLong);
    if (!line || *line == "quit") return 0;
    if (*line == "gather") {
      auto all = (*g)->all_gather(RankPart{0, {}, "zero"});
      if (!all) {
        from_child.write_line("error " + all.error().message);
        return 1;
      }
      std::string texts;
      for (const auto& p : *all) texts += std::to_string(p.rank) + ":" + p.text + " ";
      from_child.write_line("gathered " + texts);
    }
  }
}

}  // namespace

TEST_CASE("the all-gather gives every rank every rank's part, in rank order") {
  const PortReservation held = held_port();
  const int port = held.port();
  Pipe to_child, from_child;
  Child child([&] { return rank0(port, to_child, from_child); });
  auto g = ProcessGroup::create(options(1, port));
  REQUIRE_MESSAGE(g, g.error().message);
  CHECK(from_child.read_line(kLong) == "joined");
  to_child.write_line("gather");
  auto all = (*g)->all_gather(RankPart{7, {}, "one"});  // the rank is the group's own
  REQUIRE_MESSAGE(all, all.error().message);
  REQUIRE(all->size() == 2);
  CHECK((*all)[0].rank == 0);
  CHECK((*all)[0].text == "zero");
  CHECK((*all)[1].rank == 1);
  CHECK((*all)[1].text == "one");
  CHECK(from_child.read_line(kLong) == "gathered 0:zero 1:one ");
  CHECK(!(*g)->lost());
  to_child.write_line("quit");
  CHECK(child.wait(kLong) == 0);
}

TEST_CASE("a gather in progress fails within peer_timeout when the rank it waits for is lost") {
  // killed: its connections close; stopped: they stay open and only fall silent, as when the
  // network between two hosts goes away (rank 0 holds the round, so it can never answer)
  for (const int sig : {SIGKILL, SIGSTOP}) {
    CAPTURE(sig);
    const PortReservation held = held_port();
    const int port = held.port();
    Pipe to_child, from_child;
    Child child([&] { return rank0(port, to_child, from_child); });
    auto g = ProcessGroup::create(options(1, port));
    REQUIRE_MESSAGE(g, g.error().message);
    REQUIRE(from_child.read_line(kLong) == "joined");
    auto gather = std::async(std::launch::async, [&] {
      return (*g)->all_gather(RankPart{1, {}, "one"});
    });
    std::this_thread::sleep_for(200ms);  // the request is with rank 0
    const auto lost_at = Clock::now();
    child.signal(sig);
    REQUIRE(gather.wait_for(kLong) == std::future_status::ready);
    const double took = seconds_since(lost_at);
    auto all = gather.get();
    REQUIRE(!all);
    MESSAGE(all.error().message << " (" << took << " s after the signal)");
    CHECK(all.error().message.find("rank 0 was lost") != std::string::npos);
    // peer_timeout 1 s plus the heartbeat interval and a loaded machine's slack, far below the
    // 30 s connect_timeout a gather used to wait for
    CHECK(took < 8.0);
    CHECK((*g)->lost());
    // every later gather fails at once
    auto again = (*g)->all_gather({});
    REQUIRE(!again);
    CHECK(again.error().message.find("rank 0 was lost") != std::string::npos);
  }
}
