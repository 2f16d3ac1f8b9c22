// NCCL channel: tensors between GPU stages of two processes by NCCL send/recv, each channel on a
// two-rank communicator of its own (so the two directions of a pair never wait on each other).
#include "transport/nccl_channel.hpp"

#include <fmt/format.h>

#include <thread>
#include <utility>

#include "kernels/check.hpp"

#if ACTORPIPE_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace actorpipe {

namespace {

using Clock = std::chrono::steady_clock;

std::string channel_name(const ChannelEnds& e) {
  return fmt::format("NCCL channel {} ({} -> {})", e.tag, e.from, e.to);
}

}  // namespace

// a send in flight: the tensor is kept until the send completed
#if ACTORPIPE_WITH_CUDA
struct NcclChannel::InFlight {
  cudaEvent_t done = nullptr;
  Tensor tensor;
  ~InFlight() {
    if (done != nullptr) cudaEventDestroy(done);
  }
};
#else
struct NcclChannel::InFlight {};
#endif

// ---- the channel's ends (either build) ----------------------------------------------------------

NcclChannel::NcclChannel(std::shared_ptr<NcclLink> link, ChannelEnds ends,
                         NcclChannelOptions options)
    : TensorChannel(ends), link_(std::move(link)), opts_(options) {}

std::unique_ptr<NcclChannel> NcclChannel::sender(std::shared_ptr<NcclLink> link, ChannelEnds ends,
                                                 NcclChannelOptions options) {
  AP_CHECK(link && link->sender(), "{}: a sending end needs the link's sending end",
           channel_name(ends));
  return std::unique_ptr<NcclChannel>(new NcclChannel(std::move(link), ends, options));
}

std::unique_ptr<NcclChannel> NcclChannel::receiver(std::shared_ptr<NcclLink> link, ChannelEnds ends,
                                                   NcclChannelOptions options) {
  AP_CHECK(link && !link->sender(), "{}: a receiving end needs the link's receiving end",
           channel_name(ends));
  return std::unique_ptr<NcclChannel>(new NcclChannel(std::move(link), ends, options));
}

std::string NcclChannel::name() const {
  return channel_name(ends());
}

std::string NcclChannel::interrupt_reason() const {
  std::lock_guard<std::mutex> lock(reason_mu_);
  return interrupt_reason_;
}

#if ACTORPIPE_WITH_CUDA

namespace {

// waits a little: spins (yielding) for the first 50 µs of a wait, then sleeps 20 µs at a time
void pause(Clock::time_point since) {
  if (Clock::now() - since < std::chrono::microseconds(50)) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

std::string cuda_error(cudaError_t e) {
  return fmt::format("{} ({})", cudaGetErrorString(e), static_cast<int>(e));
}

std::string nccl_error(ncclResult_t r, ncclComm_t comm = nullptr) {
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  return last != nullptr && *last != '\0' ? fmt::format("{}: {}", ncclGetErrorString(r), last)
                                          : std::string(ncclGetErrorString(r));
}

// Waits until the non-blocking communicator's last call finished (ncclInProgress ends), at most
// until `deadline`. The communicator's state then, or an error.
Status settle(ncclComm_t comm, ncclResult_t started, Clock::time_point deadline,
              const std::string& what) {
  if (started != ncclSuccess && started != ncclInProgress)
    return make_error("{}: {}", what, nccl_error(started, comm));
  const auto since = Clock::now();
  ncclResult_t state = started;
  while (state == ncclInProgress) {
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) break;
    if (state != ncclInProgress) break;
    if (Clock::now() > deadline) return make_error("{}: still in progress at the deadline", what);
    pause(since);
  }
  if (state != ncclSuccess) return make_error("{}: {}", what, nccl_error(state, comm));
  return {};
}

// The device that holds `memory`'s allocations (a GPU's memory), or an error.
Expected<int> device_of(BackendMemory& memory) {
  float* probe = memory.allocate(1);
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, probe);
  memory.release(probe);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return make_error("NCCL link: {} is not a GPU's memory ({})", memory.name(), cuda_error(e));
  }
  if (attr.type != cudaMemoryTypeDevice)
    return make_error("NCCL link: {} is not a GPU's memory", memory.name());
  return attr.device;
}

}  // namespace

