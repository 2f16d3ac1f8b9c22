// UCX channel: posts start tag sends that hold the tensor until UCX is done with it; receives
// post a tag receive into a pooled buffer and wait on a condition variable with a deadline.
#include "transport/ucx_channel.hpp"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "kernels/backend_memory.hpp"
#include "kernels/check.hpp"
#include "transport/local_channel.hpp"
#include "transport/ucx_messenger.hpp"

namespace actorpipe {

namespace {

/// "UCX channel 2 (1 -> 2)"
std::string channel_name(const ChannelEnds& e) {
  return fmt::format("UCX channel {} ({} -> {})", e.tag, e.from, e.to);
}

/// Bytes of the payload `a` announces, or an error naming the channel and what is wrong with its
/// metadata.
Expected<size_t> announced_bytes(const ChannelEnds& ends, const Announcement& a) {
  auto bytes = payload_bytes(a);
  if (!bytes) return make_error("{}: {}", channel_name(ends), bytes.error().message);
  if (a.sequence > kUcxMaxSequence)
    return make_error("{}: announcement {} has sequence {}, above the largest a UCX tag holds ({})",
                      channel_name(ends), to_string(a), a.sequence, kUcxMaxSequence);
  return bytes;
}

constexpr size_t kMaxAnnouncementMessage =
    sizeof(Announcement) + sizeof(UcxLentHeader) + kUcxMaxKeyBytes;

}  // namespace

/// A lent payload announced and not received yet (receiver).
struct UcxChannel::LentPayload {
  uint32_t chunk = 0;
  uint64_t offset = 0;
  uint64_t chunk_address = 0;
  uint64_t chunk_length = 0;
  std::vector<std::byte> key;  // in State::keys only (a chunk's), not per payload
  std::string error;           // what was wrong with the message ("" when nothing)
};

/// A chunk of the sender's arena mapped into the receiving process; unmapped when the last
/// tensor viewing it goes.
struct UcxChannel::Attached {
  std::shared_ptr<UcxWorker> worker;
  uint64_t id = 0;
  std::byte* address = nullptr;
  uint64_t length = 0;
  ~Attached() { worker->detach_shared(id); }
};

/// What the completions of operations in flight update; they may outlive the channel.
struct UcxChannel::State {
  std::mutex mu;
  std::condition_variable cv;
  // sender
  uint64_t next_sequence = 0;
  size_t in_flight = 0;
  uint64_t generation = 0;  // clear() starts a new one; older sends no longer count
  std::optional<Error> send_error;
  // receiver: receives that timed out, by operation id, until UCX hands their buffer back
  std::set<uint64_t> abandoned;
  // receiver with carry_announcements: the handler, and the receive of the next announcement
  // (its operation and sequence); closed once clear() ran: nothing is handed on or posted after
  TensorChannel::AnnouncementHandler handler;
  uint64_t announcement_op = 0;
  uint64_t announcement_sequence = 0;
  bool closed = false;
  // a lost peer (interrupt()): receives end with this until clear()
  std::optional<std::string> interrupted;
  ChannelTraffic traffic;  // sender
  // sender with an arena: tensors lent, by sequence, until the receiver hands each back (with
  // the receive of that message), and the chunks whose key the receiver has
  struct Lent {
    Tensor tensor;
    uint64_t op = 0;
  };
  std::map<uint64_t, Lent> lent;
  std::set<uint32_t> keyed;
  // receiver: lent payloads announced and not received yet, by sequence; each chunk's key
  std::map<uint64_t, LentPayload> lent_in;
  std::map<uint32_t, LentPayload> keys;
};

void UcxChannel::receive_announcement(const std::shared_ptr<UcxWorker>& worker,
                                      const std::shared_ptr<State>& st, uint32_t tag,
                                      uint64_t sequence) {
  // an announcement, or one of a lent tensor (shared_memory) with its UcxLentHeader and key
  auto buffer = std::make_shared<std::vector<std::byte>>(kMaxAnnouncementMessage);
  std::weak_ptr<UcxWorker> weak = worker;
  const uint64_t op = worker->tag_recv(
      buffer->data(), buffer->size(), ucx_tag(tag | kUcxAnnouncementTagBit, sequence),
      [st, weak, tag, sequence, buffer](const Status& s, size_t length) {
        TensorChannel::AnnouncementHandler h;
        Announcement a;
        {
          std::lock_guard<std::mutex> lock(st->mu);
          if (!s.ok() || length < sizeof(Announcement) || st->closed || !st->handler) return;
          h = st->handler;
          std::memcpy(&a, buffer->data(), sizeof(Announcement));
          if (length > sizeof(Announcement)) note_lent(*st, a, *buffer, length);
        }
        h(a);
        if (auto w = weak.lock()) receive_announcement(w, st, tag, sequence + 1);
      });
  bool cancel = false;
  {
    std::lock_guard<std::mutex> lock(st->mu);
    // the completion may have posted the next one already: keep the newest
    if (sequence >= st->announcement_sequence) {
      st->announcement_op = op;
      st->announcement_sequence = sequence;
    }
    cancel = st->closed;
  }
  if (cancel) worker->cancel(op);  // clear() ran meanwhile: it must not take a later message
}

void UcxChannel::note_lent(State& st, const Announcement& a, const std::vector<std::byte>& msg,
                           size_t length) {
  LentPayload p;
  UcxLentHeader h;
  if (length < sizeof(Announcement) + sizeof(UcxLentHeader)) {
    p.error = fmt::format(
        "its message has {} B, neither an announcement ({} B) nor one of a lent "
        "tensor (at least {} B)",
        length, sizeof(Announcement), sizeof(Announcement) + sizeof(UcxLentHeader));
  } else {
    std::memcpy(&h, msg.data() + sizeof(Announcement), sizeof(UcxLentHeader));
    const size_t key_bytes = length - sizeof(Announcement) - sizeof(UcxLentHeader);
    if (h.magic != UcxLentHeader::kMagic) {
      p.error = fmt::format("its lent-tensor header has magic {:#x}, not {:#x}", h.magic,
                            UcxLentHeader::kMagic);
    } else if (h.key_bytes != key_bytes) {
      p.error =
          fmt::format("its lent-tensor header says {} B of key, {} B came", h.key_bytes, key_bytes);
    } else if (key_bytes > 0) {
      LentPayload k;
      k.chunk = h.chunk;
      k.chunk_address = h.chunk_address;
      k.chunk_length = h.chunk_length;
      const std::byte* kb = msg.data() + sizeof(Announcement) + sizeof(UcxLentHeader);
      k.key.assign(kb, kb + key_bytes);
      st.keys[h.chunk] = std::move(k);
    }
  }
  if (p.error.empty()) {
    auto k = st.keys.find(h.chunk);
    if (k == st.keys.end()) {
      p.error = fmt::format("it lends a tensor in chunk {}, whose key never came", h.chunk);
    } else {
      p.chunk = h.chunk;  // its address and length; the key stays in `keys` until it is mapped
      p.offset = h.offset;
      p.chunk_address = k->second.chunk_address;
      p.chunk_length = k->second.chunk_length;
    }
  }
  st.lent_in[a.sequence] = std::move(p);
}

namespace {

/// One receive: filled by its completion on the progress thread, read by receive().
struct RecvWait {
  std::atomic<bool> arrived{false};  // set with `done`, read without the lock while spinning
  bool done = false;
  bool abandoned = false;
  uint64_t op = 0;
  Status status;
  size_t length = 0;
};

}  // namespace

UcxChannel::UcxChannel(std::shared_ptr<UcxWorker> worker, ChannelEnds ends, End end,
                       UcxEndpoint peer, UcxChannelOptions options)
    : TensorChannel(ends),
      worker_(std::move(worker)),
      end_(end),
      peer_(peer),
      opts_(options),
      state_(std::make_shared<State>()) {
  AP_CHECK(worker_ != nullptr, "{}: no UCX worker", name());
  AP_CHECK(ends.tag <= kUcxMaxChannelTag, "{}: tag {} does not fit the 16 bits of a UCX tag",
           name(), ends.tag);
  AP_CHECK(opts_.receive_timeout.count() >= 0, "{}: receive_timeout = {} ms", name(),
           opts_.receive_timeout.count());
  AP_CHECK(opts_.pool_capacity >= 0, "{}: pool_capacity = {}", name(), opts_.pool_capacity);
  AP_CHECK(!opts_.carry_announcements || ends.tag < kUcxAnnouncementTagBit,
           "{}: tag {} leaves no bit to mark its announcements", name(), ends.tag);
  AP_CHECK(ends.tag != kUcxExchangeChannelTag, "{}: tag {} is ucx_exchange's", name(), ends.tag);
  AP_CHECK(ends.tag != kUcxMessengerChannelTag, "{}: tag {} is the UCX messenger's", name(),
           ends.tag);
  if (end_ == End::sender && opts_.shared_memory) {
    if (!opts_.carry_announcements) {
      shared_note_ = "shared memory needs the announcements on the channel (carry_announcements)";
    } else if (ends.tag >= kUcxSharedMaxChannelTag) {
      shared_note_ = fmt::format(
          "tag {} is beyond the tags whose release messages have room "
          "({} at most)",
          ends.tag, kUcxSharedMaxChannelTag - 1);
    } else {
      auto arena = UcxSharedArena::create(worker_, peer_, fmt::format("{}'s arena", name()),
                                          opts_.shared_chunk_bytes);
      if (!arena)
        shared_note_ = arena.error().message;
      else if (const size_t k = (*arena)->chunk(0).key.size(); k > kUcxMaxKeyBytes)
        shared_note_ = fmt::format(
            "UCX packs its key in {} B, more than the {} B an "
            "announcement carries",
            k, kUcxMaxKeyBytes);
      else
        arena_ = std::move(*arena);
    }
  }
}

std::unique_ptr<UcxChannel> UcxChannel::sender(std::shared_ptr<UcxWorker> worker, ChannelEnds ends,
                                               UcxEndpoint peer, UcxChannelOptions options) {
  AP_CHECK(peer.id >= 0, "{}: the sending end needs an endpoint", channel_name(ends));
  return std::unique_ptr<UcxChannel>(
      new UcxChannel(std::move(worker), ends, End::sender, peer, options));
}

std::unique_ptr<UcxChannel> UcxChannel::receiver(std::shared_ptr<UcxWorker> worker,
                                                 ChannelEnds ends, UcxChannelOptions options,
                                                 UcxEndpoint peer) {
  return std::unique_ptr<UcxChannel>(
      new UcxChannel(std::move(worker), ends, End::receiver, peer, options));
}

UcxChannel::~UcxChannel() {
  clear();  // cancels receives that timed out; their buffers go when UCX hands them back
}

std::string UcxChannel::name() const {
  return channel_name(ends());
}

Expected<Announcement> UcxChannel::post(Tensor tensor, int64_t microbatch, int32_t version) {
  AP_CHECK(end_ == End::sender, "{}: post() on the receiving end", name());
  if (!tensor.defined())
    return make_error("{}: posting an undefined tensor for microbatch {}", name(), microbatch);
  // host-staged: a tensor in a device's memory goes out from a host copy (its writer has
  // synchronised, as for every tensor posted), in a pooled buffer UCX hands back when sent
  if (!tensor.host_readable()) {
    std::lock_guard<std::mutex> pool_lock(recv_mu_);
    Tensor staged = acquire(tensor.dtype(), tensor.shape(), tensor.nbytes());
    tensor.memory()->to_host(static_cast<float*>(staged.storage()->data()),
                             static_cast<const float*>(tensor.storage()->data()) + tensor.offset(),
                             tensor.nbytes() / sizeof(float));  // every dtype: 4-byte elements
    tensor = std::move(staged);
  }
  Announcement a;
  a.tag = ends().tag;
  a.microbatch = microbatch;
  a.version = version;
  a.dtype = tensor.dtype();
  a.ndim = tensor.dim();
  for (int i = 0; i < tensor.dim(); ++i) a.dims[static_cast<size_t>(i)] = tensor.size(i);
  const size_t bytes = tensor.nbytes();
  const void* data = static_cast<const std::byte*>(tensor.storage()->data()) +
                     tensor.offset() * dtype_size(tensor.dtype());
  // a tensor in the arena is lent: its announcement says where its bytes lie
  std::optional<UcxSharedPlace> place;
  if (arena_ != nullptr && tensor.memory() == arena_.get()) place = arena_->locate(data, bytes);
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->send_error)
      return make_error("{}: not posting microbatch {}: {}", name(), microbatch,
                        state_->send_error->message);
    AP_CHECK(state_->next_sequence <= kUcxMaxSequence, "{}: sequence numbers exhausted", name());
    a.sequence = state_->next_sequence++;
    state_->in_flight += place ? 1 : opts_.carry_announcements ? 2 : 1;
    generation = state_->generation;
    if (place) {
      ++state_->traffic.lent;
    } else {
      ++state_->traffic.copied;
      state_->traffic.copied_bytes += bytes;
    }
  }
  if (place) {
    lend(std::move(tensor), a, *place, generation);
    return a;
  }
  worker_->tag_send(
      peer_, data, bytes, ucx_tag(a.tag, a.sequence),
      [st = state_, ends = ends(), a, generation, keep = std::move(tensor)](const Status& s,
                                                                            size_t) mutable {
        keep = Tensor();  // the producer may reuse the storage once no one else holds it
        {
          std::lock_guard<std::mutex> lock(st->mu);
          if (generation == st->generation) {
            --st->in_flight;
            if (!s.ok() && !st->send_error)
              st->send_error = make_error("{}: the send of {} failed: {}", channel_name(ends),
                                          to_string(a), s.error().message);
          }
        }
        st->cv.notify_all();
      });
  if (opts_.carry_announcements) {
    auto header = std::make_shared<Announcement>(a);
    worker_->tag_send(peer_, header.get(), sizeof(Announcement),
                      ucx_tag(a.tag | kUcxAnnouncementTagBit, a.sequence),
                      [st = state_, ends = ends(), header, generation](const Status& s, size_t) {
                        {
                          std::lock_guard<std::mutex> lock(st->mu);
                          if (generation == st->generation) {
                            --st->in_flight;
                            if (!s.ok() && !st->send_error)
                              st->send_error = make_error("{}: the announcement {} failed: {}",
                                                          channel_name(ends), to_string(*header),
                                                          s.error().message);
                          }
                        }
                        st->cv.notify_all();
                      });
  }
  return a;
}

