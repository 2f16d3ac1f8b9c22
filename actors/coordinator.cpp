// Job coordinator: admission by job secret and sender node, the job table once every rank is in,
// joining with retries, TLS through CAF's OpenSSL module, and rank-loss watching.
#include "actors/coordinator.hpp"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "actors/internal/cluster_messages.hpp"

namespace actorpipe {
namespace {

using namespace internal;
using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

caf::error coordinator_error(CoordinatorErrc code, std::string text) {
  return caf::error{static_cast<uint8_t>(code), coordinator_error_category,
                    caf::make_message(std::move(text))};
}

// The coordinator's own text for its errors, CAF's rendering for any other.
std::string describe(caf::actor_system& sys, const caf::error& e) {
  if (e.category() == coordinator_error_category && e.context().match_elements<std::string>()) {
    return e.context().get_as<std::string>(0);
  }
  return sys.render(e);
}

// "1, 3, 4" (ranks), "-" when empty.
std::string rank_list(const std::vector<int>& ranks) {
  if (ranks.empty()) return "-";
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// Equal length and bytes, in time that does not depend on where they differ.
bool same_secret(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

bool is_loopback(const std::string& address) {
  return address == "localhost" || address == "::1" || address.rfind("127.", 0) == 0;
}

// The coordinators published in this process, by actor system and port: a rank that joins a
// coordinator of its own actor system talks to it directly. Connecting to itself costs a
// connection, and over TLS such a connection made while other nodes connect breaks theirs in
// CAF 0.17.6 (their requests time out or find the receiver down).
struct LocalCoordinator {
  std::string bind_address;
  caf::actor_addr actor;
};
using LocalKey = std::pair<const caf::actor_system*, uint16_t>;

std::mutex local_mutex;
std::map<LocalKey, LocalCoordinator> local_coordinators;

caf::actor local_coordinator(const caf::actor_system& sys, const std::string& host, uint16_t port) {
  std::lock_guard<std::mutex> g(local_mutex);
  auto i = local_coordinators.find({&sys, port});
  if (i == local_coordinators.end()) return {};
  if (!is_loopback(host) && host != i->second.bind_address) return {};
  return caf::actor_cast<caf::actor>(i->second.actor);
}

// ---------------------------------------------------------------------------------------------
// The coordinator actor

struct CoordinatorState {
  CoordinatorOptions options;
  Clock::time_point published;
  std::map<int, RankInfo> joined;            // by rank
  std::map<caf::node_id, int> rank_of_node;  // admitted nodes
  std::map<int, caf::node_id> node_of_rank;
  std::map<caf::actor_addr, int> rank_of_actor;                  // the watched actors[0]
  std::map<int, caf::typed_response_promise<JobTable>> waiting;  // by rank
  std::optional<JobTable> table;
  std::string closed;  // why joins are no longer taken (the timeout), empty while open
  std::vector<caf::actor> watchers;
  std::map<int, std::string> lost;  // rank -> reason
  static inline const char* name = "actorpipe.coordinator";
};

using CoordinatorActor = caf::stateful_actor<CoordinatorState>;

std::string node_text(const caf::strong_actor_ptr& sender) {
  return sender ? caf::to_string(sender->node()) : std::string{"<anonymous sender>"};
}

std::vector<int> missing_ranks(const CoordinatorState& st) {
  std::vector<int> out;
  for (int r = 0; r < st.options.world; ++r) {
    if (!st.joined.count(r)) out.push_back(r);
  }
  return out;
}

std::vector<int> joined_ranks(const CoordinatorState& st) {
  std::vector<int> out;
  for (const auto& [r, info] : st.joined) out.push_back(r);
  return out;
}

// Logs a refusal to stderr with the sender's node and returns the error reply.
caf::error refuse(CoordinatorActor* self, const std::string& what, CoordinatorErrc code,
                  std::string why) {
  fmt::print(stderr, "actorpipe coordinator: refused {} from node {}: {}\n", what,
             node_text(self->current_sender()), why);
  std::fflush(stderr);
  return coordinator_error(code, std::move(why));
}

bool admitted(CoordinatorActor* self) {
  const auto& sender = self->current_sender();
  return sender && self->state.rank_of_node.count(sender->node()) > 0;
}

void notify_loss(CoordinatorActor* self, const caf::actor& watcher, int rank,
                 const std::string& reason) {
  self->send(watcher, rank_lost_atom::value, rank, reason);
}

// Every rank is in: build the table, answer every pending join.
void complete(CoordinatorActor* self) {
  auto& st = self->state;
  JobTable t;
  t.world = st.options.world;
  for (auto& [r, info] : st.joined) t.ranks.push_back(info);
  t.coordinator = caf::actor_cast<caf::actor>(self);
  st.table = t;
  for (auto& [r, rp] : st.waiting) rp.deliver(t);
  st.waiting.clear();
  fmt::print(stderr, "actorpipe coordinator: all {} ranks joined after {:.2f} s\n", t.world,
             seconds(Clock::now() - st.published));
  std::fflush(stderr);
}

caf::result<JobTable> on_join(CoordinatorActor* self, const std::string& secret, RankInfo& info) {
  auto& st = self->state;
  const auto& sender = self->current_sender();
  const std::string what = fmt::format("a join as rank {}", info.rank);
  if (!sender) {
    return refuse(self, what, CoordinatorErrc::not_admitted,
                  "the join has no sender to answer (sent anonymously)");
  }
  if (secret.empty()) {
    return refuse(self, what, CoordinatorErrc::wrong_secret, "the join carries no job secret");
  }
  if (!same_secret(secret, st.options.secret)) {
    return refuse(self, what, CoordinatorErrc::wrong_secret,
                  "the job secret does not match this job's");
  }
  if (!st.closed.empty()) return refuse(self, what, CoordinatorErrc::join_closed, st.closed);
  if (st.table) {
    return refuse(self, what, CoordinatorErrc::join_closed,
                  fmt::format("the job is complete: all {} ranks have joined", st.options.world));
  }
  if (info.rank < 0 || info.rank >= st.options.world) {
    return refuse(self, what, CoordinatorErrc::bad_rank,
                  fmt::format("rank {} is outside [0, {}) (the job has {} ranks)", info.rank,
                              st.options.world, st.options.world));
  }
  if (auto i = st.rank_of_node.find(sender->node()); i != st.rank_of_node.end()) {
    return refuse(self, what, CoordinatorErrc::bad_rank,
                  fmt::format("this node already joined as rank {}", i->second));
  }
  if (st.joined.count(info.rank)) {
    const auto& first = st.joined[info.rank];
    return refuse(self, what, CoordinatorErrc::bad_rank,
                  fmt::format("rank {} already joined (from host {}, node {})", info.rank,
                              first.host, caf::to_string(first.actors[0].node())));
  }
  if (info.actors.empty() || !info.actors[0]) {
    return refuse(self, what, CoordinatorErrc::bad_rank,
                  fmt::format("rank {} announces no actor (its first actor is the one watched for "
                              "failures)",
                              info.rank));
  }
  const int rank = info.rank;
  const caf::node_id node = sender->node();  // make_response_promise() takes the sender
  st.rank_of_node.emplace(node, rank);
  st.node_of_rank.emplace(rank, node);
  // Watched from now on: a rank that goes down before the job is complete leaves its place open.
  self->monitor(info.actors[0]);
  st.rank_of_actor[info.actors[0].address()] = rank;
  st.joined.emplace(rank, std::move(info));
  auto rp = self->make_response_promise<JobTable>();
  st.waiting.emplace(rank, rp);
  fmt::print(stderr, "actorpipe coordinator: rank {} joined from node {} ({} of {})\n", rank,
             caf::to_string(node), st.joined.size(), st.options.world);
  std::fflush(stderr);
  if (static_cast<int>(st.joined.size()) == st.options.world) complete(self);
  return rp;
}

// Rank `rank` went down before every rank was in: its place (and its node's) is open again.
void forget(CoordinatorActor* self, int rank, const std::string& reason) {
  auto& st = self->state;
  const caf::node_id node = st.node_of_rank[rank];
  if (auto w = st.waiting.find(rank); w != st.waiting.end()) {
    w->second.deliver(coordinator_error(
        CoordinatorErrc::bad_rank,
        fmt::format("rank {} went down before the job was complete: {}", rank, reason)));
    st.waiting.erase(w);
  }
  st.rank_of_node.erase(node);
  st.node_of_rank.erase(rank);
  st.joined.erase(rank);
  fmt::print(stderr,
             "actorpipe coordinator: rank {} (node {}) went down before all ranks joined ({}); "
             "its place is open again\n",
             rank, caf::to_string(node), reason);
  std::fflush(stderr);
}

void on_deadline(CoordinatorActor* self) {
  auto& st = self->state;
  if (st.table || !st.closed.empty()) return;
  st.closed =
      fmt::format("join timeout: rank(s) {} of {} did not join within {:.1f} s (joined: {})",
                  rank_list(missing_ranks(st)), st.options.world,
                  seconds(std::chrono::duration_cast<Clock::duration>(st.options.join_timeout)),
                  rank_list(joined_ranks(st)));
  fmt::print(stderr, "actorpipe coordinator: {}\n", st.closed);
  std::fflush(stderr);
  for (auto& [r, rp] : st.waiting) {
    rp.deliver(coordinator_error(CoordinatorErrc::join_timeout, st.closed));
  }
  st.waiting.clear();
}

caf::behavior coordinator(CoordinatorActor* self, CoordinatorOptions options) {
  self->state.options = std::move(options);
  self->state.published = Clock::now();
  self->delayed_send(self, self->state.options.join_timeout, deadline_atom::value);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    auto i = st.rank_of_actor.find(dm.source);
    if (i == st.rank_of_actor.end()) return;
    const int rank = i->second;
    const std::string reason = self->system().render(dm.reason);
    st.rank_of_actor.erase(i);
    if (!st.table && st.closed.empty()) {
      forget(self, rank, reason);
      return;
    }
    st.lost.emplace(rank, reason);
    fmt::print(stderr, "actorpipe coordinator: lost rank {} (node {}): {}\n", rank,
               caf::to_string(dm.source.node()), reason);
    std::fflush(stderr);
    for (const auto& w : st.watchers) notify_loss(self, w, rank, reason);
  });
  // Anything the behaviour below does not match: refused, whoever sends it.
  self->set_default_handler(
      [self](caf::scheduled_actor*, caf::message_view& x) -> caf::result<caf::message> {
        std::string text = x.content().stringify();
        if (text.size() > 200) text = text.substr(0, 200) + "...";
        if (admitted(self)) {
          return refuse(self, "a message", CoordinatorErrc::not_admitted,
                        "the coordinator does not understand " + text);
        }
        return refuse(self, "a message", CoordinatorErrc::not_admitted,
                      "the node has not joined with the job secret (message " + text + ")");
      });
  return {
      [self](join_atom, const std::string& secret, RankInfo& info) -> caf::result<JobTable> {
        return on_join(self, secret, info);
      },
      [self](table_atom) -> caf::result<JobTable> {
        auto& st = self->state;
        if (!admitted(self)) {
          return refuse(self, "a table request", CoordinatorErrc::not_admitted,
                        "the node has not joined with the job secret");
        }
        if (!st.table) {
          return coordinator_error(
              CoordinatorErrc::incomplete,
              fmt::format("rank(s) {} have not joined yet", rank_list(missing_ranks(st))));
        }
        return *st.table;
      },
      [self](watch_atom) -> caf::result<void> {
        auto& st = self->state;
        if (!admitted(self)) {
          return refuse(self, "a watch subscription", CoordinatorErrc::not_admitted,
                        "the node has not joined with the job secret");
        }
        auto w = caf::actor_cast<caf::actor>(self->current_sender());
        st.watchers.push_back(w);
        for (const auto& [rank, reason] : st.lost) notify_loss(self, w, rank, reason);
        return caf::unit;
      },
      [self](deadline_atom) {
        // Only the coordinator's own timer closes the join window.
        if (self->current_sender() == caf::actor_cast<caf::strong_actor_ptr>(self)) {
          on_deadline(self);
        }
      },
  };
}

// ---------------------------------------------------------------------------------------------
// The watcher

struct WatchState {
  int self_rank = -1;
  std::map<caf::actor_addr, int> rank_of_actor;
  std::set<int> reported;
  caf::actor coordinator;
  RankLostHandler on_lost;
  static inline const char* name = "actorpipe.rank_watch";
};

using WatchActor = caf::stateful_actor<WatchState>;

void report_loss(WatchActor* self, int rank, const std::string& reason) {
  auto& st = self->state;
  if (rank == st.self_rank || !st.reported.insert(rank).second) return;
  st.on_lost(rank, reason);
}

caf::behavior rank_watcher(WatchActor* self, JobTable table, int self_rank,
                           RankLostHandler on_lost) {
  auto& st = self->state;
  st.self_rank = self_rank;
  st.on_lost = std::move(on_lost);
  st.coordinator = table.coordinator;
  for (const auto& info : table.ranks) {
    if (info.rank == self_rank) continue;
    st.rank_of_actor[info.actors[0].address()] = info.rank;
    self->monitor(info.actors[0]);
  }
  if (st.coordinator) self->send(st.coordinator, watch_atom::value);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto i = self->state.rank_of_actor.find(dm.source);
    if (i != self->state.rank_of_actor.end()) {
      report_loss(self, i->second, self->system().render(dm.reason));
    }
  });
  return {
      [self](rank_lost_atom, int rank, const std::string& reason) {
        if (self->current_sender() !=
            caf::actor_cast<caf::strong_actor_ptr>(self->state.coordinator))
          return;
        report_loss(self, rank, reason + " (seen by the coordinator)");
      },
  };
}

