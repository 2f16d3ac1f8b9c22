// Process group: one process's place in a multi-process job — its rank, the CAF actor system
// with the middleman, the UCX worker and endpoints to every peer, admission through rank 0's
// coordinator, failure detection, and the all-gather the engine agrees on each run with.
#include "actors/process_group.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <cstring>
#include <mutex>

#include "actors/coordinator.hpp"
#include "actors/internal/messages.hpp"

namespace actorpipe {

namespace {

using gather_atom = caf::atom_constant<caf::atom("gather")>;   // (int64 round, RankPart)
using peer_lost_atom = caf::atom_constant<caf::atom("lost")>;  // (int32 rank, string reason)
using relay_atom = caf::atom_constant<caf::atom("relay")>;  // (actor root, int64 round, RankPart)

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

// The gathering agent: every rank runs one. Rank 0's collects each round's parts and answers
// every contributor once all `world` are in. Every rank's agent relays its own rank's part to
// rank 0's (for rank 0 that is itself), so a rank that learns of a loss fails its gather in
// progress at once, even when rank 0 is the one lost and can answer no more. A lost rank fails
// the rounds in progress and every later one.
struct AgentState {
  struct Round {
    std::map<int, RankPart> parts;
    std::vector<caf::typed_response_promise<std::vector<RankPart>>> waiting;
  };
  int world = 1;
  std::map<int64_t, Round> rounds;                                                // rank 0
  std::map<int64_t, caf::typed_response_promise<std::vector<RankPart>>> relayed;  // own rank
  std::string lost;  // why the job is broken, empty while it is whole
  static inline const char* name = "actorpipe.agent";
};

caf::behavior agent(caf::stateful_actor<AgentState>* self, int world) {
  self->state.world = world;
  return {
      [=](gather_atom, int64_t round, RankPart& part) -> caf::result<std::vector<RankPart>> {
        auto& st = self->state;
        if (!st.lost.empty()) return caf::make_error(caf::sec::runtime_error, st.lost);
        if (part.rank < 0 || part.rank >= st.world)
          return caf::make_error(caf::sec::runtime_error,
                                 fmt::format("gather from rank {} of {}", part.rank, st.world));
        auto& r = st.rounds[round];
        auto rp = self->make_response_promise<std::vector<RankPart>>();
        r.parts[part.rank] = std::move(part);
        r.waiting.push_back(rp);
        if (static_cast<int>(r.parts.size()) == st.world) {
          std::vector<RankPart> all;
          for (auto& [k, p] : r.parts) all.push_back(std::move(p));
          for (auto& w : r.waiting) w.deliver(all);
          st.rounds.erase(round);
        }
        return rp;
      },
      [=](relay_atom, const caf::actor& root, int64_t round,
          RankPart& part) -> caf::result<std::vector<RankPart>> {
        auto& st = self->state;
        if (!st.lost.empty()) return caf::make_error(caf::sec::runtime_error, st.lost);
        auto rp = self->make_response_promise<std::vector<RankPart>>();
        st.relayed.emplace(round, rp);
        auto settle = [=](auto&& answer) {
          auto i = self->state.relayed.find(round);
          if (i == self->state.relayed.end()) return;  // failed by a loss already
          i->second.deliver(std::forward<decltype(answer)>(answer));
          self->state.relayed.erase(i);
        };
        self->request(root, caf::infinite, gather_atom::value, round, std::move(part))
            .then([=](std::vector<RankPart>& all) { settle(std::move(all)); },
                  [=](caf::error& err) { settle(std::move(err)); });
        return rp;
      },
      [=](peer_lost_atom, int32_t rank, const std::string& reason) {
        auto& st = self->state;
        if (st.lost.empty()) st.lost = fmt::format("rank {} was lost: {}", rank, reason);
        for (auto& [k, r] : st.rounds)
          for (auto& w : r.waiting) w.deliver(caf::make_error(caf::sec::runtime_error, st.lost));
        st.rounds.clear();
        for (auto& [k, rp] : st.relayed)
          rp.deliver(caf::make_error(caf::sec::runtime_error, st.lost));
        st.relayed.clear();
      },
  };
}

}  // namespace

struct ProcessGroup::Impl {
  ProcessGroupOptions options;
  std::unique_ptr<caf::actor_system_config> cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::shared_ptr<UcxWorker> ucx;
  std::map<int, UcxEndpoint> peers;
  caf::actor agent;
  std::optional<Coordinator> coordinator;
  JobTable table;
  std::optional<RankWatch> watch;
  int64_t rounds = 0;
  mutable std::mutex mu;
  std::optional<std::string> lost;
  std::function<void(int, const std::string&)> handler;
  std::mutex call_mu;  // held while the handler runs: on_lost() waits for a call in progress