void UcxChannel::lend(Tensor tensor, const Announcement& a, UcxSharedPlace place,
                      uint64_t generation) {
  UcxLentHeader h;
  h.chunk = place.chunk;
  h.offset = place.offset;
  bool first_use = false;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    first_use = state_->keyed.insert(place.chunk).second;
    state_->lent[a.sequence].tensor = std::move(tensor);
  }
  // the chunk's place and key go once, with its first tensor; later ones name the chunk only
  UcxSharedRegion chunk;
  if (first_use) {
    chunk = arena_->chunk(place.chunk);
    AP_CHECK(chunk.key.size() <= kUcxMaxKeyBytes, "{}: a packed key of {} B (at most {})", name(),
             chunk.key.size(), kUcxMaxKeyBytes);
    h.chunk_address = reinterpret_cast<uint64_t>(chunk.address);
    h.chunk_length = chunk.length;
    h.key_bytes = static_cast<uint32_t>(chunk.key.size());
  }
  auto msg = std::make_shared<std::vector<std::byte>>(sizeof(Announcement) + sizeof(UcxLentHeader) +
                                                      h.key_bytes);
  std::memcpy(msg->data(), &a, sizeof(Announcement));
  std::memcpy(msg->data() + sizeof(Announcement), &h, sizeof(UcxLentHeader));
  if (first_use)
    std::memcpy(msg->data() + sizeof(Announcement) + sizeof(UcxLentHeader), chunk.key.data(),
                chunk.key.size());
  // the receiver's hand-back, received before the announcement goes (it cannot come earlier)
  const uint64_t sequence = a.sequence;
  const uint64_t op =
      worker_->tag_recv(nullptr, 0, ucx_tag(a.tag | kUcxReleaseTagBit, sequence),
                        [st = state_, generation, sequence](const Status&, size_t) {
                          Tensor back;  // dropped after the lock: its pool may reuse it now
                          {
                            std::lock_guard<std::mutex> lock(st->mu);
                            if (generation != st->generation) return;
                            auto it = st->lent.find(sequence);
                            if (it == st->lent.end()) return;
                            back = std::move(it->second.tensor);
                            st->lent.erase(it);
                          }
                        });
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (auto it = state_->lent.find(sequence); it != state_->lent.end()) it->second.op = op;
  }
  worker_->tag_send(
      peer_, msg->data(), msg->size(), ucx_tag(a.tag | kUcxAnnouncementTagBit, a.sequence),
      [st = state_, ends = ends(), msg, a, generation](const Status& s, size_t) {
        {
          std::lock_guard<std::mutex> lock(st->mu);
          if (generation == st->generation) {
            --st->in_flight;
            if (!s.ok() && !st->send_error)
              st->send_error = make_error("{}: the announcement of lent {} failed: {}",
                                          channel_name(ends), to_string(a), s.error().message);
          }
        }
        st->cv.notify_all();
      });
}

