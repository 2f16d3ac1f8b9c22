// Gradient reducer: the replica-order sum, and replicas as threads of one process.
#include "engine/execution/gradient_reducer.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "kernels/check.hpp"

namespace actorpipe {

Status all_reduce_in(GradientReducer& reducer, BackendMemory& memory, int stage, long step,
                     std::span<float> data) {
  if (memory.host_memory()) return reducer.all_reduce(stage, step, data);
  std::vector<float> host(data.size());
  memory.to_host(host.data(), data.data(), data.size());
  if (Status ok = reducer.all_reduce(stage, step, host); !ok) return ok;
  memory.to_backend(data.data(), host.data(), host.size());
  memory.synchronize();  // the staging buffer dies here
  return {};
}

void sum_in_replica_order(std::span<const std::span<const float>> parts, std::span<float> into) {
  AP_CHECK(!parts.empty(), "a sum over no replicas");
  for (const auto& p : parts)
    AP_CHECK(p.size() == into.size(), "replica gradients of {} and {} floats", p.size(),
             into.size());
  const size_t n = into.size();
  // element-wise, each element's sum in replica order; blocked so the parts stream through
  constexpr size_t kBlock = 4096;
  float acc[kBlock];
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = std::min(n, b + kBlock);
    for (size_t i = b; i < e; ++i) acc[i - b] = parts[0][i];
    for (size_t r = 1; r < parts.size(); ++r) {
      const float* p = parts[r].data();
      for (size_t i = b; i < e; ++i) acc[i - b] += p[i];
    }
    for (size_t i = b; i < e; ++i) into[i] = acc[i - b];
  }
}

class LocalReducer::Member : public GradientReducer {
 public:
  Member(LocalReducer& owner, int replica) : owner_(owner), replica_(replica) {}
  int replicas() const override { return owner_.w_; }
  Status all_reduce(int stage, long step, std::span<float> data) override {
    return owner_.reduce(replica_, stage, step, data);
  }

 private:
  LocalReducer& owner_;
  int replica_;
};

LocalReducer::LocalReducer(int replicas, std::chrono::milliseconds timeout)
    : w_(replicas), timeout_(timeout) {
  AP_CHECK(replicas >= 1, "replicas = {}", replicas);
  for (int r = 0; r < replicas; ++r) members_.push_back(std::make_unique<Member>(*this, r));
}

LocalReducer::~LocalReducer() = default;

GradientReducer& LocalReducer::member(int replica) {
  AP_CHECK(replica >= 0 && replica < w_, "replica {} of {}", replica, w_);
  return *members_[static_cast<size_t>(replica)];
}

void LocalReducer::abort(const std::string& reason) {
  std::lock_guard lock(mu_);
  if (failed_.empty()) failed_ = reason;
  cv_.notify_all();
}

Status LocalReducer::reduce(int replica, int stage, long step, std::span<float> data) {
  if (w_ == 1) return {};
  std::unique_lock lock(mu_);
  if (!failed_.empty()) return make_error("{}", failed_);
  const auto key = std::make_pair(stage, step);
  Round& round = rounds_[key];
  if (round.data.empty()) {
    round.data.resize(static_cast<size_t>(w_));
    round.in.assign(static_cast<size_t>(w_), false);
  }
  AP_CHECK(!round.in[static_cast<size_t>(replica)], "replica {} reduces stage {}'s step {} twice",
           replica, stage, step);
  round.in[static_cast<size_t>(replica)] = true;
  round.data[static_cast<size_t>(replica)] = data;
  if (++round.arrived == w_) {
    std::vector<std::span<const float>> parts;
    for (const auto& d : round.data) {
      if (d.size() != data.size()) {
        failed_ = fmt::format("stage {}, step {}: replicas hold {} and {} gradients", stage, step,
                              d.size(), data.size());
        cv_.notify_all();
        return make_error("{}", failed_);
      }
      parts.emplace_back(d.data(), d.size());
    }
    std::vector<float> sum(data.size());
    sum_in_replica_order(parts, sum);
    for (const auto& d : round.data) std::copy(sum.begin(), sum.end(), d.begin());
    round.done = true;
    cv_.notify_all();
  } else {
    const bool ok = cv_.wait_for(lock, timeout_, [&] { return round.done || !failed_.empty(); });
    if (!failed_.empty()) return make_error("{}", failed_);
    if (!ok) {
      std::vector<int> missing;
      for (int r = 0; r < w_; ++r)
        if (!round.in[static_cast<size_t>(r)]) missing.push_back(r);
      failed_ = fmt::format(
          "stage {}, step {}: replica {} waited {} ms for replica(s) {} to reduce their gradients",
          stage, step, replica, timeout_.count(), fmt::join(missing, ", "));
      cv_.notify_all();
      return make_error("{}", failed_);
    }
  }
  if (++round.left == w_) rounds_.erase(key);
  return {};
}

}  // namespace actorpipe
