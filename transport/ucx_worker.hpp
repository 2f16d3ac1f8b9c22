// UCX worker: one UCX context and worker per process, its packed address for peers, endpoints to
// peer workers, and an event-driven progress thread that a waiting thread may stand in for.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/expected.hpp"

namespace actorpipe {

/// Options of a UcxWorker.
struct UcxWorkerOptions {
  /// UCX configuration set on top of the environment (UCX_TLS, ...), as ucp_config_modify takes
  /// it: names without the UCX_ prefix, e.g. {"TLS", "tcp"} or {"NET_DEVICES", "lo"}.
  std::vector<std::pair<std::string, std::string>> config;
  /// Endpoints detect a vanished peer (UCP_ERR_HANDLING_MODE_PEER): operations on it fail
  /// instead of waiting. UCX 1.13 then picks only transports that support it: TCP, never shared
  /// memory (sysv + cma without it; measured here), hence off by default. Receive timeouts bound
  /// waits either way.
  bool detect_peer_failure = false;
  /// How long shutdown waits for the endpoints to close with their sends delivered. With peer
  /// failure detection they are then closed by force (what is in flight is cancelled); without,
  /// what is left is reclaimed when the worker is destroyed.
  std::chrono::milliseconds close_timeout{5000};
  /// After it did some work, the progress thread keeps polling (yielding its core between polls)
  /// for up to this many microseconds before it sleeps in poll(): the next message of a burst
  /// then costs no wake-up. Bounds the CPU an active worker burns per burst; an idle worker
  /// sleeps. 0 sleeps at once.
  int spin_before_sleep_us = 50;
  /// Threads other than the progress thread call UCX themselves: tag_send, tag_recv and cancel
  /// when the worker is free, poll() while they wait (begin_wait). Off: every call goes through
  /// the progress thread, poll() does nothing (the engine before caller progress; to compare).
  bool caller_progress = true;
  /// Messages shorter than this go eagerly (on one host through UCX's shared-memory FIFO, copied
  /// in and out as they stream; between hosts straight down the socket); longer ones by
  /// rendezvous (on one host one copy by the receiver, CMA's process_vm_readv). CMA pins every
  /// 4 KiB page it copies, so below the 2 MiB huge pages of large tensors (kernels/tensor.hpp)
  /// the eager path moved 64 KiB to 1 MiB 2-3x faster over shared memory here, while over TCP
  /// rendezvous was faster from 1 MiB on (docs/benchmarks.md, "The eager threshold").
  /// UCX_RNDV_THRESH in the environment, or RNDV_THRESH in `config`, wins; 0 leaves UCX its
  /// own choice.
  size_t rendezvous_threshold = size_t{1} << 20;
  /// Names the worker in error messages.
  std::string name = "ucx";
};

/// An endpoint to a peer worker, made by UcxWorker::connect; valid as long as that worker.
struct UcxEndpoint {
  int id = -1;
  friend bool operator==(const UcxEndpoint&, const UcxEndpoint&) = default;
};

/// Memory that UCX allocated for peers on this host to map (UcxWorker::map_shared).
struct UcxSharedRegion {
  uint64_t id = 0;  ///< for unmap_shared()
  std::byte* address = nullptr;
  size_t length = 0;
  std::vector<std::byte> key;  ///< the packed remote key a peer passes to attach_shared()
};

/// A peer's UcxSharedRegion mapped into this process (UcxWorker::attach_shared).
struct UcxAttachedRegion {
  uint64_t id = 0;  ///< for detach_shared()
  std::byte* address = nullptr;
};

/// Completion of a tag operation: its status and, for a receive, the bytes received. Runs on the
/// thread that calls UCX at the time (the progress thread, a thread in poll(), or one whose
/// tag_send/tag_recv/cancel found the worker free): it must be short, must not block, must not
/// wait for another completion and must not take a lock its caller may hold.
using UcxCompletion = std::function<void(Status status, size_t length)>;

/// One UCX context and worker (tag matching, wake-up events). A progress thread drains
/// ucp_worker_progress, polls on for spin_before_sleep_us after any work, then arms the worker
/// and sleeps in poll() on the worker's event fd and an eventfd of its own, so an idle worker
/// costs no CPU. One thread at a time calls UCX (UCS_THREAD_MODE_SERIALIZED, under a mutex):
/// tag_send, tag_recv and cancel run on the caller's thread when the worker is free, else they
/// queue a command; a thread that waits for a message may progress the worker itself between
/// begin_wait() and end_wait() (poll()), and the progress thread then sleeps without watching
/// UCX, so the message reaches the waiting thread with no wake-up of another. Callable from any
/// thread except from inside a completion (connect() and endpoint_info() wait for the thread).
/// Shutdown (the destructor): close each endpoint with its sends flushed (bounded by
/// close_timeout), cancel outstanding receives, join the thread, destroy worker and context.
class UcxWorker {
 public:
  /// Creates the context, the worker and the progress thread. Errors: any UCX failure, with
  /// the UCX status string and the call that failed.
  static Expected<std::shared_ptr<UcxWorker>> create(UcxWorkerOptions options = {});
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  /// The packed worker address a peer passes to connect().
  const std::vector<std::byte>& address() const;

