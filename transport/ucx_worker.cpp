// UCX worker: one thread at a time calls UCX (UCS_THREAD_MODE_SERIALIZED, under ucx_mu): the
// progress thread, a thread that polls while it waits (begin_wait .. end_wait), or a caller that
// finds the worker free and runs its command itself; otherwise commands queue and wake the
// progress thread by eventfd. When idle it sleeps in poll() on the armed worker's event fd.
#include "transport/ucx_worker.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "kernels/check.hpp"

namespace actorpipe {

namespace {

using Clock = std::chrono::steady_clock;

enum class OpKind : uint8_t { send, recv, flush };

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::send:
      return "ucp_tag_send_nbx";
    case OpKind::recv:
      return "ucp_tag_recv_nbx";
    case OpKind::flush:
      return "ucp_ep_flush_nbx";
  }
  return "?";
}

}  // namespace

struct UcxWorker::Impl {
  /// One operation in UCX's hands (progress thread only).
  struct Op {
    Impl* impl = nullptr;
    uint64_t id = 0;
    OpKind kind = OpKind::send;
    int ep = -1;
    size_t bytes = 0;
    uint64_t tag = 0;
    void* request = nullptr;
    bool submitting = false;  // inside the *_nbx call: a callback now only records its status
    bool done_inline = false;
    ucs_status_t inline_status = UCS_OK;
    bool finished = false;  // completed by shutdown() while UCX still held it
    size_t length = 0;      // bytes received
    UcxCompletion done;
  };
  struct Ep {
    ucp_ep_h ep = nullptr;
    ucs_status_t failed = UCS_OK;  // set by the error handler (peer gone)
    bool abandoned = false;        // abandon(): shutdown leaves it to ucp_worker_destroy
  };

  UcxWorkerOptions opts;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  int ucx_fd = -1;  // owned by the worker
  int wake_fd = -1;
  std::vector<std::byte> address;
  std::thread thread;
  std::atomic<std::thread::id> thread_id{};

  std::mutex ucx_mu;  // held by the one thread that calls UCX (progress thread or a poller)
  std::mutex mu;      // guards commands and stop
  std::deque<std::function<void()>> commands;
  bool stop = false;
  // caller progress (opts.caller_progress): how long after the callers' last UCX call the
  // progress thread takes over again
  static constexpr std::chrono::nanoseconds kCallerGrace = std::chrono::milliseconds(1);
  enum class Sleep : uint8_t { awake, armed, deferred };
  std::atomic<int> pollers{0};                // threads between begin_wait() and end_wait()
  std::atomic<Sleep> sleeping{Sleep::awake};  // how the progress thread sleeps, if it does
  std::atomic<int64_t> caller_active_ns{0};   // when a caller last called UCX (steady clock)
  std::atomic<uint64_t> polled{0};
  std::atomic<uint64_t> next_op{1};
  std::atomic<size_t> outstanding{0};
  std::atomic<uint64_t> wakeups{0};

  /// The worker whose ucx_mu this thread holds (completions run inside it), else null.
  static thread_local const Impl* driving;

  /// Marks the calling thread as the one calling UCX while it holds ucx_mu.
  struct Driving {
    explicit Driving(const Impl* m) : prev(driving) { driving = m; }
    ~Driving() { driving = prev; }
    Driving(const Driving&) = delete;
    Driving& operator=(const Driving&) = delete;
    const Impl* prev;
  };

  // whoever holds ucx_mu
  std::unordered_map<uint64_t, std::unique_ptr<Op>> ops;
  std::vector<Ep> eps;
  bool shutting_down = false;
  bool arm_works = true;
  // map_shared() and attach_shared() regions, by id
  std::unordered_map<uint64_t, ucp_mem_h> mapped;
  std::unordered_map<uint64_t, ucp_rkey_h> attached;
  std::atomic<uint64_t> next_region{1};
  std::atomic<size_t> regions{0};
  /// discard_unexpected()'s buffers of receives UCX had not finished: freed after the worker
  std::vector<std::unique_ptr<std::vector<char>>> discarded;

  ~Impl() { release(); }

  /// Destroys what start-up made, in reverse order (the thread is joined already).
  void release() {
    // a peer's regions before the endpoints they were unpacked for; ours before the context
    for (auto& [id, rkey] : attached) ucp_rkey_destroy(rkey);
    attached.clear();
    for (auto& [id, memh] : mapped) ucp_mem_unmap(context, memh);
    mapped.clear();
    regions.store(0);
    if (worker != nullptr) ucp_worker_destroy(worker);
    worker = nullptr;
    discarded.clear();
    if (context != nullptr) ucp_cleanup(context);
    context = nullptr;
    if (wake_fd >= 0) ::close(wake_fd);
    wake_fd = -1;
  }