  // Leaves the job: the watcher, the coordinator and the agent end, then the actor system
  // (which waits for every actor), then the UCX endpoints and worker.
  ~Impl() {
    if (watch) watch->stop();
    watch.reset();
    if (coordinator) coordinator->stop();
    coordinator.reset();
    if (agent) caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
    agent = nullptr;
    table = {};
    sys.reset();
    peers.clear();
    ucx.reset();
  }
};

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ProcessGroup::~ProcessGroup() = default;

Expected<std::unique_ptr<ProcessGroup>> ProcessGroup::create(const ProcessGroupOptions& o) {
  if (o.world < 1 || o.rank < 0 || o.rank >= o.world)
    return make_error("process group: rank {} of {} (allowed: 0 <= rank < world)", o.rank, o.world);
  if (o.world > 1 && o.secret.empty())
    return make_error("process group: rank {} of {} has no job secret", o.rank, o.world);
  auto impl = std::make_unique<Impl>();
  impl->options = o;
  impl->cfg = std::make_unique<caf::actor_system_config>();
  caf::actor_system_config& cfg = *impl->cfg;
  internal::add_message_types(cfg);
  add_coordinator_types(cfg);
  cfg.add_message_type<RankPart>("actorpipe::RankPart");
  cfg.add_message_type<std::vector<RankPart>>("std::vector<actorpipe::RankPart>");
  cfg.set("scheduler.max-threads", o.scheduler_threads);
  cfg.set("work-stealing.moderate-poll-attempts", size_t{0});
  // a silent peer (network gone, no FIN) is dropped after peer_timeout; heartbeats keep live
  // connections open
  cfg.set("middleman.heartbeat-interval", caf::timespan{o.peer_timeout / 4});
  cfg.set("middleman.connection-timeout", caf::timespan{o.peer_timeout});
  cfg.load<caf::io::middleman>();
  const bool tls = !o.tls_certificate.empty();
  if (tls) {
    if (Status ok = enable_tls(cfg, TlsFiles{o.tls_certificate, o.tls_key, o.tls_ca}); !ok)
      return make_error("rank {}: {}", o.rank, ok.error().message);
  }
  impl->sys = std::make_unique<caf::actor_system>(cfg);
  caf::actor_system& sys = *impl->sys;

  UcxWorkerOptions uo = o.ucx;
  uo.name = fmt::format("rank {}", o.rank);
  auto worker = UcxWorker::create(uo);
  if (!worker) return make_error("rank {}: {}", o.rank, worker.error().message);
  impl->ucx = *worker;
  impl->agent = sys.spawn(agent, o.world);

  uint16_t port = static_cast<uint16_t>(o.coordinator_port);
  if (o.rank == 0) {
    CoordinatorOptions co;
    co.world = o.world;
    co.secret = o.secret;
    co.bind_address = o.bind;
    co.port = port;
    co.join_timeout = o.connect_timeout;
    co.tls = tls;
    auto c = publish_coordinator(sys, co);
    if (!c) return make_error("rank 0: {}", c.error().message);
    port = c->port();
    impl->coordinator.emplace(std::move(*c));
  }
  RankInfo me;
  me.rank = o.rank;
  me.host = host_name();
  const auto& addr = impl->ucx->address();
  me.transport_address.assign(reinterpret_cast<const char*>(addr.data()),
                              reinterpret_cast<const char*>(addr.data()) + addr.size());
  me.actors = {impl->agent};
  JoinOptions jo;
  jo.host = o.rank == 0 ? std::string("127.0.0.1") : o.coordinator_host;
  if (o.rank == 0 && o.bind != "0.0.0.0" && o.bind != "127.0.0.1") jo.host = o.bind;
  jo.port = port;
  jo.secret = o.secret;
  jo.timeout = o.connect_timeout;
  jo.tls = tls;
  jo.rejoin = o.rejoin;
  auto table = join_coordinator(sys, jo, me);
  if (!table) return make_error("rank {}: {}", o.rank, table.error().message);
  impl->table = std::move(*table);

  for (const RankInfo& peer : impl->table.ranks) {
    if (peer.rank == o.rank) continue;
    std::vector<std::byte> a(peer.transport_address.size());
    std::memcpy(a.data(), peer.transport_address.data(), a.size());
    auto ep = impl->ucx->connect(a);
    if (!ep)
      return make_error("rank {}: a UCX endpoint to rank {} ({}): {}", o.rank, peer.rank, peer.host,
                        ep.error().message);
    impl->peers.emplace(peer.rank, *ep);
  }

  Impl* raw = impl.get();
  auto watch = watch_ranks(sys, impl->table, o.rank, [raw](int rank, const std::string& reason) {
    std::function<void(int, const std::string&)> h;
    {
      std::lock_guard<std::mutex> lock(raw->mu);
      if (raw->lost) return;
      raw->lost = fmt::format("rank {} was lost: {}", rank, reason);
    }
    // leaving the job must not wait for a flush the lost rank never answers
    if (auto p = raw->peers.find(rank); p != raw->peers.end()) raw->ucx->abandon(p->second);
    // our agent fails our gather in progress; rank 0's (when it is another) those of every rank
    caf::anon_send(raw->agent, peer_lost_atom::value, static_cast<int32_t>(rank), reason);
    if (raw->table.ranks[0].actors[0] != raw->agent)
      caf::anon_send(raw->table.ranks[0].actors[0], peer_lost_atom::value,
                     static_cast<int32_t>(rank), reason);
    // the handler in place now, called under call_mu: on_lost() replaces it only after this
    // call has returned (what it touches may end with the run that set it)
    std::lock_guard<std::mutex> call(raw->call_mu);
    {
      std::lock_guard<std::mutex> lock(raw->mu);
      h = raw->handler;
    }
    if (h) h(rank, reason);
  });
  if (!watch) return make_error("rank {}: {}", o.rank, watch.error().message);
  impl->watch.emplace(std::move(*watch));
  return std::unique_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

int ProcessGroup::rank() const {
  return impl_->options.rank;
}

int ProcessGroup::world() const {
  return impl_->options.world;
}

const ProcessGroupOptions& ProcessGroup::options() const {
  return impl_->options;
}

caf::actor_system& ProcessGroup::system() {
  return *impl_->sys;
}

const std::shared_ptr<UcxWorker>& ProcessGroup::ucx() const {
  return impl_->ucx;
}

const std::map<int, UcxEndpoint>& ProcessGroup::peers() const {
  return impl_->peers;
}

int ProcessGroup::coordinator_port() const {
  return impl_->coordinator ? impl_->coordinator->port() : 0;
}

Expected<std::vector<RankPart>> ProcessGroup::all_gather(RankPart mine) {
  if (auto l = lost()) return make_error("rank {}: {}", rank(), *l);
  mine.rank = rank();
  const int64_t round = impl_->rounds++;
  Expected<std::vector<RankPart>> out = make_error("rank {}: no answer", rank());
  caf::scoped_actor self{*impl_->sys};
  self->request(impl_->agent, impl_->options.connect_timeout, relay_atom::value,
                impl_->table.ranks[0].actors[0], round, std::move(mine))
      .receive(
          [&](std::vector<RankPart>& all) {
            if (static_cast<int>(all.size()) != world()) {
              out = make_error("rank {}: {} parts gathered from {} ranks", rank(), all.size(),
                               world());
            } else {
              out = std::move(all);
            }
          },
          [&](caf::error& err) {
            out = make_error("rank {}: agreeing with the other ranks (round {}) failed: {}", rank(),
                             round, impl_->sys->render(err));
          });
  // a gather that timed out while the job broke names the lost rank
  if (!out)
    if (auto l = lost(); l && out.error().message.find(*l) == std::string::npos)
      return make_error("{} ({})", out.error().message, *l);
  return out;
}

Status ProcessGroup::leave() {
  if (auto first = all_gather({}); !first) return first.error();
  if (impl_->watch) impl_->watch->stop();
  impl_->watch.reset();
  if (impl_->coordinator) impl_->coordinator->stop();
  impl_->coordinator.reset();
  if (auto second = all_gather({}); !second) return second.error();
  return {};
}

std::optional<std::string> ProcessGroup::lost() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->lost;
}

void ProcessGroup::on_lost(std::function<void(int, const std::string&)> handler) {
  std::lock_guard<std::mutex> call(impl_->call_mu);  // after a call in progress has returned
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->handler = std::move(handler);
}

}  // namespace actorpipe