BackendMemory* UcxChannel::send_memory() {
  return arena_.get();
}

ChannelTraffic UcxChannel::traffic() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->traffic;
}

size_t UcxChannel::lent() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->lent.size();
}

bool UcxChannel::announces() const {
  return end_ == End::sender && opts_.carry_announcements;
}

bool UcxChannel::on_announcement(AnnouncementHandler handler) {
  if (end_ != End::receiver || !opts_.carry_announcements) return false;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    AP_CHECK(!state_->handler && !state_->closed,
             "{}: an announcement handler was installed already", name());
    state_->handler = std::move(handler);
  }
  receive_announcement(worker_, state_, ends().tag, 0);
  return true;
}

Tensor UcxChannel::acquire(DType dtype, const std::vector<int64_t>& shape, size_t bytes) {
  for (const auto& s : pool_) {
    if (s->bytes() == bytes && s.use_count() == 1) {
      // the last other holder's reads happen before UCX writes into it again
      std::atomic_thread_fence(std::memory_order_acquire);
      return Tensor(s, 0, shape, dtype);
    }
  }
  auto fresh = std::make_shared<Storage>(bytes, Device::cpu);
  if (pool_.size() < static_cast<size_t>(opts_.pool_capacity)) {
    pool_.push_back(fresh);
  } else {
    for (auto& s : pool_) {
      if (s.use_count() == 1) {  // an idle buffer of another size makes room
        s = fresh;
        break;
      }
    }
  }
  return Tensor(std::move(fresh), 0, shape, dtype);
}