// Ends `a` and waits until it has ended.
void end_and_wait(caf::actor_system& sys, const caf::actor& a) {
  caf::scoped_actor self{sys};
  self->send_exit(a, caf::exit_reason::user_shutdown);
  self->wait_for(a);
}

// ---------------------------------------------------------------------------------------------
// TLS

std::string openssl_errors() {
  std::string msg;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    msg += (msg.empty() ? "" : "; ") + std::string(buf);
  }
  return msg.empty() ? "no OpenSSL error reported" : msg;
}

Status check_readable(const std::string& what, const std::string& path) {
  if (path.empty()) return make_error("TLS {}: no file given (a PEM file is expected)", what);
  std::ifstream f(path);
  if (!f) return make_error("TLS {} {}: cannot open the file for reading", what, path);
  return {};
}

Status tls_configured(caf::actor_system& sys, const char* who) {
  if (!sys.has_openssl_manager() || sys.config().openssl_certificate.empty()) {
    return make_error(
        "{}: TLS was asked for, but the actor system has no OpenSSL module with a certificate "
        "(call enable_tls on its config before creating it)",
        who);
  }
  return {};
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public functions

void add_coordinator_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<RankInfo>("actorpipe::RankInfo");
  cfg.add_message_type<JobTable>("actorpipe::JobTable");
  cfg.add_error_category(
      coordinator_error_category, [](uint8_t code, caf::atom_value, const caf::message& ctx) {
        std::string text =
            ctx.match_elements<std::string>() ? ctx.get_as<std::string>(0) : caf::to_string(ctx);
        return fmt::format("coordinator_error({}, {})",
                           to_string(static_cast<CoordinatorErrc>(code)), text);
      });
}