struct NcclLink::Handles {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

std::string nccl_unavailable_reason() {
  return {};
}

Expected<std::string> nccl_unique_id() {
  ncclUniqueId id{};
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return make_error("ncclGetUniqueId: {}", nccl_error(r));
  std::string hex;
  hex.reserve(2 * sizeof(id.internal));
  for (char c : id.internal) hex += fmt::format("{:02x}", static_cast<unsigned char>(c));
  return hex;
}

NcclLink::NcclLink(bool sender, int device, BackendMemory& memory, std::unique_ptr<Handles> h)
    : sender_(sender), device_(device), memory_(&memory), h_(std::move(h)) {}

Expected<std::shared_ptr<NcclLink>> NcclLink::connect(const std::string& id, bool sender,
                                                      BackendMemory& memory,
                                                      std::chrono::milliseconds timeout) {
  ncclUniqueId uid{};
  if (id.size() != 2 * sizeof(uid.internal))
    return make_error("NCCL link: an id of {} characters, expected {} (hex)", id.size(),
                      2 * sizeof(uid.internal));
  for (size_t i = 0; i < sizeof(uid.internal); ++i) {
    unsigned v = 0;
    if (std::sscanf(id.c_str() + 2 * i, "%2x", &v) != 1)
      return make_error("NCCL link: the id is not hex at character {}", 2 * i);
    uid.internal[i] = static_cast<char>(v);
  }
  auto device = device_of(memory);
  if (!device) return device.error();
  if (cudaError_t e = cudaSetDevice(*device); e != cudaSuccess) {
    cudaGetLastError();
    return make_error("NCCL link: cudaSetDevice({}): {}", *device, cuda_error(e));
  }
  auto h = std::make_unique<Handles>();
  if (cudaError_t e = cudaStreamCreateWithFlags(&h->stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    cudaGetLastError();
    return make_error("NCCL link: cudaStreamCreate: {}", cuda_error(e));
  }
  auto link = std::shared_ptr<NcclLink>(new NcclLink(sender, *device, memory, std::move(h)));
  Handles& hs = *link->h_;
  const auto deadline = Clock::now() + timeout;
  const std::string who =
      fmt::format("NCCL link ({} end, {})", sender ? "sending" : "receiving", memory.name());
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // polled below, so a missing other end is a timeout, not a hang
  const ncclResult_t started = ncclCommInitRankConfig(&hs.comm, 2, uid, sender ? 0 : 1, &config);
  if (Status ok =
          settle(hs.comm, started, deadline,
                 fmt::format("{}: joining the communicator within {} ms", who, timeout.count()));
      !ok) {
    link->abort();
    return ok.error();
  }
  // the warm-up: 4 bytes across, so the connection exists before the first payload
  Tensor warm = Tensor::zeros({1}, DType::f32, memory);
  const ncclResult_t op = sender ? ncclSend(warm.f32(), 4, ncclUint8, 1, hs.comm, hs.stream)
                                 : ncclRecv(warm.f32(), 4, ncclUint8, 0, hs.comm, hs.stream);
  Status ok = settle(hs.comm, op, deadline, who + ": the warm-up transfer");
  const auto since = Clock::now();
  while (ok) {
    const cudaError_t q = cudaStreamQuery(hs.stream);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) {
      cudaGetLastError();
      ok = make_error("{}: the warm-up transfer: {}", who, cuda_error(q));
    } else if (Clock::now() > deadline) {
      ok = make_error("{}: the warm-up transfer did not complete within {} ms", who,
                      timeout.count());
    } else {
      pause(since);
    }
  }
  if (!ok) {
    link->abort();
    return ok.error();
  }
  return link;
}

void NcclLink::abort() {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (dead_.exchange(true) || h_->comm == nullptr) return;
  cudaSetDevice(device_);
  ncclCommAbort(h_->comm);  // ends what is in flight; the stream is free afterwards
  h_->comm = nullptr;
}

NcclLink::~NcclLink() {
  cudaSetDevice(device_);
  if (h_->comm != nullptr && !dead_.load()) {
    // a clean end: finalize (non-blocking, bounded), then destroy; abort if it does not settle
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    if (settle(h_->comm, ncclCommFinalize(h_->comm), deadline, "finalize")) {
      ncclCommDestroy(h_->comm);
    } else {
      ncclCommAbort(h_->comm);
    }
    h_->comm = nullptr;
  }
  if (h_->stream != nullptr) cudaStreamDestroy(h_->stream);
}

NcclChannel::~NcclChannel() {
  clear();
}

size_t NcclChannel::reap() const {
  cudaSetDevice(link_->device());
  while (!in_flight_.empty()) {
    const cudaError_t q = cudaEventQuery(in_flight_.front()->done);
    if (q == cudaErrorNotReady) break;
    if (q != cudaSuccess) cudaGetLastError();  // a failed send is the link's failure
    in_flight_.pop_front();
  }
  return in_flight_.size();
}

Expected<Announcement> NcclChannel::post(Tensor tensor, int64_t microbatch, int32_t version) {
  AP_CHECK(link_->sender(), "{}: post() on the receiving end", name());
  if (!tensor.defined())
    return make_error("{}: posting an undefined tensor for microbatch {}", name(), microbatch);
  if (link_->dead())
    return make_error("{}: not posting microbatch {}: the link was aborted", name(), microbatch);
  std::lock_guard<std::mutex> lock(mu_);
  cudaSetDevice(link_->device());
  if (tensor.host_readable()) {  // a host tensor (an injected fault's, say) goes to the GPU first
    Tensor on_gpu = Tensor::zeros(tensor.shape(), tensor.dtype(), link_->memory());
    // every dtype has 4-byte elements: the bytes move as floats
    link_->memory().to_backend(
        static_cast<float*>(on_gpu.storage()->data()),
        static_cast<const float*>(tensor.storage()->data()) + tensor.offset(),
        tensor.nbytes() / sizeof(float));
    tensor = std::move(on_gpu);
  }
  const void* data = static_cast<const std::byte*>(tensor.storage()->data()) +
                     tensor.offset() * dtype_size(tensor.dtype());
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, data) != cudaSuccess || attr.type != cudaMemoryTypeDevice ||
      attr.device != link_->device()) {
    cudaGetLastError();
    return make_error("{}: posting {} for microbatch {}: not memory of GPU {}", name(),
                      tensor.describe(), microbatch, link_->device());
  }
  Announcement a;
  a.tag = ends().tag;
  a.sequence = next_sequence_;
  a.microbatch = microbatch;
  a.version = version;
  a.dtype = tensor.dtype();
  a.ndim = tensor.dim();
  for (int i = 0; i < tensor.dim(); ++i) a.dims[static_cast<size_t>(i)] = tensor.size(i);
  NcclLink::Handles& h = *link_->h_;
  const auto deadline = Clock::now() + opts_.receive_timeout;
  Status ok = settle(h.comm, ncclSend(data, tensor.nbytes(), ncclUint8, 1, h.comm, h.stream),
                     deadline, fmt::format("{}: ncclSend of microbatch {}", name(), microbatch));
  auto f = std::make_unique<InFlight>();
  if (ok) {
    cudaError_t e = cudaEventCreateWithFlags(&f->done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(f->done, h.stream);
    if (e != cudaSuccess) {
      cudaGetLastError();
      ok = make_error("{}: recording the send of microbatch {}: {}", name(), microbatch,
                      cuda_error(e));
    }
  }
  if (!ok) {
    link_->abort();
    return ok.error();
  }
  f->tensor = std::move(tensor);
  in_flight_.push_back(std::move(f));
  ++next_sequence_;
  reap();
  return a;
}