void UcxChannel::reserve(DType dtype, const std::vector<int64_t>& shape, int count) {
  AP_CHECK(end_ == End::receiver, "{}: reserve() on the sending end", name());
  const size_t bytes = static_cast<size_t>(actorpipe::numel(shape)) * dtype_size(dtype);
  std::lock_guard<std::mutex> lock(recv_mu_);
  std::vector<Tensor> held;  // hold each so the next acquire() allocates a new one
  for (int i = 0; i < count; ++i) held.push_back(acquire(dtype, shape, bytes));
}

size_t UcxChannel::pool_size() const {
  std::lock_guard<std::mutex> lock(recv_mu_);
  return pool_.size();
}

Expected<Tensor> UcxChannel::receive(const Announcement& a) {
  AP_CHECK(end_ == End::receiver, "{}: receive() on the sending end", name());
  if (a.tag != ends().tag)
    return make_error("{}: announcement {} belongs to channel {}", name(), to_string(a), a.tag);
  auto bytes = announced_bytes(ends(), a);
  if (!bytes.ok()) return bytes.error();

  std::lock_guard<std::mutex> recv_lock(recv_mu_);
  std::optional<LentPayload> lent;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->interrupted)
      return make_error("{}: not receiving {}: {}", name(), to_string(a), *state_->interrupted);
    if (auto it = state_->lent_in.find(a.sequence); it != state_->lent_in.end()) {
      lent = std::move(it->second);
      state_->lent_in.erase(it);
    }
  }
  if (lent) return receive_lent(a, *bytes, *lent);
  Tensor buffer = acquire(a.dtype, a.shape(), *bytes);
  auto wait = std::make_shared<RecvWait>();
  const uint64_t op = worker_->tag_recv(
      buffer.storage()->data(), *bytes, ucx_tag(a.tag, a.sequence),
      [st = state_, wait, keep = buffer](Status s, size_t length) mutable {
        keep = Tensor();  // UCX is done writing: the buffer is the receiver's (or the pool's)
        {
          std::lock_guard<std::mutex> lock(st->mu);
          wait->done = true;
          wait->arrived.store(true, std::memory_order_release);
          wait->status = std::move(s);
          wait->length = length;
          if (wait->abandoned) st->abandoned.erase(wait->op);
        }
        st->cv.notify_all();
      });

  // Progress UCX on this thread a little before sleeping: a payload that lands meanwhile then
  // costs no wake-up of this thread nor of the progress thread.
  if (opts_.spin_before_wait.count() > 0 && !wait->arrived.load(std::memory_order_acquire)) {
    const auto spin_end = std::chrono::steady_clock::now() + opts_.spin_before_wait;
    worker_->begin_wait();
    while (!wait->arrived.load(std::memory_order_acquire) &&
           std::chrono::steady_clock::now() < spin_end) {
      if (!worker_->poll()) std::this_thread::yield();
    }
    worker_->end_wait(!wait->arrived.load(std::memory_order_acquire));
  }
  std::unique_lock<std::mutex> lock(state_->mu);
  wait->op = op;
  if (!state_->cv.wait_for(lock, opts_.receive_timeout,
                           [&] { return wait->done || state_->interrupted.has_value(); }) ||
      !wait->done) {
    wait->abandoned = true;
    state_->abandoned.insert(op);
    const std::optional<std::string> why = state_->interrupted;
    lock.unlock();
    worker_->cancel(op);
    if (why) {
      return make_error(
          "{}: the payload for sequence {} (microbatch {}, announcement {}) will "
          "not come: {}",
          name(), a.sequence, a.microbatch, to_string(a), *why);
    }
    return make_error(
        "{}: no payload for sequence {} (microbatch {}, announcement {}) within {} ms; is the "
        "sending process gone?",
        name(), a.sequence, a.microbatch, to_string(a), opts_.receive_timeout.count());
  }
  Status status = std::move(wait->status);
  const size_t length = wait->length;
  lock.unlock();
  if (!status.ok())
    return make_error("{}: receiving {}: {}", name(), to_string(a), status.error().message);
  if (length != *bytes)
    return make_error("{}: {} B arrived for announcement {}, which announces {} B", name(), length,
                      to_string(a), *bytes);
  return buffer;
}

