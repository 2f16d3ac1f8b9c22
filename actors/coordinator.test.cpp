// Coordinator tests on 127.0.0.1: message round trips, joins of 2 and 3 ranks in separate
// processes, refusals (secret, rank, node, unknown messages, garbage), timeouts, TLS, rank loss.
#include "actors/coordinator.hpp"

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "actors/internal/cluster_messages.hpp"
#include "tests/support/forked_child.hpp"
#include "tests/support/output_capture.hpp"
#include "tests/support/temp_dir.hpp"

using namespace actorpipe;
using namespace actorpipe::internal;
using actorpipe::testing::Child;
using actorpipe::testing::OutputCapture;
using actorpipe::testing::Pipe;
using actorpipe::testing::TempDir;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

using ping_atom = caf::atom_constant<caf::atom("ping")>;

const std::string kSecret = "s3cret-job-token";
constexpr auto kLong = 30s;  // bound for anything that should take well under a second

// Every actor system of these tests: the middleman, one scheduler thread, the coordinator's
// types; with TLS files, CAF's OpenSSL module too.
struct TestConfig : caf::actor_system_config {
  explicit TestConfig(const TlsFiles* tls = nullptr) {
    set("scheduler.max-threads", 1);
    load<caf::io::middleman>();
    add_coordinator_types(*this);
    if (tls) {
      if (auto s = enable_tls(*this, *tls); !s) throw std::runtime_error(s.error().message);
    }
  }
};

// An actor that is sent an exit when the test leaves its scope, a failed REQUIRE included (an
// actor system waits for its actors when destroyed): declare it after its actor system.
class Ended {
 public:
  explicit Ended(caf::actor a) : a_(std::move(a)) {}
  ~Ended() { caf::anon_send_exit(a_, caf::exit_reason::user_shutdown); }
  Ended(const Ended&) = delete;
  Ended& operator=(const Ended&) = delete;
  operator const caf::actor&() const { return a_; }  // NOLINT: used where an actor is
  const caf::actor& get() const { return a_; }

 private:
  caf::actor a_;
};

// The actor each rank announces: answers ping x with 10x + its rank.
caf::behavior rank_actor(caf::event_based_actor*, int rank) {
  return {[rank](ping_atom, int x) { return 10 * x + rank; }};
}

std::vector<char> transport_bytes(int rank) {
  return {'u', 'c', 'x', static_cast<char>(rank), '\0', static_cast<char>(0xff)};
}

RankInfo rank_info(int rank, caf::actor a) {
  return RankInfo{rank, "127.0.0.1", transport_bytes(rank), {std::move(a)}};
}

JoinOptions join_options(uint16_t port, std::chrono::milliseconds timeout = kLong,
                         std::string secret = kSecret) {
  JoinOptions o;
  o.port = port;
  o.secret = std::move(secret);
  o.timeout = timeout;
  return o;
}

CoordinatorOptions coordinator_options(int world, std::chrono::milliseconds timeout = kLong) {
  CoordinatorOptions o;
  o.world = world;
  o.secret = kSecret;
  o.join_timeout = timeout;
  return o;
}

// One line that names everything in a table, equal in every process that got the same table.
std::string fingerprint(const JobTable& t) {
  std::string s = fmt::format("world={} coordinator={}@{}", t.world, t.coordinator.id(),
                              caf::to_string(t.coordinator.node()));
  for (const auto& r : t.ranks) {
    s += fmt::format(" | rank {} host {} addr ", r.rank, r.host);
    for (char c : r.transport_address) s += fmt::format("{:02x}", static_cast<unsigned char>(c));
    for (const auto& a : r.actors)
      s += fmt::format(" actor {}@{}", a.id(), caf::to_string(a.node()));
  }
  return s;
}

// Sends ping x to `a` and waits for the answer (or the error, rendered).
Expected<int> ping(caf::actor_system& sys, const caf::actor& a, int x) {
  caf::scoped_actor self{sys};
  std::optional<int> got;
  std::string err;
  self->request(a, 10s, ping_atom::value, x)
      .receive([&](int v) { got = v; }, [&](caf::error& e) { err = sys.render(e); });
  if (got) return *got;
  return Error{err};
}

// The error text of a request to `dest` that must fail (the coordinator's text for its own).
std::string request_error(caf::actor_system& sys, const caf::actor& dest, caf::message msg) {
  caf::scoped_actor self{sys};
  std::string err = "<no error>";
  self->request(dest, 10s, std::move(msg))
      .receive([&](caf::message& m) { err = "<answered " + caf::to_string(m) + ">"; },
               [&](caf::error& e) {
                 err = e.category() == coordinator_error_category &&
                               e.context().match_elements<std::string>()
                           ? e.context().get_as<std::string>(0)
                           : sys.render(e);
               });
  return err;
}

// A join running on its own thread (join_coordinator blocks until the table or an error).
std::future<Expected<JobTable>> join_async(caf::actor_system& sys, JoinOptions o, RankInfo info) {
  return std::async(std::launch::async, [&sys, o = std::move(o), info = std::move(info)] {
    return join_coordinator(sys, o, info);
  });
}

Expected<JobTable> get(std::future<Expected<JobTable>>& f) {
  REQUIRE_MESSAGE(f.wait_for(2 * kLong) == std::future_status::ready, "a join did not end");
  return f.get();
}

// A port nothing listens on (bound, read, closed).
uint16_t unused_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