Expected<Tensor> NcclChannel::receive(const Announcement& a) {
  AP_CHECK(!link_->sender(), "{}: receive() on the sending end", name());
  if (a.tag != ends().tag)
    return make_error("{}: announcement {} belongs to channel {}", name(), to_string(a), a.tag);
  auto bytes = payload_bytes(a);
  if (!bytes) return make_error("{}: {}", name(), bytes.error().message);
  std::lock_guard<std::mutex> lock(mu_);
  if (interrupted_.load())
    return make_error("{}: not receiving {}: {}", name(), to_string(a), interrupt_reason());
  if (a.sequence != next_sequence_)
    return make_error(
        "{}: announcement {} received out of order: NCCL takes payloads in post order and "
        "sequence {} is next",
        name(), to_string(a), next_sequence_);
  if (link_->dead())
    return make_error("{}: not receiving {}: the link was aborted", name(), to_string(a));
  cudaSetDevice(link_->device());
  // a pooled buffer no one else holds, of these bytes
  Tensor buffer;
  for (const Tensor& t : pool_) {
    if (t.storage().use_count() == 1 && t.storage()->bytes() == *bytes) {
      buffer = t;
      break;
    }
  }
  if (!buffer.defined()) {
    buffer = Tensor::zeros({static_cast<int64_t>((*bytes + 3) / 4)}, DType::f32, link_->memory());
    if (static_cast<int>(pool_.size()) < opts_.pool_capacity) pool_.push_back(buffer);
  }
  NcclLink::Handles& h = *link_->h_;
  const auto deadline = Clock::now() + opts_.receive_timeout;
  Status ok = settle(h.comm, ncclRecv(buffer.f32(), *bytes, ncclUint8, 0, h.comm, h.stream),
                     deadline, fmt::format("{}: ncclRecv of {}", name(), to_string(a)));
  cudaEvent_t done = nullptr;
  if (ok) {
    cudaError_t e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(done, h.stream);
    if (e != cudaSuccess) {
      cudaGetLastError();
      ok = make_error("{}: recording the receive of {}: {}", name(), to_string(a), cuda_error(e));
    }
  }
  const auto since = Clock::now();
  while (ok) {
    const cudaError_t q = cudaEventQuery(done);
    if (q == cudaSuccess) break;
    ncclResult_t state = ncclSuccess;
    if (q != cudaErrorNotReady) {
      cudaGetLastError();
      ok = make_error("{}: receiving {}: {}", name(), to_string(a), cuda_error(q));
    } else if (interrupted_.load()) {
      ok = make_error("{}: receiving {}: {}", name(), to_string(a), interrupt_reason());
    } else if (Clock::now() > deadline) {
      ok = make_error("{}: no payload for {} within {} ms", name(), to_string(a),
                      opts_.receive_timeout.count());
    } else if (ncclCommGetAsyncError(h.comm, &state) == ncclSuccess && state != ncclSuccess &&
               state != ncclInProgress) {
      ok = make_error("{}: receiving {}: {}", name(), to_string(a), nccl_error(state, h.comm));
    } else {
      pause(since);
    }
  }
  if (done != nullptr) cudaEventDestroy(done);
  if (!ok) {
    link_->abort();  // NCCL cannot cancel the receive: the communicator goes with it
    return ok.error();
  }
  ++next_sequence_;
  return Tensor(buffer.storage(), 0, a.shape(), a.dtype);
}

