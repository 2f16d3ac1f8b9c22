// UCX channel: posts start tag sends that hold the tensor until UCX is done with it; receives
// post a tag receive into a pooled buffer and wait on a condition variable with a deadline.
#include "transport/ucx_channel.hpp"

#include <atomic>
#include <condition_variable>
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

}  // namespace

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
};

void UcxChannel::receive_announcement(const std::shared_ptr<UcxWorker>& worker,
                                      const std::shared_ptr<State>& st, uint32_t tag,
                                      uint64_t sequence) {
  auto buffer = std::make_shared<Announcement>();
  std::weak_ptr<UcxWorker> weak = worker;
  const uint64_t op = worker->tag_recv(
      buffer.get(), sizeof(Announcement), ucx_tag(tag | kUcxAnnouncementTagBit, sequence),
      [st, weak, tag, sequence, buffer](const Status& s, size_t length) {
        TensorChannel::AnnouncementHandler h;
        {
          std::lock_guard<std::mutex> lock(st->mu);
          if (!s.ok() || length != sizeof(Announcement) || st->closed || !st->handler) return;
          h = st->handler;
        }
        h(*buffer);
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
}

std::unique_ptr<UcxChannel> UcxChannel::sender(std::shared_ptr<UcxWorker> worker, ChannelEnds ends,
                                               UcxEndpoint peer, UcxChannelOptions options) {
  AP_CHECK(peer.id >= 0, "{}: the sending end needs an endpoint", channel_name(ends));
  return std::unique_ptr<UcxChannel>(
      new UcxChannel(std::move(worker), ends, End::sender, peer, options));
}

std::unique_ptr<UcxChannel> UcxChannel::receiver(std::shared_ptr<UcxWorker> worker,
                                                 ChannelEnds ends, UcxChannelOptions options) {
  return std::unique_ptr<UcxChannel>(
      new UcxChannel(std::move(worker), ends, End::receiver, UcxEndpoint{}, options));
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
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->send_error)
      return make_error("{}: not posting microbatch {}: {}", name(), microbatch,
                        state_->send_error->message);
    AP_CHECK(state_->next_sequence <= kUcxMaxSequence, "{}: sequence numbers exhausted", name());
    a.sequence = state_->next_sequence++;
    state_->in_flight += opts_.carry_announcements ? 2 : 1;
    generation = state_->generation;
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
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->interrupted)
      return make_error("{}: not receiving {}: {}", name(), to_string(a), *state_->interrupted);
  }
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

size_t UcxChannel::pending() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return end_ == End::sender ? state_->in_flight : state_->abandoned.size();
}

void UcxChannel::clear() {
  std::set<uint64_t> cancel;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    ++state_->generation;
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
      channels.push_back(UcxChannel::receiver(plan.worker, ends, options));
    }
  }
  ChannelSet set =
      ChannelSet::partial(static_cast<int>(plan.rank_of_stage.size()), std::move(channels));
  if (plan.worker != nullptr) set.set_poller(std::make_shared<UcxPoller>(plan.worker));
  return set;
}

}  // namespace actorpipe