  /// An endpoint to the worker whose address is `peer_address` (see detect_peer_failure).
  /// Waits for the progress thread. Errors: an empty address, a UCX failure.
  Expected<UcxEndpoint> connect(std::span<const std::byte> peer_address);

  /// What UCX chose for `ep` (ucp_ep_print_info: transports, lanes, protocol thresholds).
  /// Errors: an unknown endpoint.
  Expected<std::string> endpoint_info(UcxEndpoint ep);

  /// Sends `bytes` bytes at `data` with UCX tag `tag` to `ep`. Never blocks; `data` must stay
  /// valid until `done` runs. Returns the operation's id. Errors reach `done`: an unknown or
  /// failed endpoint, a UCX failure, a shutdown.
  uint64_t tag_send(UcxEndpoint ep, const void* data, size_t bytes, uint64_t tag,
                    UcxCompletion done);

  /// Receives the message with UCX tag exactly `tag` (from any peer) into `bytes` bytes at
  /// `data`. Never blocks; `data` must stay valid until `done` runs, which gets the received
  /// length. Returns the operation's id. A longer message fails with "Message truncated".
  uint64_t tag_recv(void* data, size_t bytes, uint64_t tag, UcxCompletion done);

  /// The peer of `ep` is gone (its process lost): shutdown will neither flush nor close `ep`,
  /// which would wait close_timeout for a peer that never answers; destroying the worker
  /// reclaims it. Unknown endpoints are ignored.
  void abandon(UcxEndpoint ep);

  /// Asks UCX to cancel operation `op` (a receive; sends cannot be cancelled before their
  /// endpoint closes). Its completion runs later with an error, or with success if the data
  /// arrived first. Unknown or finished operations are ignored.
  void cancel(uint64_t op);

  /// At least `bytes` of memory that UCX allocates so that the peer of `shared_with` can map it
  /// (ucp_mem_map with UCP_MEM_MAP_ALLOCATE: System V or POSIX shared memory, UCX's choice),
  /// with its packed remote key. The call checks what the peer will do (unpacks the key for
  /// `shared_with` and maps the region by ucp_rkey_ptr) and fails when that does not work: a
  /// peer on another host, UCX_TLS without shared memory, UCX falling back to memory it cannot
  /// share. Waits for the progress thread (not from a completion). Errors name the reason.
  Expected<UcxSharedRegion> map_shared(size_t bytes, UcxEndpoint shared_with);
  /// Gives a region of map_shared() back to UCX (a peer that mapped it keeps its mapping).
  /// Never blocks; callable from any thread. Regions still mapped go with the worker.
  void unmap_shared(uint64_t id);
  /// Maps the region at `remote_address` that the peer of `ep` made with map_shared() and
  /// packed as `key`, so this process reads and writes it in place. Waits for the progress
  /// thread (not from a completion). Errors: a malformed key, memory this host cannot map.
  Expected<UcxAttachedRegion> attach_shared(UcxEndpoint ep, std::span<const std::byte> key,
                                            uint64_t remote_address);
  /// Unmaps a region of attach_shared(). Never blocks; callable from any thread.
  void detach_shared(uint64_t id);
  /// Regions of map_shared() and attach_shared() held now (for tests).
  size_t shared_regions() const;

  /// Operations started and not completed yet.
  size_t outstanding() const;

  /// Times the progress thread returned from poll() (a measure of wake-ups, for tests).
  uint64_t wakeups() const;

  /// The calling thread waits for a message and will call poll() until end_wait(): meanwhile
  /// the progress thread leaves UCX to the callers (it sleeps without watching UCX until a
  /// command, an end_wait(true), or 1 ms after the callers' last UCX call). Pairs must nest
  /// per thread; keep the window short (a bounded spin).
  void begin_wait();
  /// Ends begin_wait(). `idle`: the thread stops waiting without its message and goes to sleep,
  /// so the progress thread takes UCX back at once; otherwise it works on (and is likely to
  /// call UCX again soon), and the progress thread takes over 1 ms after the callers' last call.
  void end_wait(bool idle);
  /// Progresses the worker on the calling thread (completions run here) unless another thread
  /// is calling UCX at the moment; whether anything happened. Call it between begin_wait() and
  /// end_wait(); inside a completion it does nothing.
  bool poll();
  /// Calls of poll() that progressed the worker (for tests).
  uint64_t polls() const;

  const UcxWorkerOptions& options() const;

  struct Impl;

 private:
  explicit UcxWorker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace actorpipe