Expected<Tensor> UcxChannel::receive_lent(const Announcement& a, size_t bytes,
                                          const LentPayload& lent) {
  if (!lent.error.empty())
    return make_error("{}: the announcement of {}: {}", name(), to_string(a), lent.error);
  if (lent.offset > lent.chunk_length || bytes > lent.chunk_length - lent.offset)
    return make_error("{}: {} lends {} B at offset {} of chunk {}, which has {} B", name(),
                      to_string(a), bytes, lent.offset, lent.chunk, lent.chunk_length);
  if (peer_.id < 0)
    return make_error("{}: {} is lent, but this end has no endpoint to hand it back", name(),
                      to_string(a));
  std::shared_ptr<Attached>& at = attached_[lent.chunk];
  if (at == nullptr) {  // the chunk's first tensor here: map it
    std::vector<std::byte> key;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (auto k = state_->keys.find(lent.chunk); k != state_->keys.end()) key = k->second.key;
    }
    auto r = worker_->attach_shared(peer_, key, lent.chunk_address);
    if (!r)
      return make_error("{}: mapping chunk {} of the sender's arena for {}: {}", name(), lent.chunk,
                        to_string(a), r.error().message);
    at = std::make_shared<Attached>();
    at->worker = worker_;
    at->id = r->id;
    at->address = r->address;
    at->length = lent.chunk_length;
  }
  // the tensor views the sender's memory; its last holder hands it back
  auto storage = std::make_shared<Storage>(
      at->address + lent.offset, bytes,
      [at, worker = worker_, peer = peer_, tag = ucx_tag(a.tag | kUcxReleaseTagBit, a.sequence)](
          void*) { worker->tag_send(peer, nullptr, 0, tag, [](const Status&, size_t) {}); });
  return Tensor(std::move(storage), 0, a.shape(), a.dtype);
}