  Error ucx_error(const std::string& what, ucs_status_t st) const {
    return make_error("{}: {} failed: {}", opts.name, what, ucs_status_string(st));
  }

  std::string describe(const Op& op) const {
    switch (op.kind) {
      case OpKind::send:
        return fmt::format("{} of {} B with tag {:#x} to endpoint {}", op_name(op.kind), op.bytes,
                           op.tag, op.ep);
      case OpKind::recv:
        return fmt::format("{} of {} B with tag {:#x}", op_name(op.kind), op.bytes, op.tag);
      case OpKind::flush:
        return fmt::format("{} of endpoint {}", op_name(op.kind), op.ep);
    }
    return "?";
  }

  // ---- commands (any thread) ----

  void enqueue(std::function<void()> command) {
    {
      std::lock_guard<std::mutex> lock(mu);
      commands.push_back(std::move(command));
    }
    wake();
  }

  bool has_commands() {
    std::lock_guard<std::mutex> lock(mu);
    return !commands.empty();
  }

  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
        .count();
  }

  /// How long callers have left UCX to the progress thread.
  std::chrono::nanoseconds callers_quiet() const {
    return std::chrono::nanoseconds(now_ns() - caller_active_ns.load());
  }

  /// Runs `command` on the calling thread when the worker is free (after the commands queued
  /// before it), else queues it: inside a completion it runs once the completion returns; while
  /// a thread polls, that thread runs it; otherwise the progress thread, woken.
  void submit(std::function<void()> command) {
    if (driving == this) {
      std::lock_guard<std::mutex> lock(mu);
      commands.push_back(std::move(command));
      return;
    }
    if (!opts.caller_progress) return enqueue(std::move(command));
    std::unique_lock<std::mutex> ucx(ucx_mu, std::try_to_lock);
    if (ucx.owns_lock()) {
      Driving d(this);
      caller_active_ns.store(now_ns(), std::memory_order_relaxed);
      drain_commands();
      command();
      service();  // what the command started, and the commands its completions queued
      // the progress thread sleeps on the armed worker: arm it again after this thread's calls
      // (what they started may raise no event of its own; UCS_ERR_BUSY wakes it)
      if (pollers.load() == 0 && sleeping.load() == Sleep::armed &&
          (!arm_works || ucp_worker_arm(worker) != UCS_OK))
        wake();
      else if (has_commands())
        wake();  // completions queued more than service() ran: the progress thread runs them
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      commands.push_back(std::move(command));
    }
    // a polling thread runs it at its next poll(); end_wait() wakes the progress thread for
    // what is left when the last one stops
    if (pollers.load() == 0) wake();
  }

  /// Drains commands and progresses until neither finds anything (bounded); whether anything
  /// happened. ucx_mu held.
  bool service() {
    bool any = false;
    for (int i = 0; i < 64; ++i) {
      const bool c = drain_commands();
      const bool p = progress();
      if (!c && !p) break;
      any = true;
    }
    return any;
  }

  bool poll_here() {
    // inside a completion the caller progresses already
    if (driving == this || !opts.caller_progress) return false;
    std::unique_lock<std::mutex> ucx(ucx_mu, std::try_to_lock);
    if (!ucx.owns_lock()) return false;
    Driving d(this);
    caller_active_ns.store(now_ns(), std::memory_order_relaxed);
    polled.fetch_add(1, std::memory_order_relaxed);
    const bool any = service();
    if (pollers.load() == 0 && has_commands()) wake();  // a poll outside begin_wait .. end_wait
    return any;
  }

  void begin_wait() {
    if (!opts.caller_progress) return;
    caller_active_ns.store(now_ns(), std::memory_order_relaxed);
    pollers.fetch_add(1);
  }

  void end_wait(bool idle) {
    if (!opts.caller_progress) return;
    // the thread goes to sleep: the progress thread takes UCX back now, not after the grace
    if (idle) caller_active_ns.store(0);
    if (pollers.fetch_sub(1) != 1) return;
    // the last poller: commands it did not run, or a deferred progress thread that must watch
    // UCX again, need the progress thread now
    if ((idle && sleeping.load() == Sleep::deferred) || has_commands()) wake();
  }

  void wake() const {
    const uint64_t one = 1;
    // An eventfd write fails only when the counter would overflow; it is then readable anyway.
    [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof one);
  }

  // ---- progress thread ----

  /// Runs the queued commands; whether there were any.
  bool drain_commands() {
    std::deque<std::function<void()>> batch;
    {
      std::lock_guard<std::mutex> lock(mu);
      batch.swap(commands);
    }
    for (auto& c : batch) c();
    return !batch.empty();
  }

  /// Progresses the worker until it has nothing left to do (bounded); whether it did anything.
  bool progress() {
    bool any = false;
    for (int i = 0; i < 4096 && ucp_worker_progress(worker) != 0; ++i) any = true;
    return any;
  }

  /// Whether callers drive UCX at the moment: a thread polls, or one called UCX less than
  /// kCallerGrace ago. The progress thread then stays out of their way.
  bool callers_drive() const {
    return opts.caller_progress && (pollers.load() > 0 || callers_quiet() < kCallerGrace);
  }

  /// While callers drive UCX, the progress thread sleeps on its own eventfd only, so UCX events
  /// do not wake it: until a command, the last poller going to sleep (end_wait(idle)), or
  /// kCallerGrace after the callers' last call, when it takes over again.
  void sleep_deferred() {
    sleeping.store(Sleep::deferred);
    if (callers_drive() && !has_commands()) {
      const auto left = pollers.load() > 0 ? kCallerGrace : kCallerGrace - callers_quiet();
      const auto ns = std::clamp<int64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(left).count(), 1000, 1000000000);
      const timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      pollfd fd{wake_fd, POLLIN, 0};
      const int n = ::ppoll(&fd, 1, &ts, nullptr);
      wakeups.fetch_add(1, std::memory_order_relaxed);
      if (n > 0) {
        uint64_t v = 0;
        [[maybe_unused]] const ssize_t r = ::read(wake_fd, &v, sizeof v);
      }
    }
    sleeping.store(Sleep::awake);
  }

  /// Arms the worker and sleeps until a UCX event, a command or `timeout_ms` (-1: no limit).
  /// `locked`: the caller holds ucx_mu (else the arming takes it).
  void wait_for_events(int timeout_ms, bool locked) {
    if (arm_works) {
      std::unique_lock<std::mutex> ucx(ucx_mu, std::defer_lock);
      if (!locked) ucx.lock();
      const ucs_status_t st = ucp_worker_arm(worker);
      if (st == UCS_ERR_BUSY) return;                  // events arrived meanwhile: progress again
      if (st == UCS_OK) sleeping.store(Sleep::armed);  // a caller arms it again after its calls
      if (st != UCS_OK) {
        // Cannot sleep on the event fd: fall back to polling at 1 ms (bounded CPU, not zero).
        std::fprintf(stderr, "%s: ucp_worker_arm failed: %s; progress falls back to 1 ms polls\n",
                     opts.name.c_str(), ucs_status_string(st));
        arm_works = false;
      }
    }
    if (!arm_works) timeout_ms = timeout_ms < 0 ? 1 : std::min(timeout_ms, 1);
    pollfd fds[2] = {{ucx_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    const int n = ::poll(fds, 2, timeout_ms);
    sleeping.store(Sleep::awake);
    wakeups.fetch_add(1, std::memory_order_relaxed);
    if (n > 0 && (fds[1].revents & POLLIN) != 0) {
      uint64_t v = 0;
      [[maybe_unused]] const ssize_t r = ::read(wake_fd, &v, sizeof v);
    }
  }

  void run() {
    thread_id.store(std::this_thread::get_id());
    const auto spin = std::chrono::microseconds(std::max(opts.spin_before_sleep_us, 0));
    Clock::time_point spin_until{};
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stop && commands.empty()) break;
      }
      // threads that wait for messages drive UCX themselves: stay out of their way
      if (callers_drive() && !has_commands()) {
        sleep_deferred();
        spin_until = {};
        continue;
      }
      bool worked = false;
      {
        std::lock_guard<std::mutex> ucx(ucx_mu);
        Driving d(this);
        worked = service();
      }
      // After work, poll a little longer (yielding the core) before sleeping: the next
      // message of a burst then costs no wake-up. An idle worker sleeps in poll().
      const auto now = Clock::now();
      if (worked) spin_until = now + spin;
      if (now < spin_until) {
        std::this_thread::yield();
        continue;
      }
      wait_for_events(-1, false);
    }
    std::lock_guard<std::mutex> ucx(ucx_mu);
    Driving d(this);
    shutdown();
  }

  /// Progresses (and runs commands) until `done()` or `deadline`; true when done.
  template <class Pred>
  bool progress_until(Pred done, Clock::time_point deadline) {
    for (;;) {
      drain_commands();
      progress();
      if (done()) return true;
      const auto now = Clock::now();
      if (now >= deadline) return false;
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
      wait_for_events(static_cast<int>(std::min<int64_t>(left, 1000)), true);
    }
  }

  void complete(Op& op, ucs_status_t st) {
    Status s;
    if (st != UCS_OK) s = ucx_error(describe(op), st);
    if (op.done) op.done(std::move(s), op.length);
    outstanding.fetch_sub(1, std::memory_order_acq_rel);
  }

  void complete_with(Op& op, Error e) {
    if (op.done) op.done(std::move(e), 0);
    outstanding.fetch_sub(1, std::memory_order_acq_rel);
  }

  /// Called by UCX when a request finishes, after (or, rarely, inside) the *_nbx call.
  void finish_request(Op* op, void* request, ucs_status_t st) {
    if (op->submitting) {
      op->done_inline = true;
      op->inline_status = st;
      return;
    }
    ucp_request_free(request);
    auto it = ops.find(op->id);
    if (it == ops.end() || op->finished) return;  // shut down and reported already
    std::unique_ptr<Op> owned = std::move(it->second);
    ops.erase(it);
    owned->request = nullptr;
    complete(*owned, st);
  }

  static void send_cb(void* request, ucs_status_t st, void* user_data) {
    auto* op = static_cast<Op*>(user_data);
    op->impl->finish_request(op, request, st);
  }

  static void recv_cb(void* request, ucs_status_t st, const ucp_tag_recv_info_t* info,
                      void* user_data) {
    auto* op = static_cast<Op*>(user_data);
    if (info != nullptr) op->length = info->length;
    op->impl->finish_request(op, request, st);
  }

  static void ep_error_cb(void* arg, ucp_ep_h ep, ucs_status_t st) {
    auto* self = static_cast<Impl*>(arg);
    for (Ep& e : self->eps)
      if (e.ep == ep) e.failed = st;
  }

  /// Takes the result of a *_nbx call for `op`.
  void submitted(std::unique_ptr<Op> op, ucs_status_ptr_t r) {
    op->submitting = false;
    if (r == nullptr) {
      complete(*op, UCS_OK);
    } else if (UCS_PTR_IS_ERR(r)) {
      complete(*op, UCS_PTR_STATUS(r));
    } else if (op->done_inline) {
      ucp_request_free(r);
      complete(*op, op->inline_status);
    } else {
      op->request = r;
      const uint64_t id = op->id;
      ops.emplace(id, std::move(op));
    }
  }

  /// Fails `op` before UCX sees it when its endpoint is unusable; true when it did.
  bool refuse(Op& op) {
    if (shutting_down) {
      complete_with(op, make_error("{}: {}: the worker is shutting down", opts.name, describe(op)));
      return true;
    }
    if (op.kind == OpKind::recv) return false;
    if (op.ep < 0 || op.ep >= static_cast<int>(eps.size())) {
      complete_with(op, make_error("{}: {}: no endpoint {} ({} connected)", opts.name, describe(op),
                                   op.ep, eps.size()));
      return true;
    }
    const Ep& e = eps[static_cast<size_t>(op.ep)];
    if (e.ep == nullptr || e.failed != UCS_OK) {
      complete_with(op,
                    make_error("{}: {}: the endpoint failed earlier: {}", opts.name, describe(op),
                               e.failed != UCS_OK ? ucs_status_string(e.failed) : "closed"));
      return true;
    }
    return false;
  }

  ucp_request_param_t params_for(Op& op) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.user_data = &op;
    if (op.kind == OpKind::recv) {
      // Always through the callback: UCX 1.13 leaves recv_info.tag_info unfilled when a message
      // from the unexpected queue completes the receive at once (length 0 came back).
      p.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
      p.cb.recv = &recv_cb;
    } else {
      p.cb.send = &send_cb;
    }
    return p;
  }

  void start_send(std::unique_ptr<Op> op, const void* data) {
    if (refuse(*op)) return;
    ucp_request_param_t p = params_for(*op);
    op->submitting = true;
    ucs_status_ptr_t r =
        ucp_tag_send_nbx(eps[static_cast<size_t>(op->ep)].ep, data, op->bytes, op->tag, &p);
    submitted(std::move(op), r);
  }

  void start_recv(std::unique_ptr<Op> op, void* data) {
    if (refuse(*op)) return;
    ucp_request_param_t p = params_for(*op);
    op->submitting = true;
    ucs_status_ptr_t r = ucp_tag_recv_nbx(worker, data, op->bytes, op->tag, ~ucp_tag_t{0}, &p);
    submitted(std::move(op), r);
  }

  void start_flush(std::unique_ptr<Op> op) {
    ucp_request_param_t p = params_for(*op);
    op->submitting = true;
    ucs_status_ptr_t r = ucp_ep_flush_nbx(eps[static_cast<size_t>(op->ep)].ep, &p);
    submitted(std::move(op), r);
  }

  void cancel_op(uint64_t id) {
    auto it = ops.find(id);
    if (it == ops.end() || it->second->kind != OpKind::recv || it->second->request == nullptr)
      return;
    // May run the completion (and erase the operation) before it returns.
    ucp_request_cancel(worker, it->second->request);
  }

  Expected<UcxEndpoint> create_ep(const std::vector<std::byte>& peer) {
    if (shutting_down) return make_error("{}: connect: the worker is shutting down", opts.name);
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    p.address = reinterpret_cast<const ucp_address_t*>(peer.data());
    if (opts.detect_peer_failure) {
      p.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
      p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      p.err_handler.cb = &ep_error_cb;
      p.err_handler.arg = this;
    }
    ucp_ep_h ep = nullptr;
    const ucs_status_t st = ucp_ep_create(worker, &p, &ep);
    if (st != UCS_OK)
      return ucx_error(fmt::format("ucp_ep_create (peer address of {} B)", peer.size()), st);
    eps.push_back(Ep{ep, UCS_OK});
    return UcxEndpoint{static_cast<int>(eps.size()) - 1};
  }

  ucp_ep_h live_ep(UcxEndpoint e) const {
    if (e.id < 0 || e.id >= static_cast<int>(eps.size())) return nullptr;
    const Ep& ep = eps[static_cast<size_t>(e.id)];
    return ep.failed == UCS_OK ? ep.ep : nullptr;
  }

  /// ucp_ep_rkey_unpack + ucp_rkey_ptr: where this process sees the region `key` describes.
  Expected<std::pair<ucp_rkey_h, std::byte*>> map_key(UcxEndpoint e, std::span<const std::byte> key,
                                                      uint64_t remote_address) {
    ucp_ep_h ep = live_ep(e);
    if (ep == nullptr) return make_error("{}: no live endpoint {}", opts.name, e.id);
    ucp_rkey_h rkey = nullptr;
    ucs_status_t st = ucp_ep_rkey_unpack(ep, key.data(), &rkey);
    if (st != UCS_OK)
      return ucx_error(fmt::format("ucp_ep_rkey_unpack (a key of {} B)", key.size()), st);
    void* local = nullptr;
    st = ucp_rkey_ptr(rkey, remote_address, &local);
    if (st != UCS_OK) {
      ucp_rkey_destroy(rkey);
      return ucx_error("ucp_rkey_ptr (mapping the peer's memory here)", st);
    }
    return std::pair{rkey, static_cast<std::byte*>(local)};
  }

  Expected<UcxSharedRegion> map_region(size_t bytes, UcxEndpoint shared_with) {
    if (shutting_down) return make_error("{}: map_shared: the worker is shutting down", opts.name);
    ucp_mem_map_params_t p{};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    p.length = bytes;
    p.flags = UCP_MEM_MAP_ALLOCATE;
    ucp_mem_h memh = nullptr;
    ucs_status_t st = ucp_mem_map(context, &p, &memh);
    if (st != UCS_OK)
      return ucx_error(fmt::format("ucp_mem_map (allocating {} B to share)", bytes), st);
    UcxSharedRegion r;
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    st = ucp_mem_query(memh, &attr);
    void* packed = nullptr;
    size_t packed_bytes = 0;
    if (st == UCS_OK) st = ucp_rkey_pack(context, memh, &packed, &packed_bytes);
    if (st != UCS_OK) {
      ucp_mem_unmap(context, memh);
      return ucx_error("ucp_mem_query / ucp_rkey_pack", st);
    }
    r.address = static_cast<std::byte*>(attr.address);
    r.length = attr.length;
    const auto* kb = static_cast<const std::byte*>(packed);
    r.key.assign(kb, kb + packed_bytes);
    ucp_rkey_buffer_release(packed);
    // what the peer will do: a mapping of its own through the key
    auto probe = map_key(shared_with, r.key, reinterpret_cast<uint64_t>(r.address));
    if (!probe) {
      ucp_mem_unmap(context, memh);
      return make_error("{}: the memory UCX allocated cannot be shared with endpoint {}: {}",
                        opts.name, shared_with.id, probe.error().message);
    }
    ucp_rkey_destroy(probe->first);
    r.id = next_region.fetch_add(1);
    mapped.emplace(r.id, memh);
    regions.fetch_add(1);
    return r;
  }

  Expected<UcxAttachedRegion> attach_region(UcxEndpoint e, const std::vector<std::byte>& key,
                                            uint64_t remote_address) {
    if (shutting_down)
      return make_error("{}: attach_shared: the worker is shutting down", opts.name);
    auto m = map_key(e, key, remote_address);
    if (!m) return m.error();
    UcxAttachedRegion r;
    r.id = next_region.fetch_add(1);
    r.address = m->second;
    attached.emplace(r.id, m->first);
    regions.fetch_add(1);
    return r;
  }

  void unmap_region(uint64_t id) {
    if (auto it = mapped.find(id); it != mapped.end()) {
      ucp_mem_unmap(context, it->second);
      mapped.erase(it);
      regions.fetch_sub(1);
    }
    if (auto it = attached.find(id); it != attached.end()) {
      ucp_rkey_destroy(it->second);
      attached.erase(it);
      regions.fetch_sub(1);
    }
  }

  Expected<std::string> ep_info(UcxEndpoint e) {
    if (e.id < 0 || e.id >= static_cast<int>(eps.size()) ||
        eps[static_cast<size_t>(e.id)].ep == nullptr)
      return make_error("{}: endpoint_info: no endpoint {} ({} connected)", opts.name, e.id,
                        eps.size());
    char* buf = nullptr;
    size_t len = 0;
    FILE* f = open_memstream(&buf, &len);
    if (f == nullptr)
      return make_error("{}: endpoint_info: open_memstream: {}", opts.name, std::strerror(errno));
    ucp_ep_print_info(eps[static_cast<size_t>(e.id)].ep, f);
    std::fclose(f);
    std::string s(buf, len);
    std::free(buf);
    return s;
  }

  /// Closes every endpoint within close_timeout and cancels what is left. With peer failure
  /// detection: flush (sends delivered), then close by force; without: close in flush mode.
  void shutdown() {
    shutting_down = true;
    const auto deadline = Clock::now() + opts.close_timeout;
    size_t flushing = 0;
    if (opts.detect_peer_failure) {
      for (size_t i = 0; i < eps.size(); ++i) {
        if (eps[i].ep == nullptr || eps[i].failed != UCS_OK || eps[i].abandoned) continue;
        auto op = std::make_unique<Op>();
        op->impl = this;
        op->id = next_op.fetch_add(1);
        op->kind = OpKind::flush;
        op->ep = static_cast<int>(i);
        op->done = [&flushing](const Status&, size_t) { --flushing; };
        ++flushing;
        outstanding.fetch_add(1);
        start_flush(std::move(op));
      }
      progress_until([&] { return flushing == 0; }, deadline);
    }
    std::vector<void*> closing;
    for (Ep& e : eps) {
      if (e.ep == nullptr || e.abandoned) continue;
      ucp_request_param_t p{};
      if (opts.detect_peer_failure) {
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      }
      ucs_status_ptr_t r = ucp_ep_close_nbx(e.ep, &p);
      if (r != nullptr && !UCS_PTR_IS_ERR(r)) closing.push_back(r);
      e.ep = nullptr;
    }
    const bool closed = progress_until(
        [&] {
          for (void* r : closing)
            if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
          return true;
        },
        std::max(deadline, Clock::now() + std::chrono::milliseconds(100)));
    if (!closed)
      std::fprintf(stderr,
                   "%s: endpoints not closed within %lld ms (peer gone or not progressing)\n",
                   opts.name.c_str(), static_cast<long long>(opts.close_timeout.count()));
    for (void* r : closing) ucp_request_free(r);  // released now or once UCX is done with it
    // A forced close cancelled the flushes still running; `flushing` must not outlive them.
    progress_until([&] { return flushing == 0; }, Clock::now() + std::chrono::seconds(1));
    std::vector<uint64_t> ids;
    for (const auto& [id, op] : ops) ids.push_back(id);
    for (uint64_t id : ids) cancel_op(id);
    progress_until([&] { return ops.empty(); }, Clock::now() + std::chrono::milliseconds(200));
    // What UCX still holds (sends on an endpoint that did not close) is reclaimed by
    // ucp_worker_destroy; the owners hear of it now, and a late callback finds it finished.
    for (auto& [id, op] : ops) {
      if (op->kind != OpKind::flush)
        complete_with(*op, make_error("{}: {}: not finished when the worker shut down", opts.name,
                                      describe(*op)));
      op->finished = true;
      op->done = nullptr;
    }
    discard_unexpected(Clock::now() + std::chrono::milliseconds(200));
    drain_commands();
  }

  /// Takes the messages that arrived for receives never posted (a failed run's last activations
  /// and control messages, say) off the unexpected queue into scratch buffers, so that
  /// ucp_worker_destroy does not warn about each of them ("unexpected tag-receive descriptor ...
  /// was not matched", "... was not returned to mpool ..."). Bounded by `until` and in count; a
  /// receive UCX has not finished by then (a rendezvous from a peer that is gone) is cancelled
  /// and its buffer kept until the worker is destroyed.
  void discard_unexpected(Clock::time_point until) {
    for (int n = 0; n < 100000 && Clock::now() < until; ++n) {
      ucp_tag_recv_info_t info{};
      ucp_tag_message_h msg = ucp_tag_probe_nb(worker, 0, 0, 1, &info);  // any tag, removed
      if (msg == nullptr) {
        if (ucp_worker_progress(worker) == 0) return;  // nothing more arrives
        continue;
      }
      auto buf = std::make_unique<std::vector<char>>(std::max<size_t>(info.length, 1));
      ucp_request_param_t p{};
      ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(worker, buf->data(), info.length, msg, &p);
      if (r == nullptr || UCS_PTR_IS_ERR(r)) continue;
      while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < until)
        ucp_worker_progress(worker);
      if (ucp_request_check_status(r) == UCS_INPROGRESS) {
        ucp_request_cancel(worker, r);
        discarded.push_back(std::move(buf));  // UCX may still write into it
      }
      ucp_request_free(r);
    }
  }
};