// A raw TCP client of 127.0.0.1:port.
class RawClient {
 public:
  explicit RawClient(uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    REQUIRE(fd_ >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  }
  ~RawClient() { ::close(fd_); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  void send_bytes(const std::vector<unsigned char>& bytes) {
    REQUIRE(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(bytes.size()));
  }
  // Reads (and drops) what the server sends until it closes the connection: true if it did
  // within `limit`.
  bool closed_by_peer_within(Clock::duration limit) {
    const auto deadline = Clock::now() + limit;
    char buf[4096];
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return true;
    }
    return false;
  }

 private:
  int fd_;
};

// What a rank in a child process does: join, report the table, ping every other rank, watch
// (optional), then wait for "quit". Lines to the test: "table <fingerprint>", "ping <rank>
// <answer>", "watching", "lost <rank> <reason>", or "error <message>".
struct RankScript {
  int rank = 0;
  bool watch = false;
  uint16_t port = 0;  // 0: read it from the test first
};

int run_rank(Pipe& to_child, Pipe& from_child, RankScript s) {
  uint16_t port = s.port;
  if (port == 0) {
    auto line = to_child.read_line(kLong);
    if (!line) return 2;
    port = static_cast<uint16_t>(std::stoi(*line));
  }
  TestConfig cfg;
  caf::actor_system sys{cfg};
  Ended me{sys.spawn(rank_actor, s.rank)};
  auto table = join_coordinator(sys, join_options(port), rank_info(s.rank, me));
  if (!table) {
    from_child.write_line("error " + table.error().message);
    return 1;
  }
  from_child.write_line("table " + fingerprint(*table));
  for (int q = 0; q < table->world; ++q) {
    if (q == s.rank) continue;
    auto r = ping(sys, table->ranks[static_cast<size_t>(q)].actors[0], 7);
    from_child.write_line(fmt::format("ping {} {}", q, r ? std::to_string(*r) : r.error().message));
  }
  std::optional<RankWatch> watch;
  if (s.watch) {
    auto w = watch_ranks(sys, *table, s.rank, [&from_child](int rank, const std::string& why) {
      from_child.write_line(fmt::format("lost {} {}", rank, why));
    });
    if (!w) {
      from_child.write_line("error " + w.error().message);
      return 1;
    }
    watch.emplace(std::move(*w));
    from_child.write_line("watching");
  }
  auto cmd = to_child.read_line(2 * kLong);
  watch.reset();
  return cmd && *cmd == "quit" ? 0 : 3;
}

// Both ends of a child rank's conversation with the test.
struct RankChild {
  Pipe to;
  Pipe from;
  std::optional<Child> proc;
  void start(RankScript s) {
    proc.emplace([this, s] { return run_rank(to, from, s); });
  }
};

bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// A fresh P-256 key and a self-signed certificate for CN=`stem`, valid for an hour, that is its
// own CA: dir/<stem>.key, dir/<stem>.crt (cert, key, CA = the cert).
TlsFiles make_credentials(const std::filesystem::path& dir, const std::string& stem) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  REQUIRE(key != nullptr);
  X509* x = X509_new();
  REQUIRE(x != nullptr);
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x),
                   static_cast<long>(std::hash<std::string>{}(stem)&0x7fffffff));
  X509_gmtime_adj(X509_getm_notBefore(x), -60);
  X509_gmtime_adj(X509_getm_notAfter(x), 3600);
  REQUIRE(X509_set_pubkey(x, key) == 1);
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(stem.c_str()), -1, -1, 0);
  X509_set_issuer_name(x, name);
  X509V3_CTX v3;
  X509V3_set_ctx_nodb(&v3);
  X509V3_set_ctx(&v3, x, x, nullptr, nullptr, 0);
  X509_EXTENSION* ext =
      X509V3_EXT_conf_nid(nullptr, &v3, NID_basic_constraints, "critical,CA:TRUE");
  REQUIRE(ext != nullptr);
  X509_add_ext(x, ext, -1);
  X509_EXTENSION_free(ext);
  REQUIRE(X509_sign(x, key, EVP_sha256()) > 0);
  TlsFiles f{(dir / (stem + ".crt")).string(), (dir / (stem + ".key")).string(),
             (dir / (stem + ".crt")).string()};
  FILE* kf = std::fopen(f.key.c_str(), "w");
  REQUIRE(kf != nullptr);
  REQUIRE(PEM_write_PrivateKey(kf, key, nullptr, nullptr, 0, nullptr, nullptr) == 1);
  std::fclose(kf);
  FILE* cf = std::fopen(f.certificate.c_str(), "w");
  REQUIRE(cf != nullptr);
  REQUIRE(PEM_write_X509(cf, x) == 1);
  std::fclose(cf);
  X509_free(x);
  EVP_PKEY_free(key);
  return f;
}

// A BASP header (32 bytes, network byte order) of a client handshake that announces `payload`
// bytes to follow.
std::vector<unsigned char> basp_header_announcing(uint32_t payload) {
  std::vector<unsigned char> h(32, 0);
  h[0] = 0x01;  // client_handshake
  h[4] = static_cast<unsigned char>(payload >> 24);
  h[5] = static_cast<unsigned char>(payload >> 16);
  h[6] = static_cast<unsigned char>(payload >> 8);
  h[7] = static_cast<unsigned char>(payload);
  return h;
}

}  // namespace

TEST_CASE(
    "RankInfo and JobTable and the coordinator's messages round-trip through CAF's "
    "binary serializer") {
  TestConfig cfg;
  caf::actor_system sys{cfg};
  Ended a{sys.spawn(rank_actor, 0)};
  Ended b{sys.spawn(rank_actor, 1)};
  RankInfo r0 = rank_info(0, a);
  RankInfo r1{1, "node-b.example", {}, {b, a}};
  r1.transport_address.resize(300);
  for (size_t i = 0; i < r1.transport_address.size(); ++i) {
    r1.transport_address[i] = static_cast<char>(i * 37);
  }
  JobTable t{2, {r0, r1}, a};

  SUBCASE("RankInfo") {
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};
    REQUIRE(!sink(r1));
    RankInfo back;
    caf::binary_deserializer source{sys, buf};
    REQUIRE(!source(back));
    CHECK(back == r1);
    CHECK(back.actors[0] == b);
  }
  SUBCASE("JobTable") {
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};
    REQUIRE(!sink(t));
    JobTable back;
    caf::binary_deserializer source{sys, buf};
    REQUIRE(!source(back));
    CHECK(back == t);
    CHECK(fingerprint(back) == fingerprint(t));
  }
  SUBCASE("whole messages: join, table answer, rank loss (the registered types)") {
    for (const caf::message& m :
         {caf::make_message(join_atom::value, kSecret, r1), caf::make_message(t),
          caf::make_message(rank_lost_atom::value, 3, std::string{"gone"})}) {
      std::vector<char> buf;
      caf::binary_serializer sink{sys, buf};
      caf::message copy = m;
      REQUIRE(!sink(copy));
      caf::message back;
      caf::binary_deserializer source{sys, buf};
      REQUIRE(!source(back));
      CHECK(caf::to_string(back) == caf::to_string(m));
    }
    caf::message back;
    {
      std::vector<char> buf;
      caf::binary_serializer sink{sys, buf};
      caf::message m = caf::make_message(join_atom::value, kSecret, r1);
      REQUIRE(!sink(m));
      caf::binary_deserializer source{sys, buf};
      REQUIRE(!source(back));
    }
    REQUIRE((back.match_elements<join_atom, std::string, RankInfo>()));
    CHECK(back.get_as<RankInfo>(2) == r1);
  }
}

namespace {

// While set on this thread, operator new records the largest request and refuses one above
// 1 GiB (std::bad_alloc), so a test sees what deserializing a few bytes asks for. Every
// non-aligned form of new and delete is replaced, by malloc and free.
thread_local bool watch_allocations = false;
thread_local size_t largest_allocation = 0;

void* allocate(std::size_t n) noexcept {
  if (watch_allocations) {
    largest_allocation = std::max(largest_allocation, n);
    if (n > (size_t{1} << 30)) return nullptr;
  }
  return std::malloc(n == 0 ? 1 : n);
}

[[maybe_unused]] void* allocate_or_throw(std::size_t n) {
  if (void* p = allocate(n)) return p;
  throw std::bad_alloc();
}

}  // namespace

