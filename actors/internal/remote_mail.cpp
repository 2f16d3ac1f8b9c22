// Remote mail: CAF's binary serialisation of (address, message) on a UcxMessenger; the receiving
// side deserialises and enqueues the message to the addressed local actor.
#include "actors/internal/remote_mail.hpp"

#include <caf/all.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>

#include "actors/internal/messages.hpp"
#include "kernels/check.hpp"
#include "transport/ucx_messenger.hpp"

namespace actorpipe::internal {

namespace {

std::pair<int, int32_t> key_of(MailAddress a) {
  return {static_cast<int>(a.kind), a.index};
}

std::string describe(MailAddress a) {
  switch (a.kind) {
    case MailAddress::Kind::driver:
      return "the driver";
    case MailAddress::Kind::stage:
      return fmt::format("stage {}", a.index);
    case MailAddress::Kind::shard:
      return fmt::format("stage {}'s optimizer shard", a.index);
  }
  return "?";
}

}  // namespace

int rank_of(const RunState& st, MailAddress to) {
  if (to.kind == MailAddress::Kind::driver) return st.driver_rank;
  AP_CHECK(to.index >= 0 && to.index < static_cast<int>(st.rank_of_stage.size()),
           "{} of a run of {} stages", describe(to), st.rank_of_stage.size());
  return st.rank_of_stage[static_cast<size_t>(to.index)];
}

const caf::actor& actor_at(const RunState& st, MailAddress to) {
  switch (to.kind) {
    case MailAddress::Kind::driver:
      return st.directory.driver;
    case MailAddress::Kind::stage:
      return st.directory.stages.at(static_cast<size_t>(to.index));
    case MailAddress::Kind::shard:
      return st.directory.optimizers.at(static_cast<size_t>(to.index));
  }
  AP_CHECK(false, "an address of no kind");
  return st.directory.driver;
}

RemoteMail::RemoteMail(caf::actor_system& sys, caf::actor driver)
    : sys_(sys), driver_(std::move(driver)) {}

Expected<std::unique_ptr<RemoteMail>> RemoteMail::create(caf::actor_system& sys, const RunState& st,
                                                         std::shared_ptr<UcxWorker> worker,
                                                         int rank,
                                                         const std::map<int, UcxEndpoint>& peers,
                                                         uint32_t stream) {
  std::unique_ptr<RemoteMail> m(new RemoteMail(sys, st.directory.driver));
  if (st.driver_rank == rank) m->local_[key_of(MailAddress::driver())] = st.directory.driver;
  for (int r = 0; r < st.stages; ++r) {
    if (st.rank_of_stage[static_cast<size_t>(r)] != rank) continue;
    m->local_[key_of(MailAddress::stage(r))] = st.directory.stages[static_cast<size_t>(r)];
    m->local_[key_of(MailAddress::shard(r))] = st.directory.optimizers[static_cast<size_t>(r)];
  }
  RemoteMail* self = m.get();
  auto messenger = UcxMessenger::create(
      std::move(worker), rank, peers, stream,
      [self](int from, std::span<const std::byte> bytes) { self->deliver(from, bytes); },
      [self](int, const std::string& error) { self->fail(error); });
  if (!messenger) return messenger.error();
  m->messenger_ = std::move(*messenger);
  return m;
}

RemoteMail::~RemoteMail() {
  messenger_.reset();  // no delivery runs after this
}

bool RemoteMail::send(int rank, MailAddress to, const caf::message& msg) {
  std::vector<char> buf;
  caf::binary_serializer sink{sys_, buf};
  auto kind = static_cast<uint8_t>(to.kind);
  int32_t index = to.index;
  if (auto err = sink(kind, index, const_cast<caf::message&>(msg))) return false;
  return messenger_->send(rank, std::as_bytes(std::span<const char>(buf))).ok();
}

uint64_t RemoteMail::delivered() const {
  return messenger_->delivered();
}

void RemoteMail::deliver(int from, std::span<const std::byte> bytes) {
  auto unreadable = [&](const std::string& why) {
    fail(fmt::format("a control message of {} bytes from rank {} could not be read: {}",
                     bytes.size(), from, why));
  };
  caf::binary_deserializer source{sys_, reinterpret_cast<const char*>(bytes.data()), bytes.size()};
  uint8_t kind = 0;
  int32_t index = 0;
  if (auto err = source(kind, index)) return unreadable(sys_.render(err));
  if (kind > static_cast<uint8_t>(MailAddress::Kind::shard))
    return unreadable(fmt::format("its address has kind {}", kind));
  caf::message msg;
  if (auto err = source(msg)) return unreadable(sys_.render(err));
  if (source.remaining() != 0)
    return unreadable(fmt::format("{} bytes follow the message", source.remaining()));
  const MailAddress to{static_cast<MailAddress::Kind>(kind), index};
  auto it = local_.find(key_of(to));
  if (it == local_.end()) {
    return fail(
        fmt::format("a control message from rank {} for {}, which does not run in this "
                    "process",
                    from, describe(to)));
  }
  caf::anon_send(it->second, std::move(msg));
}

void RemoteMail::fail(const std::string& cause) {
  caf::anon_send(driver_, fail_atom::value, Failure{-1, -1, "", cause});
}

}  // namespace actorpipe::internal