Status enable_tls(caf::actor_system_config& cfg, const TlsFiles& files) {
  for (const auto& [what, path] :
       {std::pair<const char*, const std::string&>{"certificate", files.certificate},
        {"key", files.key},
        {"CA file", files.ca_file}}) {
    if (auto s = check_readable(what, path); !s) return s;
  }
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  if (!ctx) return make_error("TLS: cannot create an OpenSSL context: {}", openssl_errors());
  Status result;
  // The key first: a certificate loaded after it replaces a key that does not match without an
  // error, which the check below then names.
  if (SSL_CTX_use_PrivateKey_file(ctx, files.key.c_str(), SSL_FILETYPE_PEM) != 1) {
    result = make_error("TLS key {}: not an unencrypted PEM private key OpenSSL accepts: {}",
                        files.key, openssl_errors());
  } else if (SSL_CTX_use_certificate_chain_file(ctx, files.certificate.c_str()) != 1) {
    result = make_error("TLS certificate {}: not a PEM certificate OpenSSL accepts: {}",
                        files.certificate, openssl_errors());
  } else if (SSL_CTX_check_private_key(ctx) != 1) {
    result = make_error("TLS key {} does not match the certificate {}: {}", files.key,
                        files.certificate, openssl_errors());
  } else if (SSL_CTX_load_verify_locations(ctx, files.ca_file.c_str(), nullptr) != 1) {
    result = make_error("TLS CA file {}: no PEM CA certificate OpenSSL accepts: {}", files.ca_file,
                        openssl_errors());
  }
  SSL_CTX_free(ctx);
  if (!result) return result;
  cfg.load<caf::openssl::manager>();
  cfg.openssl_certificate = files.certificate;
  cfg.openssl_key = files.key;
  cfg.openssl_cafile = files.ca_file;
  return {};
}

