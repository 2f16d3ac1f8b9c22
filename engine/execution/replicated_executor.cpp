// ReplicatedExecutor: w serial executors on w threads, meeting in a LocalReducer.
#include "engine/execution/replicated_executor.hpp"

#include <fmt/format.h>

#include <atomic>
#include <thread>

#include "engine/data/loader.hpp"
#include "kernels/check.hpp"

namespace actorpipe {

std::vector<Microbatch> replica_batches(std::span<const Microbatch> all, const ReplicaSplit& split,
                                        int replica) {
  const size_t m = static_cast<size_t>(split.microbatches);
  AP_CHECK(split.replicas >= 1 && split.microbatches % split.replicas == 0,
           "{} microbatches over {} replicas", split.microbatches, split.replicas);
  AP_CHECK(all.size() % m == 0, "{} microbatches are not whole steps of {}", all.size(), m);
  std::vector<Microbatch> out;
  for (size_t s = 0; s < all.size(); s += m) {
    for (int j = 0; j < split.per_replica(); ++j)
      out.push_back(all[s + static_cast<size_t>(split.step_index(replica, j))]);
  }
  return out;
}

double combine_replica_losses(std::span<const double> per_replica) {
  AP_CHECK(!per_replica.empty(), "no replica losses");
  double sum = 0.0;
  for (double l : per_replica) sum += l;
  return sum / static_cast<double>(per_replica.size());
}

Expected<std::unique_ptr<ReplicatedExecutor>> ReplicatedExecutor::create(const Config& config,
                                                                         const Model* own_model) {
  const int w = config.pipeline.replicas;
  if (w < 1) return make_error("pipeline.replicas = {}: must be >= 1", w);
  std::unique_ptr<ReplicatedExecutor> ex(new ReplicatedExecutor());
  ex->split_ = {config.pipeline.microbatches, w};
  ex->reducer_ = std::make_unique<LocalReducer>(w);
  for (int r = 0; r < w; ++r) {
    auto s = SerialExecutor::create(config, false, own_model,
                                    w > 1 ? &ex->reducer_->member(r) : nullptr);
    if (!s) return s.error();
    ex->replicas_.push_back(std::move(*s));
  }
  return ex;
}

SerialExecutor& ReplicatedExecutor::replica(int r) {
  AP_CHECK(r >= 0 && r < replicas(), "replica {} of {}", r, replicas());
  return *replicas_[static_cast<size_t>(r)];
}

const SerialExecutor& ReplicatedExecutor::replica(int r) const {
  AP_CHECK(r >= 0 && r < replicas(), "replica {} of {}", r, replicas());
  return *replicas_[static_cast<size_t>(r)];
}

Expected<std::vector<double>> ReplicatedExecutor::run(int steps,
                                                      std::span<const Microbatch> batches) {
  if (steps < 1) return make_error("steps = {}: must be >= 1", steps);
  const int64_t want = replicas_.front()->microbatches_for(steps) * split_.replicas;
  if (static_cast<int64_t>(batches.size()) != want) {
    return make_error("{} steps read {} microbatches, got {}", steps, want, batches.size());
  }
  const int w = replicas();
  std::vector<Expected<std::vector<double>>> results(static_cast<size_t>(w),
                                                     make_error("replica did not run"));
  std::atomic<int> first_failed{-1};
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < w; ++r) {
      threads.emplace_back([&, r] {
        const std::vector<Microbatch> mine = replica_batches(batches, split_, r);
        auto& res = results[static_cast<size_t>(r)];
        res = replicas_[static_cast<size_t>(r)]->run(steps, mine);
        // the others must not wait for this one's gradients
        if (!res) {
          int none = -1;
          first_failed.compare_exchange_strong(none, r);
          reducer_->abort(fmt::format("replica {} failed", r));
        }
      });
    }
  }
  // the first replica that failed (the others then failed in the reducer)
  if (const int r = first_failed.load(); r >= 0)
    return make_error("replica {}: {}", r, results[static_cast<size_t>(r)].error().message);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    std::vector<double> per;
    for (int r = 0; r < w; ++r)
      per.push_back((*results[static_cast<size_t>(r)])[static_cast<size_t>(s)]);
    losses.push_back(combine_replica_losses(per));
  }
  return losses;
}

Expected<std::vector<double>> ReplicatedExecutor::run(int steps, DataLoader& data) {
  if (steps < 1) return make_error("steps = {}: must be >= 1", steps);
  std::vector<Microbatch> batches;
  const int64_t n = replicas_.front()->microbatches_for(steps) * split_.replicas;
  try {
    for (int64_t i = 0; i < n; ++i) batches.push_back(data.next());
  } catch (const std::exception& e) {
    return make_error("{}", e.what());
  }
  return run(steps, batches);
}

}  // namespace actorpipe