thread_local const UcxWorker::Impl* UcxWorker::Impl::driving = nullptr;

Expected<std::shared_ptr<UcxWorker>> UcxWorker::create(UcxWorkerOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->opts = std::move(options);
  Impl& m = *impl;

  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return m.ucx_error("ucp_config_read", st);
  std::vector<std::pair<std::string, std::string>> settings;
  const bool threshold_given =
      std::getenv("UCX_RNDV_THRESH") != nullptr ||
      std::any_of(m.opts.config.begin(), m.opts.config.end(),
                  [](const auto& kv) { return kv.first == "RNDV_THRESH"; });
  if (m.opts.rendezvous_threshold > 0 && !threshold_given)
    settings.emplace_back("RNDV_THRESH", std::to_string(m.opts.rendezvous_threshold));
  settings.insert(settings.end(), m.opts.config.begin(), m.opts.config.end());
  for (const auto& [key, value] : settings) {
    st = ucp_config_modify(config, key.c_str(), value.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return m.ucx_error(fmt::format("ucp_config_modify({} = \"{}\")", key, value), st);
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  st = ucp_init(&params, config, &m.context);
  ucp_config_release(config);
  if (st != UCS_OK) {
    m.context = nullptr;
    return m.ucx_error("ucp_init (features TAG | WAKEUP)", st);
  }

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // one thread at a time, under ucx_mu: the progress thread or a thread that polls as it waits
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = ucp_worker_create(m.context, &wp, &m.worker);
  if (st != UCS_OK) {
    m.worker = nullptr;
    return m.ucx_error("ucp_worker_create", st);
  }
  st = ucp_worker_get_efd(m.worker, &m.ucx_fd);
  if (st != UCS_OK) return m.ucx_error("ucp_worker_get_efd", st);

  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  st = ucp_worker_get_address(m.worker, &addr, &addr_len);
  if (st != UCS_OK) return m.ucx_error("ucp_worker_get_address", st);
  const auto* bytes = reinterpret_cast<const std::byte*>(addr);
  m.address.assign(bytes, bytes + addr_len);
  ucp_worker_release_address(m.worker, addr);

  m.wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (m.wake_fd < 0) return make_error("{}: eventfd failed: {}", m.opts.name, std::strerror(errno));

  m.thread = std::thread([&m] { m.run(); });
  return std::shared_ptr<UcxWorker>(new UcxWorker(std::move(impl)));
}

UcxWorker::UcxWorker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

UcxWorker::~UcxWorker() {
  AP_CHECK(std::this_thread::get_id() != impl_->thread_id.load(),
           "{}: the worker is destroyed from its own progress thread (inside a completion)",
           impl_->opts.name);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->wake();
  impl_->thread.join();
  impl_->release();
}

const std::vector<std::byte>& UcxWorker::address() const {
  return impl_->address;
}

const UcxWorkerOptions& UcxWorker::options() const {
  return impl_->opts;
}

Expected<UcxEndpoint> UcxWorker::connect(std::span<const std::byte> peer_address) {
  if (peer_address.empty())
    return make_error("{}: connect: the peer address is empty", impl_->opts.name);
  AP_CHECK(std::this_thread::get_id() != impl_->thread_id.load() && Impl::driving != impl_.get(),
           "{}: connect() called from a completion", impl_->opts.name);
  std::vector<std::byte> peer(peer_address.begin(), peer_address.end());
  std::promise<Expected<UcxEndpoint>> result;
  auto future = result.get_future();
  impl_->enqueue([&] { result.set_value(impl_->create_ep(peer)); });
  return future.get();
}

Expected<std::string> UcxWorker::endpoint_info(UcxEndpoint ep) {
  AP_CHECK(std::this_thread::get_id() != impl_->thread_id.load() && Impl::driving != impl_.get(),
           "{}: endpoint_info() called from a completion", impl_->opts.name);
  std::promise<Expected<std::string>> result;
  auto future = result.get_future();
  impl_->enqueue([&] { result.set_value(impl_->ep_info(ep)); });
  return future.get();
}

Expected<UcxSharedRegion> UcxWorker::map_shared(size_t bytes, UcxEndpoint shared_with) {
  AP_CHECK(std::this_thread::get_id() != impl_->thread_id.load() && Impl::driving != impl_.get(),
           "{}: map_shared() called from a completion", impl_->opts.name);
  if (bytes == 0) return make_error("{}: map_shared of 0 B", impl_->opts.name);
  std::promise<Expected<UcxSharedRegion>> result;
  auto future = result.get_future();
  impl_->enqueue([&] { result.set_value(impl_->map_region(bytes, shared_with)); });
  return future.get();
}

void UcxWorker::unmap_shared(uint64_t id) {
  impl_->submit([m = impl_.get(), id] { m->unmap_region(id); });
}

Expected<UcxAttachedRegion> UcxWorker::attach_shared(UcxEndpoint ep, std::span<const std::byte> key,
                                                     uint64_t remote_address) {
  AP_CHECK(std::this_thread::get_id() != impl_->thread_id.load() && Impl::driving != impl_.get(),
           "{}: attach_shared() called from a completion", impl_->opts.name);
  if (key.empty()) return make_error("{}: attach_shared: the key is empty", impl_->opts.name);
  std::vector<std::byte> k(key.begin(), key.end());
  std::promise<Expected<UcxAttachedRegion>> result;
  auto future = result.get_future();
  impl_->enqueue([&] { result.set_value(impl_->attach_region(ep, k, remote_address)); });
  return future.get();
}

void UcxWorker::detach_shared(uint64_t id) {
  impl_->submit([m = impl_.get(), id] { m->unmap_region(id); });
}

size_t UcxWorker::shared_regions() const {
  return impl_->regions.load();
}

uint64_t UcxWorker::tag_send(UcxEndpoint ep, const void* data, size_t bytes, uint64_t tag,
                             UcxCompletion done) {
  auto op = std::make_unique<Impl::Op>();
  op->impl = impl_.get();
  op->id = impl_->next_op.fetch_add(1);
  op->kind = OpKind::send;
  op->ep = ep.id;
  op->bytes = bytes;
  op->tag = tag;
  op->done = std::move(done);
  const uint64_t id = op->id;
  impl_->outstanding.fetch_add(1);
  impl_->submit([m = impl_.get(), o = op.release(), data]() mutable {
    m->start_send(std::unique_ptr<Impl::Op>(o), data);
  });
  return id;
}

uint64_t UcxWorker::tag_recv(void* data, size_t bytes, uint64_t tag, UcxCompletion done) {
  auto op = std::make_unique<Impl::Op>();
  op->impl = impl_.get();
  op->id = impl_->next_op.fetch_add(1);
  op->kind = OpKind::recv;
  op->bytes = bytes;
  op->tag = tag;
  op->done = std::move(done);
  const uint64_t id = op->id;
  impl_->outstanding.fetch_add(1);
  impl_->submit([m = impl_.get(), o = op.release(), data]() mutable {
    m->start_recv(std::unique_ptr<Impl::Op>(o), data);
  });
  return id;
}

void UcxWorker::abandon(UcxEndpoint ep) {
  impl_->enqueue([m = impl_.get(), ep] {
    if (ep.id >= 0 && static_cast<size_t>(ep.id) < m->eps.size())
      m->eps[static_cast<size_t>(ep.id)].abandoned = true;
  });
}

void UcxWorker::cancel(uint64_t op) {
  impl_->submit([m = impl_.get(), op] { m->cancel_op(op); });
}

size_t UcxWorker::outstanding() const {
  return impl_->outstanding.load(std::memory_order_acquire);
}

uint64_t UcxWorker::wakeups() const {
  return impl_->wakeups.load(std::memory_order_relaxed);
}

bool UcxWorker::poll() {
  return impl_->poll_here();
}

void UcxWorker::begin_wait() {
  impl_->begin_wait();
}

void UcxWorker::end_wait(bool idle) {
  impl_->end_wait(idle);
}

uint64_t UcxWorker::polls() const {
  return impl_->polled.load(std::memory_order_relaxed);
}

}  // namespace actorpipe