Coordinator::Coordinator(caf::actor_system& sys, caf::actor actor, uint16_t port)
    : sys_(&sys), actor_(std::move(actor)), port_(port) {}

Coordinator::Coordinator(Coordinator&& other) noexcept
    : sys_(std::exchange(other.sys_, nullptr)),
      actor_(std::move(other.actor_)),
      port_(std::exchange(other.port_, 0)) {}

Coordinator& Coordinator::operator=(Coordinator&& other) noexcept {
  if (this != &other) {
    stop();
    sys_ = std::exchange(other.sys_, nullptr);
    actor_ = std::move(other.actor_);
    port_ = std::exchange(other.port_, 0);
  }
  return *this;
}

Coordinator::~Coordinator() {
  stop();
}

void Coordinator::stop() {
  if (!sys_ || !actor_) return;
  {
    std::lock_guard<std::mutex> g(local_mutex);
    local_coordinators.erase({sys_, port_});
  }
  // The port belongs to the BASP broker, TLS or not: the plain middleman closes it.
  static_cast<void>(sys_->middleman().unpublish(actor_, port_));
  end_and_wait(*sys_, actor_);
  actor_ = caf::actor{};
  sys_ = nullptr;
}

Expected<Coordinator> publish_coordinator(caf::actor_system& sys, CoordinatorOptions options) {
  if (options.world < 1) {
    return make_error("coordinator: world {} is not a job size (at least 1 rank expected)",
                      options.world);
  }
  if (options.secret.empty()) {
    return make_error("coordinator: the job secret is empty (every join must present one)");
  }
  if (options.join_timeout.count() <= 0) {
    return make_error("coordinator: join timeout {} ms is not positive",
                      options.join_timeout.count());
  }
  if (options.bind_address.empty()) {
    return make_error("coordinator: empty bind address (\"127.0.0.1\" for loopback expected)");
  }
  if (!sys.has_middleman()) {
    return make_error(
        "coordinator: the actor system has no middleman "
        "(cfg.load<caf::io::middleman>() before creating it)");
  }
  if (options.tls) {
    if (auto s = tls_configured(sys, "coordinator"); !s) return s.error();
  }
  const std::string bind = options.bind_address;
  const uint16_t wanted = options.port;
  const bool tls = options.tls;
  auto a = sys.spawn(coordinator, std::move(options));
  auto port = tls ? caf::openssl::publish(a, wanted, bind.c_str(), true)
                  : sys.middleman().publish(a, wanted, bind.c_str(), true);
  if (!port) {
    end_and_wait(sys, a);
    return make_error("coordinator: cannot listen on {}:{}{}: {}", bind, wanted,
                      tls ? " (TLS)" : "", sys.render(port.error()));
  }
  if (!tls && !is_loopback(bind)) {
    fmt::print(stderr,
               "actorpipe coordinator: listening on {}:{} without TLS: the job secret and every "
               "control message travel in clear text, and anyone who reaches the port can make "
               "this process allocate up to 4 GiB per connection (see docs/cluster.md)\n",
               bind, *port);
  }
  {
    std::lock_guard<std::mutex> g(local_mutex);
    local_coordinators[{&sys, *port}] = LocalCoordinator{bind, a.address()};
  }
  return Coordinator{sys, std::move(a), *port};
}