size_t UcxChannel::pending() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return end_ == End::sender ? state_->in_flight : state_->abandoned.size();
}

void UcxChannel::clear() {
  std::set<uint64_t> cancel;
  std::map<uint64_t, State::Lent> lent;  // dropped after the lock
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    ++state_->generation;
    lent.swap(state_->lent);
    for (const auto& [sequence, l] : lent) cancel.insert(l.op);
    state_->keyed.clear();
    state_->lent_in.clear();
    state_->keys.clear();
    state_->in_flight = 0;
    state_->send_error.reset();
    state_->interrupted.reset();
    cancel.swap(state_->abandoned);
    if (state_->handler) {
      state_->handler = nullptr;  // no announcement is handed on or received after this
      state_->closed = true;
      cancel.insert(state_->announcement_op);
    }
  }
  state_->cv.notify_all();
  for (uint64_t op : cancel) worker_->cancel(op);
}

void UcxChannel::interrupt(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->interrupted) state_->interrupted = reason;
  }
  state_->cv.notify_all();
}

Status UcxChannel::wait_sent(std::chrono::milliseconds timeout) {
  AP_CHECK(end_ == End::sender, "{}: wait_sent() on the receiving end", name());
  std::unique_lock<std::mutex> lock(state_->mu);
  const bool idle = state_->cv.wait_for(
      lock, timeout, [&] { return state_->in_flight == 0 || state_->send_error.has_value(); });
  if (state_->send_error) return *state_->send_error;
  if (!idle)
    return make_error("{}: {} sends still pending after {} ms", name(), state_->in_flight,
                      timeout.count());
  return {};
}