// Not in the ThreadSanitizer build: there the replaced operator new would put this file's frames
// into every allocation CAF makes, and tsan_filter.awk would take CAF's own reports for ours.
#if defined(__SANITIZE_THREAD__)
constexpr bool kAllocationsWatched = false;
#else
constexpr bool kAllocationsWatched = true;
#if defined(__GNUC__) && !defined(__clang__)
// GCC takes the free() of a replaced operator delete for a mismatch with new
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
// clang-format off
void* operator new(std::size_t n) { return allocate_or_throw(n); }
void* operator new[](std::size_t n) { return allocate_or_throw(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
// clang-format on
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // __SANITIZE_THREAD__

TEST_CASE("a RankInfo whose address claims more bytes than arrived is refused without them") {
  TestConfig cfg;
  caf::actor_system sys{cfg};
  // rank, host, then an address of 2^32 - 1 bytes of which one arrives
  std::vector<char> bytes;
  caf::binary_serializer sink{sys, bytes};
  int rank = 1;
  std::string host = "node-b";
  REQUIRE(!sink(rank, host));
  size_t claimed = 0xFFFFFFFF;
  REQUIRE(!sink.begin_sequence(claimed));
  bytes.push_back('a');

  RankInfo back;
  caf::binary_deserializer source{sys, bytes};
  caf::error err;
  watch_allocations = true;
  largest_allocation = 0;
  bool refused_allocation = false;
  try {
    err = source(back);
  } catch (const std::bad_alloc&) {
    refused_allocation = true;  // the whole claimed length was allocated first (4 GiB)
  }
  watch_allocations = false;
  CHECK_FALSE(refused_allocation);
  if (kAllocationsWatched) CHECK(largest_allocation < (size_t{1} << 20));
  REQUIRE(err);
  CHECK(caf::to_string(err).find("end_of_stream") != std::string::npos);
}

TEST_CASE("two ranks in two processes join and get the same table and the actors in it answer") {
  RankChild c1;
  c1.start({1, false, 0});
  TestConfig cfg;
  caf::actor_system sys{cfg};
  auto coord = publish_coordinator(sys, coordinator_options(2));
  REQUIRE_MESSAGE(coord, coord.error().message);
  c1.to.write_line(std::to_string(coord->port()));
  Ended me{sys.spawn(rank_actor, 0)};
  auto table = join_coordinator(sys, join_options(coord->port()), rank_info(0, me));
  REQUIRE_MESSAGE(table, table.error().message);
  CHECK(table->world == 2);
  REQUIRE(table->ranks.size() == 2);
  CHECK(table->ranks[0] == rank_info(0, me));
  CHECK(table->ranks[1].rank == 1);
  CHECK(table->ranks[1].transport_address == transport_bytes(1));
  CHECK(table->coordinator == coord->actor());

  auto line = c1.from.read_line(kLong);
  REQUIRE(line);
  CHECK(*line == "table " + fingerprint(*table));
  CHECK(c1.from.read_line(kLong) == std::optional<std::string>{"ping 0 70"});
  auto answer = ping(sys, table->ranks[1].actors[0], 4);
  REQUIRE_MESSAGE(answer, answer.error().message);
  CHECK(*answer == 41);

  c1.to.write_line("quit");
  CHECK(c1.proc->wait(kLong) == std::optional<int>{0});
}

TEST_CASE(
    "three ranks in three processes join and get the same table and every rank reaches "
    "every other rank's actor") {
  RankChild c1, c2;
  c1.start({1, false, 0});
  c2.start({2, false, 0});
  TestConfig cfg;
  caf::actor_system sys{cfg};
  auto coord = publish_coordinator(sys, coordinator_options(3));
  REQUIRE_MESSAGE(coord, coord.error().message);
  c1.to.write_line(std::to_string(coord->port()));
  c2.to.write_line(std::to_string(coord->port()));
  Ended me{sys.spawn(rank_actor, 0)};
  auto table = join_coordinator(sys, join_options(coord->port()), rank_info(0, me));
  REQUIRE_MESSAGE(table, table.error().message);
  REQUIRE(table->ranks.size() == 3);
  for (int r = 0; r < 3; ++r) CHECK(table->ranks[static_cast<size_t>(r)].rank == r);
  const std::string expected = "table " + fingerprint(*table);
  for (RankChild* c : {&c1, &c2}) {
    auto line = c->from.read_line(kLong);
    REQUIRE(line);
    CHECK(*line == expected);
  }
  // rank 1 -> ranks 0 and 2 (rank 2 through rank 0's node), rank 2 -> ranks 0 and 1
  CHECK(c1.from.read_line(kLong) == std::optional<std::string>{"ping 0 70"});
  CHECK(c1.from.read_line(kLong) == std::optional<std::string>{"ping 2 72"});
  CHECK(c2.from.read_line(kLong) == std::optional<std::string>{"ping 0 70"});
  CHECK(c2.from.read_line(kLong) == std::optional<std::string>{"ping 1 71"});
  for (int r = 1; r < 3; ++r) {
    auto answer = ping(sys, table->ranks[static_cast<size_t>(r)].actors[0], 5);
    REQUIRE_MESSAGE(answer, answer.error().message);
    CHECK(*answer == 50 + r);
  }
  for (RankChild* c : {&c1, &c2}) {
    c->to.write_line("quit");
    CHECK(c->proc->wait(kLong) == std::optional<int>{0});
  }
}

TEST_CASE("a rank that starts before the coordinator listens keeps trying and joins") {
  const uint16_t port = unused_port();
  TestConfig cfg0, cfg1;
  caf::actor_system sys0{cfg0}, sys1{cfg1};
  Ended a0{sys0.spawn(rank_actor, 0)};
  Ended a1{sys1.spawn(rank_actor, 1)};
  const auto t0 = Clock::now();
  auto early = join_async(sys1, join_options(port), rank_info(1, a1));
  std::this_thread::sleep_for(500ms);  // the rank is refused a few times meanwhile
  auto opts = coordinator_options(2);
  opts.port = port;
  auto coord = publish_coordinator(sys0, opts);
  REQUIRE_MESSAGE(coord, coord.error().message);
  CHECK(coord->port() == port);
  auto t_0 = join_coordinator(sys0, join_options(port), rank_info(0, a0));
  auto t_1 = get(early);
  REQUIRE_MESSAGE(t_0, t_0.error().message);
  REQUIRE_MESSAGE(t_1, t_1.error().message);
  CHECK(*t_0 == *t_1);
  CHECK(Clock::now() - t0 >= 500ms);
}

TEST_CASE(
    "a rejoining rank waits out the previous job's coordinator and joins the next one on the same "
    "port, a first join is refused at once") {
  // the previous job: rank 0 alone, complete, still published
  TestConfig cfg_old, cfg0, cfg1;
  caf::actor_system sys_old{cfg_old};
  OutputCapture log;
  auto old = publish_coordinator(sys_old, coordinator_options(1));
  REQUIRE_MESSAGE(old, old.error().message);
  const uint16_t port = old->port();
  Ended a_old{sys_old.spawn(rank_actor, 0)};
  auto t_old = join_coordinator(sys_old, join_options(port), rank_info(0, a_old));
  REQUIRE_MESSAGE(t_old, t_old.error().message);

  caf::actor_system sys1{cfg1};
  Ended a1{sys1.spawn(rank_actor, 1)};
  // a first start takes the refusal as the answer
  auto first = join_coordinator(sys1, join_options(port), rank_info(0, a1));
  REQUIRE(!first);
  CHECK(contains(first.error().message, "the job is complete"));
  CHECK(!contains(first.error().message, "previous job"));

  // a rejoin keeps trying while the previous job's coordinator answers, then joins the next
  JoinOptions rejoin = join_options(port);
  rejoin.rejoin = true;
  const auto t0 = Clock::now();
  auto j1 = join_async(sys1, rejoin, rank_info(1, a1));
  std::this_thread::sleep_for(700ms);  // refused as the previous job's a few times meanwhile
  old->stop();
  caf::actor_system sys0{cfg0};
  Ended a0{sys0.spawn(rank_actor, 0)};
  auto opts = coordinator_options(2);
  opts.port = port;
  auto next = publish_coordinator(sys0, opts);
  REQUIRE_MESSAGE(next, next.error().message);
  auto t_0 = join_coordinator(sys0, join_options(port), rank_info(0, a0));
  auto t_1 = get(j1);
  log.restore();
  REQUIRE_MESSAGE(t_0, t_0.error().message);
  REQUIRE_MESSAGE(t_1, t_1.error().message);
  CHECK(*t_0 == *t_1);
  CHECK(t_1->world == 2);
  CHECK(Clock::now() - t0 >= 700ms);
  CHECK(contains(log.text(), "the job is complete"));

  // with no next job, a rejoin ends at its timeout and says what it met
  TestConfig cfg2;
  caf::actor_system sys2{cfg2};
  Ended a2{sys2.spawn(rank_actor, 1)};
  rejoin.timeout = 1500ms;
  const auto t1 = Clock::now();
  auto late = join_coordinator(sys2, rejoin, rank_info(1, a2));
  REQUIRE(!late);
  MESSAGE(late.error().message);
  CHECK(contains(late.error().message, "the job is complete"));
  CHECK(contains(late.error().message, "each refused as the previous job's"));
  CHECK(Clock::now() - t1 >= 1500ms);
  CHECK(Clock::now() - t1 < 10s);
}

TEST_CASE("join gives up after its timeout and names the coordinator's address") {
  const uint16_t port = unused_port();
  TestConfig cfg;
  caf::actor_system sys{cfg};
  Ended a{sys.spawn(rank_actor, 0)};
  const auto t0 = Clock::now();
  auto t = join_coordinator(sys, join_options(port, 1200ms), rank_info(0, a));
  const auto took = Clock::now() - t0;
  REQUIRE(!t);
  MESSAGE(t.error().message);
  CHECK(contains(t.error().message, fmt::format("127.0.0.1:{}", port)));
  CHECK(contains(t.error().message, "within 1.2 s"));
  CHECK(contains(t.error().message, "attempt"));
  CHECK(took >= 1200ms);
  CHECK(took < 5s);
}

TEST_CASE("the join timeout answers the waiting ranks with the ranks that are missing") {
  TestConfig cfg0, cfg2;
  caf::actor_system sys0{cfg0}, sys2{cfg2};
  OutputCapture log;
  auto coord = publish_coordinator(sys0, coordinator_options(3, 1500ms));
  REQUIRE_MESSAGE(coord, coord.error().message);
  Ended a0{sys0.spawn(rank_actor, 0)};
  Ended a2{sys2.spawn(rank_actor, 2)};
  const auto t0 = Clock::now();
  auto j0 = join_async(sys0, join_options(coord->port()), rank_info(0, a0));
  auto j2 = join_async(sys2, join_options(coord->port()), rank_info(2, a2));
  auto t_0 = get(j0);
  auto t_2 = get(j2);
  const auto took = Clock::now() - t0;
  log.restore();
  for (auto* t : {&t_0, &t_2}) {
    REQUIRE(!*t);
    MESSAGE(t->error().message);
    CHECK(contains(t->error().message, "rank(s) 1 of 3 did not join within 1.5 s"));
    CHECK(contains(t->error().message, "joined: 0, 2"));
  }
  CHECK(took < 10s);
  CHECK(contains(log.text(), "rank(s) 1 of 3 did not join"));
  // Later joins get the same answer at once.
  TestConfig cfg1;
  caf::actor_system sys1{cfg1};
  Ended a1{sys1.spawn(rank_actor, 1)};
  auto late = join_coordinator(sys1, join_options(coord->port()), rank_info(1, a1));
  REQUIRE(!late);
  CHECK(contains(late.error().message, "rank(s) 1 of 3 did not join"));
}

TEST_CASE(
    "a join with a wrong or missing secret is refused and logged with the node and the job "
    "goes on") {
  TestConfig cfg0, cfg1;
  caf::actor_system sys0{cfg0}, sys1{cfg1};
  OutputCapture log;
  auto coord = publish_coordinator(sys0, coordinator_options(2));
  REQUIRE_MESSAGE(coord, coord.error().message);
  Ended a0{sys0.spawn(rank_actor, 0)};
  Ended a1{sys1.spawn(rank_actor, 1)};
  auto wrong =
      join_coordinator(sys1, join_options(coord->port(), kLong, "guess"), rank_info(1, a1));
  auto none = join_coordinator(sys1, join_options(coord->port(), kLong, ""), rank_info(1, a1));
  // The same node, now with the secret, and rank 0: the job completes.
  auto j0 = join_async(sys0, join_options(coord->port()), rank_info(0, a0));
  auto t_1 = join_coordinator(sys1, join_options(coord->port()), rank_info(1, a1));
  auto t_0 = get(j0);
  log.restore();
  REQUIRE(!wrong);
  CHECK(contains(wrong.error().message, "refused rank 1: the job secret does not match"));
  REQUIRE(!none);
  CHECK(contains(none.error().message, "refused rank 1: the join carries no job secret"));
  REQUIRE_MESSAGE(t_0, t_0.error().message);
  REQUIRE_MESSAGE(t_1, t_1.error().message);
  CHECK(*t_0 == *t_1);
  const std::string text = log.text();
  MESSAGE(text);
  CHECK(contains(text, "refused a join as rank 1 from node " + caf::to_string(sys1.node()) +
                           ": the job secret does not match"));
  CHECK(contains(text, "refused a join as rank 1 from node " + caf::to_string(sys1.node()) +
                           ": the join carries no job secret"));
  CHECK(!contains(text, kSecret));
}

TEST_CASE("messages from a node that has not joined with the secret are refused and logged") {
  TestConfig cfg0, cfg1;
  caf::actor_system sys0{cfg0}, sys1{cfg1};
  OutputCapture log;
  auto coord = publish_coordinator(sys0, coordinator_options(2));
  REQUIRE_MESSAGE(coord, coord.error().message);
  auto remote = sys1.middleman().remote_actor("127.0.0.1", coord->port());
  REQUIRE(remote);
  Ended a0{sys0.spawn(rank_actor, 0)};
  Ended a1{sys1.spawn(rank_actor, 1)};
  const std::string node1 = caf::to_string(sys1.node());
  // A table request, a join without the secret field, anything else.
  CHECK(request_error(sys1, *remote, caf::make_message(table_atom::value)) ==
        "the node has not joined with the job secret");
  CHECK(
      contains(request_error(sys1, *remote, caf::make_message(join_atom::value, rank_info(1, a1))),
               "the node has not joined with the job secret"));
  CHECK(contains(request_error(sys1, *remote, caf::make_message(std::string{"hello"}, 42)),
                 "the node has not joined with the job secret"));
  CHECK(contains(request_error(sys1, *remote, caf::make_message(watch_atom::value)),
                 "the node has not joined with the job secret"));
  // The job goes on; once admitted, the node may ask for the table.
  auto j0 = join_async(sys0, join_options(coord->port()), rank_info(0, a0));
  auto t_1 = join_coordinator(sys1, join_options(coord->port()), rank_info(1, a1));
  auto t_0 = get(j0);
  REQUIRE_MESSAGE(t_0, t_0.error().message);
  REQUIRE_MESSAGE(t_1, t_1.error().message);
  {
    caf::scoped_actor self{sys1};
    std::optional<JobTable> asked;
    self->request(*remote, 10s, table_atom::value)
        .receive([&](JobTable& t) { asked = std::move(t); }, [](caf::error&) {});
    REQUIRE(asked);
    CHECK(*asked == *t_1);
  }
  CHECK(contains(request_error(sys1, *remote, caf::make_message(std::string{"hello"}, 42)),
                 "the coordinator does not understand"));
  log.restore();
  const std::string text = log.text();
  MESSAGE(text);
  CHECK(contains(text, "refused a table request from node " + node1));
  CHECK(contains(text,
                 "refused a message from node " + node1 +
                     ": the node has not joined with the job secret (message (\"hello\", 42))"));
}

TEST_CASE(
    "a duplicate rank or a rank out of range or a node joining twice or a rank without "
    "actors is refused and the job goes on") {
  TestConfig cfg0, cfg1, cfg2;
  caf::actor_system sys0{cfg0}, sys1{cfg1}, sys2{cfg2};
  OutputCapture log;
  auto coord = publish_coordinator(sys0, coordinator_options(3));
  REQUIRE_MESSAGE(coord, coord.error().message);
  const uint16_t port = coord->port();
  Ended a0{sys0.spawn(rank_actor, 0)};
  Ended a1{sys1.spawn(rank_actor, 1)};
  Ended a2{sys2.spawn(rank_actor, 2)};
  auto j0 = join_async(sys0, join_options(port), rank_info(0, a0));
  // Make sure rank 0 is in before the duplicate arrives.
  {
    caf::scoped_actor self{sys0};
    bool in = false;
    for (int i = 0; i < 500 && !in; ++i) {
      self->request(coord->actor(), 10s, table_atom::value)
          .receive([](JobTable&) {},
                   [&](caf::error& e) { in = contains(sys0.render(e), "rank(s) 1, 2 have"); });
      if (!in) std::this_thread::sleep_for(10ms);
    }
    REQUIRE(in);
  }
  auto dup = join_coordinator(sys1, join_options(port), rank_info(0, a1));
  REQUIRE(!dup);
  CHECK(contains(dup.error().message, "rank 0 already joined (from host 127.0.0.1, node " +
                                          caf::to_string(sys0.node()) + ")"));
  for (int bad : {-1, 3, 1000}) {
    auto out = join_coordinator(sys1, join_options(port), rank_info(bad, a1));
    REQUIRE(!out);
    CHECK(contains(out.error().message, fmt::format("rank {} is outside [0, 3)", bad)));
  }
  auto twice = join_coordinator(sys0, join_options(port), rank_info(1, a0));
  REQUIRE(!twice);
  CHECK(contains(twice.error().message, "this node already joined as rank 0"));
  auto no_actor = join_coordinator(sys1, join_options(port), RankInfo{1, "127.0.0.1", {}, {}});
  REQUIRE(!no_actor);
  CHECK(contains(no_actor.error().message, "rank 1 announces no actor"));
  auto t_1 = join_async(sys1, join_options(port), rank_info(1, a1));
  auto t_2 = join_coordinator(sys2, join_options(port), rank_info(2, a2));
  auto t_0 = get(j0);
  auto t_1v = get(t_1);
  REQUIRE_MESSAGE(t_0, t_0.error().message);
  REQUIRE_MESSAGE(t_1v, t_1v.error().message);
  REQUIRE_MESSAGE(t_2, t_2.error().message);
  CHECK(*t_0 == *t_1v);
  CHECK(*t_0 == *t_2);
  // A complete job takes nobody else.
  TestConfig cfg3;
  caf::actor_system sys3{cfg3};
  Ended a3{sys3.spawn(rank_actor, 1)};
  auto late = join_coordinator(sys3, join_options(port), rank_info(1, a3));
  REQUIRE(!late);
  CHECK(contains(late.error().message, "the job is complete: all 3 ranks have joined"));
  log.restore();
  const std::string text = log.text();
  CHECK(contains(text, "refused a join as rank 0 from node " + caf::to_string(sys1.node())));
  CHECK(contains(text, "refused a join as rank 1000 from node " + caf::to_string(sys1.node())));
}

TEST_CASE("bytes that are not BASP close the connection and the coordinator goes on") {
  TestConfig cfg0, cfg1;
  caf::actor_system sys0{cfg0}, sys1{cfg1};
  auto coord = publish_coordinator(sys0, coordinator_options(2));
  REQUIRE_MESSAGE(coord, coord.error().message);
  {
    // 0xff is no BASP operation: CAF drops the connection at the first header.
    RawClient raw(coord->port());
    raw.send_bytes(std::vector<unsigned char>(4096, 0xff));
    CHECK(raw.closed_by_peer_within(10s));
  }
  {
    // Text (an HTTP probe): 'G' = 0x47 is no operation either.
    RawClient raw(coord->port());
    const std::string http = "GET / HTTP/1.1\r\nHost: x\r\nUser-Agent: probe\r\n\r\n";
    REQUIRE(http.size() >= 32);
    raw.send_bytes(std::vector<unsigned char>(http.begin(), http.end()));
    CHECK(raw.closed_by_peer_within(10s));
  }
  // Fewer bytes than a BASP header (32): CAF waits for the rest, the connection stays open
  // (holding nothing but its socket) while the job goes on.
  RawClient short_probe(coord->port());
  short_probe.send_bytes({'G', 'E', 'T', ' ', '/', '\r', '\n', '\r', '\n'});
  CHECK(!short_probe.closed_by_peer_within(300ms));
  Ended a0{sys0.spawn(rank_actor, 0)};
  Ended a1{sys1.spawn(rank_actor, 1)};
  auto j0 = join_async(sys0, join_options(coord->port()), rank_info(0, a0));
  auto t_1 = join_coordinator(sys1, join_options(coord->port(), 10s), rank_info(1, a1));
  auto t_0 = get(j0);
  REQUIRE_MESSAGE(t_0, t_0.error().message);
  REQUIRE_MESSAGE(t_1, t_1.error().message);
  CHECK(*t_0 == *t_1);
}

namespace {

// What a header announcing `payload` bytes costs a coordinator without TLS: rank 0 and the
// coordinator run in a child process; a raw client sends the header, then rank 1 joins.
struct HugeHeaderFigures {
  bool joined = false;
  double join_seconds = 0;  // from the header until rank 1 has the table
  long peak_rss_mib = 0;    // the coordinator's process, before and after
  long baseline_rss_mib = 0;
  bool coordinator_alive = false;
};

HugeHeaderFigures send_huge_header(uint32_t payload) {
  Pipe port_pipe, quit_pipe;
  Child rank0([&] {
    TestConfig cfg;
    caf::actor_system sys{cfg};
    auto coord = publish_coordinator(sys, coordinator_options(2));
    if (!coord) return 1;
    Ended me{sys.spawn(rank_actor, 0)};
    port_pipe.write_line(std::to_string(coord->port()));
    auto t = join_coordinator(sys, join_options(coord->port()), rank_info(0, me));
    static_cast<void>(quit_pipe.read_line(2 * kLong));
    return t ? 0 : 1;
  });
  auto port_line = port_pipe.read_line(kLong);
  REQUIRE(port_line);
  const auto port = static_cast<uint16_t>(std::stoi(*port_line));
  HugeHeaderFigures f;
  f.baseline_rss_mib = rank0.peak_rss_kib() / 1024;
  RawClient raw(port);
  const auto t0 = Clock::now();
  raw.send_bytes(basp_header_announcing(payload));
  {
    TestConfig cfg;
    caf::actor_system sys{cfg};
    Ended me{sys.spawn(rank_actor, 1)};
    auto t = join_coordinator(sys, join_options(port, 60s), rank_info(1, me));
    f.join_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    f.joined = t.ok();
    if (!t) MESSAGE(t.error().message);
  }
  f.peak_rss_mib = rank0.peak_rss_kib() / 1024;
  f.coordinator_alive = !rank0.wait(0ms).has_value();
  quit_pipe.write_line("quit");
  CHECK(rank0.wait(kLong) == std::optional<int>{0});
  return f;
}

void report(const char* what, const HugeHeaderFigures& f) {
  MESSAGE(
      fmt::format("{}: rank 1 joined {} s after the header; the coordinator's process peaked "
                  "at {} MiB (started at {} MiB)",
                  what, fmt::format("{:.2f}", f.join_seconds), f.peak_rss_mib, f.baseline_rss_mib));
}

}  // namespace

TEST_CASE(
    "a BASP header announcing a huge payload costs the coordinator memory but the job "
    "goes on") {
  // CAF 0.17 has no limit: it allocates (and zero-fills) the announced size for the connection
  // as soon as the header is in. 256 MiB keeps the test light; the 4 GiB case is below.
  const HugeHeaderFigures f = send_huge_header(256u << 20);
  report("256 MiB announced", f);
  CHECK(f.joined);
  CHECK(f.coordinator_alive);
  CHECK(f.join_seconds < 20);
  CHECK(f.peak_rss_mib >= 256);
}

// The figure in docs/cluster.md (needs ~5 GB of free memory): run with
//   build/actors/test_actors_coordinator -tc='*largest payload*' --no-skip -s
TEST_CASE("a BASP header announcing the largest payload (4 GiB) (figures)" * doctest::skip()) {
  const HugeHeaderFigures f = send_huge_header(0xffffffffu);
  report("4 GiB - 1 announced", f);
  CHECK(f.joined);
  CHECK(f.coordinator_alive);
}

TEST_CASE("a rank killed with SIGKILL is reported by the watchers of rank 0 and of another rank") {
  RankChild c1, c2;
  c1.start({1, true, 0});
  c2.start({2, false, 0});
  TestConfig cfg;
  caf::actor_system sys{cfg};
  OutputCapture log;
  auto coord = publish_coordinator(sys, coordinator_options(3));
  REQUIRE_MESSAGE(coord, coord.error().message);
  c1.to.write_line(std::to_string(coord->port()));
  c2.to.write_line(std::to_string(coord->port()));
  Ended me{sys.spawn(rank_actor, 0)};
  auto table = join_coordinator(sys, join_options(coord->port()), rank_info(0, me));
  REQUIRE_MESSAGE(table, table.error().message);
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::pair<int, std::string>> lost;
  auto watch = watch_ranks(sys, *table, 0, [&](int rank, const std::string& why) {
    std::lock_guard<std::mutex> g(m);
    lost.emplace_back(rank, why);
    cv.notify_all();
  });
  REQUIRE_MESSAGE(watch, watch.error().message);
  REQUIRE(c1.from.read_until("watching", kLong));
  REQUIRE(c2.from.read_until("ping 1", kLong));
  const auto t0 = Clock::now();
  c2.proc->kill9();
  {
    std::unique_lock<std::mutex> g(m);
    REQUIRE(cv.wait_for(g, 10s, [&] { return !lost.empty(); }));
    CHECK(lost[0].first == 2);
    MESSAGE("rank 0 saw: rank ", lost[0].first, ": ", lost[0].second, " after ",
            std::chrono::duration<double>(Clock::now() - t0).count(), " s");
    CHECK(contains(lost[0].second, "remote_link_unreachable"));
  }
  auto seen = c1.from.read_until("lost ", 10s);
  REQUIRE(seen);
  MESSAGE("rank 1 saw: ", *seen, " after ",
          std::chrono::duration<double>(Clock::now() - t0).count(), " s");
  CHECK(seen->rfind("lost 2 ", 0) == 0);
  CHECK(contains(*seen, "remote_link_unreachable"));
  CHECK(c2.proc->wait(kLong) == std::optional<int>{128 + SIGKILL});
  watch->stop();  // before rank 1 ends: a watcher reports normal ends too
  c1.to.write_line("quit");
  CHECK(c1.proc->wait(kLong) == std::optional<int>{0});
  {
    std::lock_guard<std::mutex> g(m);
    CHECK(lost.size() == 1);
  }
  log.restore();
  CHECK(contains(log.text(), "actorpipe coordinator: lost rank 2"));
}

TEST_CASE("a rank that dies before the job is complete leaves its place to a new process") {
  RankChild first, second;
  first.start({1, false, 0});
  second.start({1, false, 0});
  TestConfig cfg;
  caf::actor_system sys{cfg};
  OutputCapture log;
  auto coord = publish_coordinator(sys, coordinator_options(2));
  REQUIRE_MESSAGE(coord, coord.error().message);
  auto log_has = [&](const std::string& what) {
    for (int i = 0; i < 1000; ++i) {
      if (contains(log.text(), what)) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  };
  first.to.write_line(std::to_string(coord->port()));
  REQUIRE(log_has("rank 1 joined from node"));
  first.proc->kill9();
  CHECK(first.proc->wait(kLong) == std::optional<int>{128 + SIGKILL});
  REQUIRE(log_has("its place is open again"));
  second.to.write_line(std::to_string(coord->port()));
  Ended me{sys.spawn(rank_actor, 0)};
  auto table = join_coordinator(sys, join_options(coord->port()), rank_info(0, me));
  REQUIRE_MESSAGE(table, table.error().message);
  auto line = second.from.read_line(kLong);
  REQUIRE(line);
  CHECK(*line == "table " + fingerprint(*table));
  auto answer = ping(sys, table->ranks[1].actors[0], 2);
  REQUIRE_MESSAGE(answer, answer.error().message);
  CHECK(*answer == 21);
  second.to.write_line("quit");
  CHECK(second.proc->wait(kLong) == std::optional<int>{0});
  log.restore();
  const std::string text = log.text();
  CHECK(contains(text, "rank 1 (node "));
  CHECK(contains(text, "went down before all ranks joined (exit_reason(remote_link_unreachable))"));
}

TEST_CASE("rank 0 killed with SIGKILL is reported by another rank's watcher") {
  Pipe port_pipe, quit_pipe;
  Child rank0([&] {
    TestConfig cfg;
    caf::actor_system sys{cfg};
    auto coord = publish_coordinator(sys, coordinator_options(2));
    if (!coord) return 1;
    port_pipe.write_line(std::to_string(coord->port()));
    Ended me{sys.spawn(rank_actor, 0)};
    auto t = join_coordinator(sys, join_options(coord->port()), rank_info(0, me));
    static_cast<void>(quit_pipe.read_line(2 * kLong));
    return t ? 0 : 1;
  });
  auto port = port_pipe.read_line(kLong);
  REQUIRE(port);
  TestConfig cfg;
  caf::actor_system sys{cfg};
  Ended me{sys.spawn(rank_actor, 1)};
  auto table = join_coordinator(sys, join_options(static_cast<uint16_t>(std::stoi(*port))),
                                rank_info(1, me));
  REQUIRE_MESSAGE(table, table.error().message);
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::pair<int, std::string>> lost;
  auto watch = watch_ranks(sys, *table, 1, [&](int rank, const std::string& why) {
    std::lock_guard<std::mutex> g(m);
    lost.emplace_back(rank, why);
    cv.notify_all();
  });
  REQUIRE_MESSAGE(watch, watch.error().message);
  const auto t0 = Clock::now();
  rank0.kill9();
  {
    std::unique_lock<std::mutex> g(m);
    REQUIRE(cv.wait_for(g, 10s, [&] { return !lost.empty(); }));
    CHECK(lost[0].first == 0);
    CHECK(contains(lost[0].second, "remote_link_unreachable"));
    MESSAGE("rank 1 saw: rank ", lost[0].first, ": ", lost[0].second, " after ",
            std::chrono::duration<double>(Clock::now() - t0).count(), " s");
  }
  CHECK(rank0.wait(kLong) == std::optional<int>{128 + SIGKILL});
  watch->stop();
}

TEST_CASE("watch_ranks checks the table and the rank") {
  TestConfig cfg;
  caf::actor_system sys{cfg};
  Ended a{sys.spawn(rank_actor, 0)};
  JobTable t{2, {rank_info(0, a), RankInfo{1, "h", {}, {}}}, {}};
  auto nop = [](int, const std::string&) {};
  CHECK(
      contains(watch_ranks(sys, t, 2, nop).error().message, "rank 2 is outside the job's [0, 2)"));
  CHECK(contains(watch_ranks(sys, t, 0, nop).error().message, "rank 1 announced no actor"));
  CHECK(contains(watch_ranks(sys, t, 0, {}).error().message, "no handler"));
  t.ranks.pop_back();
  CHECK(contains(watch_ranks(sys, t, 0, nop).error().message, "lists 1 ranks for a world of 2"));
}

TEST_CASE("publish_coordinator and join_coordinator check their options") {
  TestConfig cfg;
  caf::actor_system sys{cfg};
  auto o = coordinator_options(0);
  CHECK(contains(publish_coordinator(sys, o).error().message, "world 0 is not a job size"));
  o = coordinator_options(2);
  o.secret.clear();
  CHECK(contains(publish_coordinator(sys, o).error().message, "secret is empty"));
  o = coordinator_options(2);
  o.tls = true;
  CHECK(contains(publish_coordinator(sys, o).error().message, "call enable_tls"));
  o = coordinator_options(2);
  o.bind_address = "203.0.113.1";  // TEST-NET-3: not an address of this machine
  auto bad = publish_coordinator(sys, o);
  REQUIRE(!bad);
  CHECK(contains(bad.error().message, "cannot listen on 203.0.113.1:0"));
  CHECK(contains(join_coordinator(sys, join_options(0), {}).error().message,
                 "127.0.0.1:0 is incomplete"));
}

TEST_CASE("enable_tls checks the certificate and key and CA files") {
  TempDir dir;
  const TlsFiles a = make_credentials(dir.path, "rank-a");
  const TlsFiles b = make_credentials(dir.path, "rank-b");
  {
    caf::actor_system_config cfg;
    cfg.load<caf::io::middleman>();
    REQUIRE(enable_tls(cfg, a));
    CHECK(cfg.openssl_certificate == a.certificate);
    CHECK(cfg.openssl_cafile == a.ca_file);
  }
  caf::actor_system_config cfg;
  auto missing = a;
  missing.certificate = (dir.path / "nope.crt").string();
  CHECK(contains(enable_tls(cfg, missing).error().message,
                 "TLS certificate " + missing.certificate + ": cannot open the file"));
  auto mismatched = a;
  mismatched.key = b.key;
  CHECK(contains(enable_tls(cfg, mismatched).error().message,
                 "TLS key " + b.key + " does not match the certificate " + a.certificate));
  const std::string junk = (dir.path / "junk.pem").string();
  std::ofstream(junk) << "not a certificate\n";
  auto bad_ca = a;
  bad_ca.ca_file = junk;
  CHECK(contains(enable_tls(cfg, bad_ca).error().message, "TLS CA file " + junk));
  auto bad_cert = a;
  bad_cert.certificate = junk;
  CHECK(contains(enable_tls(cfg, bad_cert).error().message,
                 "TLS certificate " + junk + ": not a PEM certificate"));
  CHECK(cfg.openssl_certificate.empty());
}

TEST_CASE("over TLS ranks join and peers without a trusted certificate are refused") {
  TempDir dir;
  const TlsFiles a = make_credentials(dir.path, "job");
  const TlsFiles other = make_credentials(dir.path, "other-job");
  TestConfig cfg0(&a), cfg1(&a);
  caf::actor_system sys0{cfg0}, sys1{cfg1};
  auto opts = coordinator_options(2);
  opts.tls = true;
  auto coord = publish_coordinator(sys0, opts);
  REQUIRE_MESSAGE(coord, coord.error().message);
  const uint16_t port = coord->port();
  auto tls_join = [&](std::chrono::milliseconds timeout) {
    auto o = join_options(port, timeout);
    o.tls = true;
    return o;
  };
  // Refused at the TLS handshake: a certificate the job's CA did not sign; a node that does not
  // trust the coordinator's certificate; a node without TLS.
  const TlsFiles stranger{other.certificate, other.key, a.ca_file};
  const TlsFiles distrustful{a.certificate, a.key, other.ca_file};
  for (const TlsFiles* f : {&stranger, &distrustful}) {
    TestConfig c(f);
    caf::actor_system s{c};
    Ended x{s.spawn(rank_actor, 1)};
    // retried until the timeout: long enough that a loaded machine completes a handshake, whose
    // refusal is the last error
    auto t = join_coordinator(s, tls_join(4000ms), rank_info(1, x));
    REQUIRE(!t);
    MESSAGE(t.error().message);
    CHECK(contains(t.error().message, "could not connect to the coordinator at 127.0.0.1:" +
                                          std::to_string(port) + " over TLS"));
    CHECK(contains(t.error().message, "disconnect_during_handshake"));
  }
  {
    TestConfig c;
    caf::actor_system s{c};
    Ended x{s.spawn(rank_actor, 1)};
    auto t = join_coordinator(s, join_options(port, 4000ms), rank_info(1, x));
    REQUIRE(!t);
    MESSAGE(t.error().message);
    CHECK(contains(t.error().message, "could not connect"));
  }
  // Bytes that are no TLS handshake never reach BASP: a huge BASP header costs nothing.
  {
    RawClient raw(port);
    raw.send_bytes(basp_header_announcing(0xffffffffu));
    CHECK(raw.closed_by_peer_within(10s));
  }
  {
    RawClient raw(port);
    raw.send_bytes(std::vector<unsigned char>(4096, 0xff));
    CHECK(raw.closed_by_peer_within(10s));
  }
  Ended a0{sys0.spawn(rank_actor, 0)};
  Ended a1{sys1.spawn(rank_actor, 1)};
  auto j0 = join_async(sys0, tls_join(kLong), rank_info(0, a0));
  auto t_1 = join_coordinator(sys1, tls_join(kLong), rank_info(1, a1));
  auto t_0 = get(j0);
  REQUIRE_MESSAGE(t_0, t_0.error().message);
  REQUIRE_MESSAGE(t_1, t_1.error().message);
  CHECK(*t_0 == *t_1);
  auto answer = ping(sys1, t_1->ranks[0].actors[0], 3);
  REQUIRE_MESSAGE(answer, answer.error().message);
  CHECK(*answer == 30);
}

// The figures in docs/cluster.md: run with
//   build/actors/test_actors_coordinator -tc='*round trip*' -s
TEST_CASE("round trip of a small request to another process with and without TLS (figures)") {
  TempDir dir;
  const TlsFiles a = make_credentials(dir.path, "job");
  Pipe ports, quit;
  Child server([&] {
    TestConfig cfg(&a);
    caf::actor_system sys{cfg};
    Ended echo{sys.spawn(rank_actor, 1)};
    auto plain = sys.middleman().publish(echo.get(), 0, "127.0.0.1");
    auto tls = caf::openssl::publish(echo.get(), 0, "127.0.0.1");
    if (!plain || !tls) return 1;
    ports.write_line(fmt::format("{} {}", *plain, *tls));
    static_cast<void>(quit.read_line(2 * kLong));
    return 0;
  });
  auto line = ports.read_line(kLong);
  REQUIRE(line);
  std::istringstream in(*line);
  uint16_t plain_port = 0, tls_port = 0;
  in >> plain_port >> tls_port;
  TestConfig cfg(&a);
  caf::actor_system sys{cfg};
  constexpr int kRequests = 1000;
  struct Figures {
    double connect_ms = 0;
    std::vector<double> rtt_us;
  };
  auto measure = [&](caf::actor_system& s, bool tls) {
    Figures f;
    const auto t0 = Clock::now();
    auto remote = tls ? caf::openssl::remote_actor(s, "127.0.0.1", tls_port)
                      : s.middleman().remote_actor("127.0.0.1", plain_port);
    f.connect_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    REQUIRE(remote);
    caf::scoped_actor self{s};
    for (int rep = 0; rep < 3; ++rep) {
      int ok = 0;
      const auto t1 = Clock::now();
      for (int i = 0; i < kRequests; ++i) {
        self->request(*remote, 10s, ping_atom::value, i)
            .receive([&](int v) { ok += v == 10 * i + 1; }, [](caf::error&) {});
      }
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - t1).count();
      CHECK(ok == kRequests);
      f.rtt_us.push_back(us / kRequests);
    }
    std::sort(f.rtt_us.begin(), f.rtt_us.end());
    return f;
  };
  // A system keeps one connection per node (a second one to the same node is dropped as
  // redundant): each mode gets its own system.
  const Figures tls = measure(sys, true);
  TestConfig cfg_plain;
  caf::actor_system sys_plain{cfg_plain};
  const Figures plain = measure(sys_plain, false);
  MESSAGE(
      fmt::format("{} requests x 3, scoped_actor request/receive, 127.0.0.1, two processes:\n"
                  "  plain: connect {:.2f} ms, round trip {:.0f} / {:.0f} / {:.0f} us "
                  "(min / median / max of 3)\n"
                  "  TLS:   connect {:.2f} ms, round trip {:.0f} / {:.0f} / {:.0f} us",
                  kRequests, plain.connect_ms, plain.rtt_us[0], plain.rtt_us[1], plain.rtt_us[2],
                  tls.connect_ms, tls.rtt_us[0], tls.rtt_us[1], tls.rtt_us[2]));
  quit.write_line("quit");
  CHECK(server.wait(kLong) == std::optional<int>{0});
}