Expected<JobTable> join_coordinator(caf::actor_system& sys, const JoinOptions& options,
                                    RankInfo self_info) {
  const std::string where = fmt::format("{}:{}", options.host, options.port);
  if (options.host.empty() || options.port == 0) {
    return make_error("join: coordinator address {} is incomplete (host and a port expected)",
                      where);
  }
  if (options.timeout.count() <= 0) {
    return make_error("join: timeout {} ms is not positive", options.timeout.count());
  }
  if (!sys.has_middleman()) {
    return make_error(
        "join: the actor system has no middleman "
        "(cfg.load<caf::io::middleman>() before creating it)");
  }
  if (options.tls) {
    if (auto s = tls_configured(sys, "join"); !s) return s.error();
  }
  const auto start = Clock::now();
  const auto deadline = start + options.timeout;
  caf::scoped_actor self{sys};
  caf::io::middleman_actor mm =
      options.tls ? sys.openssl_manager().actor_handle() : sys.middleman().actor_handle();
  const int rank = self_info.rank;
  int attempts = 0;
  int stale = 0;  // joins a finished job's coordinator refused (options.rejoin)
  std::string last_refusal;
  auto backoff = std::chrono::milliseconds(50);
  auto pause = [&] {
    const auto p = std::min<Clock::duration>(backoff, deadline - Clock::now());
    if (p > Clock::duration::zero()) std::this_thread::sleep_for(p);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  };
  for (;;) {
    // Connect, retrying with backoff: the coordinator may not be listening yet.
    caf::actor coord = local_coordinator(sys, options.host, options.port);
    std::string last_error = "none";
    // attempts the TLS handshake ended: the cause to name even when a later attempt ended
    // otherwise (a loaded peer that did not answer before the deadline, say)
    int handshakes_refused = 0;
    bool last_in_handshake = false;  // last_error is such a refusal
    while (!coord) {
      const auto left = deadline - Clock::now();
      if (left <= Clock::duration::zero()) break;
      ++attempts;
      self->request(mm,
                    std::chrono::duration_cast<std::chrono::milliseconds>(left) +
                        std::chrono::milliseconds(1),
                    caf::connect_atom::value, options.host, options.port)
          .receive(
              [&](caf::node_id&, caf::strong_actor_ptr& ptr, std::set<std::string>&) {
                if (ptr) {
                  coord = caf::actor_cast<caf::actor>(std::move(ptr));
                } else {
                  last_error = "no actor is published at that port";
                  last_in_handshake = false;
                }
              },
              [&](caf::error& e) {
                // an attempt the deadline cut short says less than the refusal before it
                const bool refused = e == caf::sec::disconnect_during_handshake;
                if (e != caf::sec::request_timeout || last_error == "none") {
                  last_error = sys.render(e);
                  last_in_handshake = refused;
                }
                if (refused) ++handshakes_refused;
              });
      if (coord) break;
      pause();
    }
    if (!coord && stale > 0) {  // the deadline passed after the previous job's refusals
      return make_error(
          "join: the coordinator at {} refused rank {}: {} ({} join(s) over {:.1f} s, each "
          "refused as the previous job's)",
          where, rank, last_refusal, stale, seconds(Clock::now() - start));
    }
    if (!coord) {
      return make_error(
          "join: could not connect to the coordinator at {}{} within {:.1f} s ({} attempt(s); "
          "last error: {}{}){}",
          where, options.tls ? " over TLS" : "", seconds(Clock::now() - start), attempts,
          last_error,
          handshakes_refused > 0 && !last_in_handshake
              ? fmt::format("; {} ended in the handshake: disconnect_during_handshake",
                            handshakes_refused)
              : std::string(),
          handshakes_refused > 0
              ? " (a TLS peer whose certificate the other side refuses, or TLS on one side only, "
                "ends the handshake this way)"
              : "");
    }
    std::optional<JobTable> table;
    std::string refusal;
    bool timed_out = false;
    bool previous_job = false;  // a finished job's coordinator, or one that went away meanwhile
    const auto left =
        std::max<Clock::duration>(deadline - Clock::now(), std::chrono::milliseconds(1));
    self->request(coord, std::chrono::duration_cast<std::chrono::milliseconds>(left),
                  join_atom::value, options.secret, self_info)
        .receive([&](JobTable& t) { table = std::move(t); },
                 [&](caf::error& e) {
                   timed_out = e == caf::sec::request_timeout;
                   previous_job =
                       (e.category() == coordinator_error_category &&
                        e.code() == static_cast<uint8_t>(CoordinatorErrc::join_closed)) ||
                       e == caf::sec::request_receiver_down ||
                       e == caf::exit_reason::remote_link_unreachable;
                   refusal = describe(sys, e);
                 });
    if (table) return std::move(*table);
    if (options.rejoin && previous_job && Clock::now() < deadline) {
      ++stale;
      last_refusal = refusal;
      pause();
      continue;
    }
    if (timed_out) {
      return make_error(
          "join: connected to the coordinator at {} but got no job table within {:.1f} s as rank "
          "{} (the other ranks have not all joined)",
          where, seconds(Clock::now() - start), rank);
    }
    return make_error("join: the coordinator at {} refused rank {}: {}{}", where, rank, refusal,
                      stale > 0 ? fmt::format(" ({} join(s) over {:.1f} s, each refused as the "
                                              "previous job's)",
                                              stale + 1, seconds(Clock::now() - start))
                                : std::string());
  }
}

