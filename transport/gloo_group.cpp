// Gloo group: connects a full mesh of Gloo TCP pairs through one exchange of texts, and sums
// float vectors with gloo::alltoall (reduce-scatter), an ordered local sum and gloo::allgather.
#include "transport/gloo_group.hpp"

#include <gloo/allgather.h>
#include <gloo/alltoall.h>
#include <gloo/context.h>
#include <gloo/transport/address.h>
#include <gloo/transport/context.h>
#include <gloo/transport/device.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <optional>
#include <sstream>

namespace actorpipe {

// Rendezvous. Gloo's own way, gloo::rendezvous::Context::connectFullMesh(Store&, device), was
// read in the Debian version (0.0~git20220518.5b14351, gloo/rendezvous/context.cc; the "rank_"
// key is in /usr/lib/libgloo.so.0.5.0 too). Member r:
//   1. store.set("rank_<r>", its host name);
//   2. store.get("rank_<i>") for every i < r, to count the members before it on its host (the
//      pairs' "local rank", which no transport of that version reads);
//   3. creates its size-1 pairs and store.set("<r>", their addresses, in peer order);
//   4. for every i != r in turn: store.wait({"<i>"}), store.get("<i>"), connects pair i.
// So members r > 0 read other members' keys (step 2) before they have set their addresses
// (step 3), while member 0 reads nothing before step 4. A Store that calls `exchange` once on its
// first miss would exchange without the addresses on members r > 0 and with them on member 0;
// no single exchange per member can serve that pattern. (Later Gloo replaced these steps with
// transport::Context::createAndConnectAllPairs and another key layout.) So connect() does
// connectFullMesh's steps itself through Gloo's transport API: creates the pairs, exchanges its
// host name and the pairs' addresses in one text, sets the local rank, connects pair 0, 1, ...
// in connectFullMesh's order; the gloo::Context subclass below adopts the result.

namespace {

constexpr const char* kTextHeader = "actorpipe gloo group 1";

/// A gloo::Context whose device and transport context are connected by GlooGroup::connect.
class MeshContext final : public gloo::Context {
 public:
  using gloo::Context::Context;
  void adopt(std::shared_ptr<gloo::transport::Device> device,
             std::shared_ptr<gloo::transport::Context> transport) {
    device_ = std::move(device);
    transportContext_ = std::move(transport);
  }
};

std::string to_hex(const std::vector<char>& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    s += kDigits[b >> 4];
    s += kDigits[b & 15];
  }
  return s;
}

std::optional<std::vector<char>> from_hex(const std::string& s) {
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (s.size() % 2 != 0) return std::nullopt;
  std::vector<char> bytes(s.size() / 2);
  for (size_t i = 0; i < bytes.size(); ++i) {
    const int hi = digit(s[2 * i]), lo = digit(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    bytes[i] = static_cast<char>(hi * 16 + lo);
  }
  return bytes;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown host";
  return name;
}

/// What one member's text says: its host name and its pair's address towards this member.
struct MemberText {
  std::string host;
  std::vector<char> address;  // empty for this member itself
};

/// Parses member `member`'s text as read by member `me`:
///   actorpipe gloo group 1
///   member <member> of <size>
///   host <hex>
///   pair <peer> <hex>     (one line per other member)
Expected<MemberText> parse_text(const std::string& text, int member, int size, int me) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != kTextHeader)
    return make_error("member {}'s text does not start with \"{}\"", member, kTextHeader);
  MemberText out;
  bool have_host = false, have_pair = member == me;
  std::string word;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    fields >> word;
    if (word == "member") {
      int m = -1, s = -1;
      std::string of;
      fields >> m >> of >> s;
      if (m != member || s != size)
        return make_error("member {}'s text is member {} of {}'s, expected member {} of {}", member,
                          m, s, member, size);
    } else if (word == "host") {
      std::string hex;
      fields >> hex;
      auto bytes = from_hex(hex);
      if (!bytes) return make_error("member {}'s host name is not hex: {}", member, hex);
      out.host.assign(bytes->begin(), bytes->end());
      have_host = true;
    } else if (word == "pair") {
      int peer = -1;
      std::string hex;
      fields >> peer >> hex;
      if (peer != me) continue;
      auto bytes = from_hex(hex);
      if (!bytes || bytes->empty())
        return make_error("member {}'s address for member {} is not hex: {}", member, me, hex);
      out.address = std::move(*bytes);
      have_pair = true;
    }
  }
  if (!have_host) return make_error("member {}'s text has no host line", member);
  if (!have_pair) return make_error("member {}'s text has no address for member {}", member, me);
  return out;
}

}  // namespace

struct GlooGroup::Impl {
  GlooGroupOptions opts;
  std::string who;  // "stage 1's replicas: rank 2 of 4"
  std::shared_ptr<MeshContext> context;
  // scratch: send holds the padded input, then the allgather's result; recv the alltoall's
  // result, whose first chunk becomes the sum
  std::vector<float> send, recv;
  size_t chunk = 0;  // c of the options below; 0: none built
  std::unique_ptr<gloo::AlltoallOptions> alltoall;
  std::unique_ptr<gloo::AllgatherOptions> allgather;
  uint32_t tag = 0;  // per call, the same on every member
  std::optional<Error> failed;
  std::atomic<int64_t> bytes_sent{0};

  /// Buffers of size c floats each and the collectives' options over them.
  void prepare(size_t c) {
    if (c == chunk) return;
    const size_t total = c * static_cast<size_t>(opts.size);
    if (send.size() < total) {
      send.resize(total);
      recv.resize(total);
    }
    alltoall = std::make_unique<gloo::AlltoallOptions>(context);
    alltoall->setInput(send.data(), total);
    alltoall->setOutput(recv.data(), total);
    alltoall->setTimeout(opts.timeout);
    allgather = std::make_unique<gloo::AllgatherOptions>(context);
    allgather->setInput(recv.data(), c);
    allgather->setOutput(send.data(), total);
    allgather->setTimeout(opts.timeout);
    chunk = c;
  }
};