size_t NcclChannel::pending() const {
  if (!link_->sender()) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  return reap();
}

void NcclChannel::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  if (link_->sender()) {
    const auto deadline = Clock::now() + std::chrono::seconds(1);
    const auto since = Clock::now();
    while (reap() > 0 && Clock::now() < deadline && !link_->dead()) pause(since);
    if (!in_flight_.empty()) {
      link_->abort();  // sends no one will receive: the link cannot carry on after them
      in_flight_.clear();
    }
  }
  std::lock_guard<std::mutex> reason_lock(reason_mu_);
  interrupted_.store(false);
  interrupt_reason_.clear();
}

void NcclChannel::interrupt(const std::string& reason) {
  if (link_->sender()) return;
  {
    // the reason is written before the flag a waiting receive reads
    std::lock_guard<std::mutex> lock(reason_mu_);
    if (!interrupted_.load()) interrupt_reason_ = reason;
  }
  // the waiting receive sees the flag and aborts the link on its own thread (the communicator
  // is never freed under a thread that uses it)
  interrupted_.store(true);
}

size_t NcclChannel::pool_size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pool_.size();
}

#else  // no CUDA in this build

struct NcclLink::Handles {};

std::string nccl_unavailable_reason() {
  return "this build has no NCCL (CUDA was not found when it was configured; ACTORPIPE_CUDA)";
}

Expected<std::string> nccl_unique_id() {
  return make_error("nccl_unique_id: {}", nccl_unavailable_reason());
}

Expected<std::shared_ptr<NcclLink>> NcclLink::connect(const std::string&, bool, BackendMemory&,
                                                      std::chrono::milliseconds) {
  return make_error("NCCL link: {}", nccl_unavailable_reason());
}

NcclLink::NcclLink(bool sender, int device, BackendMemory& memory, std::unique_ptr<Handles> h)
    : sender_(sender), device_(device), memory_(&memory), h_(std::move(h)) {}
NcclLink::~NcclLink() = default;
void NcclLink::abort() {
  dead_.store(true);
}

NcclChannel::~NcclChannel() = default;
Expected<Announcement> NcclChannel::post(Tensor, int64_t, int32_t) {
  return make_error("{}: {}", name(), nccl_unavailable_reason());
}
Expected<Tensor> NcclChannel::receive(const Announcement&) {
  return make_error("{}: {}", name(), nccl_unavailable_reason());
}
size_t NcclChannel::pending() const {
  return 0;
}
void NcclChannel::clear() {}
void NcclChannel::interrupt(const std::string&) {}
size_t NcclChannel::pool_size() const {
  return 0;
}
size_t NcclChannel::reap() const {
  return 0;
}

#endif

}  // namespace actorpipe