RankWatch::RankWatch(caf::actor_system& sys, caf::actor watcher)
    : sys_(&sys), watcher_(std::move(watcher)) {}

RankWatch::RankWatch(RankWatch&& other) noexcept
    : sys_(std::exchange(other.sys_, nullptr)), watcher_(std::move(other.watcher_)) {}

RankWatch& RankWatch::operator=(RankWatch&& other) noexcept {
  if (this != &other) {
    stop();
    sys_ = std::exchange(other.sys_, nullptr);
    watcher_ = std::move(other.watcher_);
  }
  return *this;
}

RankWatch::~RankWatch() {
  stop();
}

void RankWatch::stop() {
  if (!sys_ || !watcher_) return;
  end_and_wait(*sys_, watcher_);
  watcher_ = caf::actor{};
  sys_ = nullptr;
}

Expected<RankWatch> watch_ranks(caf::actor_system& sys, const JobTable& table, int self_rank,
                                RankLostHandler on_lost) {
  if (!on_lost) return make_error("watch: no handler for lost ranks");
  if (self_rank < 0 || self_rank >= table.world) {
    return make_error("watch: rank {} is outside the job's [0, {})", self_rank, table.world);
  }
  if (static_cast<int>(table.ranks.size()) != table.world) {
    return make_error("watch: the table lists {} ranks for a world of {}", table.ranks.size(),
                      table.world);
  }
  for (int r = 0; r < table.world; ++r) {
    const auto& info = table.ranks[static_cast<size_t>(r)];
    if (info.rank != r) {
      return make_error("watch: entry {} of the table is rank {} (tables are by rank)", r,
                        info.rank);
    }
    if (r != self_rank && (info.actors.empty() || !info.actors[0])) {
      return make_error("watch: rank {} announced no actor to watch", r);
    }
  }
  auto w = sys.spawn(rank_watcher, table, self_rank, std::move(on_lost));
  return RankWatch{sys, std::move(w)};
}

}  // namespace actorpipe