GlooGroup::GlooGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GlooGroup::~GlooGroup() {
  if (!impl_) return;
  // options hold buffers of the context; the context holds the pairs and then the device (its
  // event-loop thread ends with it)
  impl_->alltoall.reset();
  impl_->allgather.reset();
  impl_->context.reset();
}

int GlooGroup::rank() const {
  return impl_->opts.rank;
}
int GlooGroup::size() const {
  return impl_->opts.size;
}
const std::string& GlooGroup::name() const {
  return impl_->opts.name;
}
int64_t GlooGroup::bytes_sent() const {
  return impl_->bytes_sent.load(std::memory_order_relaxed);
}

Expected<std::unique_ptr<GlooGroup>> GlooGroup::connect(const GlooGroupOptions& options,
                                                        const AllGatherText& exchange) {
  const std::string who =
      fmt::format("{}: rank {} of {}", options.name, options.rank, options.size);
  if (options.size < 1)
    return make_error("{}: a group has at least one member, not {}", who, options.size);
  if (options.rank < 0 || options.rank >= options.size)
    return make_error("{}: rank {} is outside 0 .. {}", who, options.rank, options.size - 1);
  if (options.timeout.count() <= 0)
    return make_error("{}: timeout {} ms is not positive", who, options.timeout.count());
  if (!exchange) return make_error("{}: no exchange to meet the other members with", who);

  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  impl->who = who;
  const int me = options.rank, size = options.size;
  try {
    const std::string host = host_name();
    std::shared_ptr<gloo::transport::Device> device;
    std::shared_ptr<gloo::transport::Context> transport;
    std::string mine = fmt::format("{}\nmember {} of {}\nhost {}\n", kTextHeader, me, size,
                                   to_hex(std::vector<char>(host.begin(), host.end())));
    if (size > 1) {
      gloo::transport::tcp::attr attr;
      attr.hostname = options.host;
      device = gloo::transport::tcp::CreateDevice(attr);
      transport = device->createContext(me, size);
      transport->setTimeout(options.timeout);
      for (int i = 0; i < size; ++i) {
        if (i == me) continue;
        auto& pair = transport->createPair(i);
        mine += fmt::format("pair {} {}\n", i, to_hex(pair->address().bytes()));
      }
    }
    auto texts = exchange(std::move(mine));
    if (!texts)
      return make_error("{}: the exchange of addresses failed: {}", who, texts.error().message);
    if (texts->size() != static_cast<size_t>(size))
      return make_error(
          "{}: the exchange of addresses returned {} texts, expected one per member ({})", who,
          texts->size(), size);
    std::vector<MemberText> members;
    members.reserve(size);
    for (int i = 0; i < size; ++i) {
      auto parsed = parse_text((*texts)[i], i, size, me);
      if (!parsed) return make_error("{}: exchange: {}", who, parsed.error().message);
      members.push_back(std::move(*parsed));
    }
    if (size > 1) {
      // connectFullMesh's local rank: the members before this one on its host
      int local_rank = 0;
      for (int i = 0; i < me; ++i) local_rank += members[i].host == host ? 1 : 0;
      for (int i = 0; i < size; ++i) {
        if (i == me) continue;
        auto& pair = transport->getPair(i);
        pair->setLocalRank(local_rank);
        pair->connect(members[i].address);
      }
    }
    impl->context = std::make_shared<MeshContext>(me, size);
    impl->context->setTimeout(options.timeout);
    if (size > 1) impl->context->adopt(std::move(device), std::move(transport));
  } catch (const std::exception& e) {
    return make_error("{}: connecting over Gloo TCP on {} failed: {}", who, options.host, e.what());
  }
  return std::unique_ptr<GlooGroup>(new GlooGroup(std::move(impl)));
}

Status GlooGroup::all_reduce_sum(std::span<float> data) {
  Impl& s = *impl_;
  if (s.failed)
    return make_error(
        "{}: all_reduce_sum of {} floats: the group is unusable after an earlier "
        "error ({})",
        s.who, data.size(), s.failed->message);
  const size_t p = static_cast<size_t>(s.opts.size);
  if (p == 1 || data.empty()) return {};
  const size_t n = data.size();
  const size_t c = (n + p - 1) / p;
  try {
    s.prepare(c);
    float* send = s.send.data();
    float* recv = s.recv.data();
    std::copy(data.begin(), data.end(), send);
    std::fill(send + n, send + p * c, 0.0f);
    // reduce-scatter: recv[r c + j] = member r's element rank c + j
    s.alltoall->setTag(s.tag);
    gloo::alltoall(*s.alltoall);
    // member order: recv[0 .. c) starts as member 0's chunk; members 1, 2, ... are added to it
    for (size_t r = 1; r < p; ++r) {
      const float* x = recv + r * c;
      for (size_t j = 0; j < c; ++j) recv[j] += x[j];
    }
    // send[m c + j] = member m's sum, for every m
    s.allgather->setTag(s.tag);
    gloo::allgather(*s.allgather);
    std::copy(send, send + n, data.begin());
  } catch (const std::exception& e) {
    s.failed = make_error("{}", e.what());
    return make_error("{}: all_reduce_sum of {} floats (call {}) failed: {}", s.who, n, s.tag,
                      e.what());
  }
  ++s.tag;
  s.bytes_sent.fetch_add(static_cast<int64_t>(2 * (p - 1) * c * sizeof(float)),
                         std::memory_order_relaxed);
  return {};
}

}  // namespace actorpipe