namespace {

/// A process's UCX worker as the transport its waiting stages drive.
class UcxPoller final : public ChannelPoller {
 public:
  explicit UcxPoller(std::shared_ptr<UcxWorker> worker) : worker_(std::move(worker)) {}
  void begin_wait() override { worker_->begin_wait(); }
  bool poll() override { return worker_->poll(); }
  void end_wait(bool idle) override { worker_->end_wait(idle); }

 private:
  std::shared_ptr<UcxWorker> worker_;
};

}  // namespace

Expected<ChannelSet> make_ucx_channels(const UcxChannelPlan& plan) {
  const int stages = static_cast<int>(plan.rank_of_stage.size());
  if (stages < 1) return make_error("UCX channels: no stages in the placement");
  for (int s = 0; s < stages; ++s)
    if (plan.rank_of_stage[static_cast<size_t>(s)] < 0)
      return make_error("UCX channels: stage {} is placed on rank {}", s,
                        plan.rank_of_stage[static_cast<size_t>(s)]);
  for (size_t k = 0; k < plan.tied.size(); ++k) {
    const TiedPair& p = plan.tied[k];
    if (p.owner_stage < 0 || p.owner_stage >= stages || p.copy_stage < 0 || p.copy_stage >= stages)
      return make_error("UCX channels: tied parameter {} between stages {} and {} of {}", k,
                        p.owner_stage, p.copy_stage, stages);
  }
  std::vector<std::unique_ptr<TensorChannel>> channels;
  for (const ChannelEnds& ends : channel_layout(stages, plan.tied)) {
    const int from = plan.rank_of_stage[static_cast<size_t>(ends.from)];
    const int to = plan.rank_of_stage[static_cast<size_t>(ends.to)];
    if (from == plan.rank && to == plan.rank) {
      channels.push_back(std::make_unique<LocalChannel>(ends));
      continue;
    }
    if (from != plan.rank && to != plan.rank) {
      channels.push_back(nullptr);
      continue;
    }
    if (plan.between_processes) {
      if (auto other = plan.between_processes(ends)) {
        channels.push_back(std::move(other));
        continue;
      }
    }
    if (plan.worker == nullptr)
      return make_error("UCX channels: rank {} needs a UCX worker for {}", plan.rank,
                        channel_name(ends));
    // every channel carries its announcements when asked to (the tied parameters' too)
    const UcxChannelOptions& options = plan.options;
    if (from == plan.rank) {
      auto peer = plan.peers.find(to);
      if (peer == plan.peers.end())
        return make_error("UCX channels: rank {} has no endpoint to rank {} (stage {}) for {}",
                          plan.rank, to, ends.to, channel_name(ends));
      channels.push_back(UcxChannel::sender(plan.worker, ends, peer->second, options));
    } else {
      auto peer = plan.peers.find(from);  // where lent tensors go back
      channels.push_back(UcxChannel::receiver(
          plan.worker, ends, options, peer == plan.peers.end() ? UcxEndpoint{} : peer->second));
    }
  }
  ChannelSet set =
      ChannelSet::partial(static_cast<int>(plan.rank_of_stage.size()), std::move(channels));
  if (plan.worker != nullptr) set.set_poller(std::make_shared<UcxPoller>(plan.worker));
  return set;
}

}  // namespace actorpipe
