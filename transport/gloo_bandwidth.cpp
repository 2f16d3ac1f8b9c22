// Gloo bandwidth: the all-reduce timed among threads of this process over loopback TCP.
#include "transport/gloo_bandwidth.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "transport/gloo_group.hpp"

namespace actorpipe {

namespace {

// The members' texts handed to each other in memory (one round).
class MemoryExchange {
 public:
  explicit MemoryExchange(int size) : texts_(static_cast<size_t>(size)) {}
  AllGatherText member(int rank) {
    return [this, rank](std::string mine) -> Expected<std::vector<std::string>> {
      std::unique_lock lock(mu_);
      texts_[static_cast<size_t>(rank)] = std::move(mine);
      ++given_;
      cv_.notify_all();
      if (!cv_.wait_for(lock, std::chrono::seconds(30),
                        [&] { return given_ == static_cast<int>(texts_.size()); }))
        return make_error("{} of {} members came within 30 s", given_, texts_.size());
      std::vector<std::string> all;
      for (const auto& t : texts_) all.push_back(*t);
      return all;
    };
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::optional<std::string>> texts_;
  int given_ = 0;
};

}  // namespace

Expected<AllReduceTiming> time_local_all_reduce(int members, int64_t floats, int reps) {
  if (members < 2 || floats < 1 || reps < 1) {
    return make_error(
        "timing the all-reduce: {} members, {} floats, {} reps (expected >= 2, >= 1, "
        ">= 1)",
        members, floats, reps);
  }
  MemoryExchange exchange(members);
  std::vector<std::string> errors(static_cast<size_t>(members));
  std::vector<double> times;
  int64_t sent = 0;
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < members; ++r) {
      threads.emplace_back([&, r] {
        GlooGroupOptions o;
        o.rank = r;
        o.size = members;
        o.name = "all-reduce timing";
        o.timeout = std::chrono::seconds(60);
        auto group = GlooGroup::connect(o, exchange.member(r));
        if (!group) {
          errors[static_cast<size_t>(r)] = group.error().message;
          return;
        }
        std::vector<float> data(static_cast<size_t>(floats), 1.0f);
        for (int k = 0; k <= reps; ++k) {
          const int64_t before = (*group)->bytes_sent();
          const auto t0 = std::chrono::steady_clock::now();
          if (Status ok = (*group)->all_reduce_sum(data); !ok) {
            errors[static_cast<size_t>(r)] = ok.error().message;
            return;
          }
          const double s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (r == 0 && k > 0) {  // the first call warms up
            times.push_back(s);
            sent = (*group)->bytes_sent() - before;
          }
        }
      });
    }
  }
  for (const std::string& e : errors)
    if (!e.empty()) return make_error("timing the all-reduce: {}", e);
  std::sort(times.begin(), times.end());
  AllReduceTiming t;
  t.members = members;
  t.floats = floats;
  t.seconds = times[times.size() / 2];
  t.bytes_per_second = t.seconds > 0 ? static_cast<double>(sent) / t.seconds : 0.0;
  return t;
}

Expected<AllReduceCost> measure_all_reduce_cost(int64_t floats, int reps) {
  auto large = time_local_all_reduce(2, floats, reps);
  if (!large) return large.error();
  auto tiny = time_local_all_reduce(2, 1, reps);
  if (!tiny) return tiny.error();
  AllReduceCost c;
  c.large = *large;
  c.tiny = *tiny;
  c.latency = tiny->seconds;
  const double sent_large = large->bytes_per_second * large->seconds;
  const double sent_tiny = tiny->bytes_per_second * tiny->seconds;
  c.bandwidth = large->seconds > tiny->seconds
                    ? (sent_large - sent_tiny) / (large->seconds - tiny->seconds)
                    : large->bytes_per_second;
  return c;
}

}  // namespace actorpipe
