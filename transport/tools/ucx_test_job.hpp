// Tests' helper: n UCX workers of this process, each with an endpoint to every other, as the
// ranks of a job hold them (ucx_exchange and ucx_messenger tests).
#pragma once

#include <doctest/doctest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/expected.hpp"
#include "transport/ucx_worker.hpp"

namespace actorpipe::test {

/// The error message of `e`, empty when it holds a value (for test messages).
template <class T>
std::string why(const Expected<T>& e) {
  return e.ok() ? std::string() : e.error().message;
}

/// workers[i] is rank i's; peers[i] maps every other rank to rank i's endpoint to it.
struct UcxTestJob {
  std::vector<std::shared_ptr<UcxWorker>> workers;
  std::vector<std::map<int, UcxEndpoint>> peers;
};

/// `options` for every worker (named "worker i").
inline UcxTestJob connected_workers(int n, UcxWorkerOptions options = {}) {
  UcxTestJob job;
  for (int i = 0; i < n; ++i) {
    UcxWorkerOptions o = options;
    o.name = "worker " + std::to_string(i);
    auto w = UcxWorker::create(o);
    REQUIRE_MESSAGE(w.ok(), why(w));
    job.workers.push_back(*w);
  }
  job.peers.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      auto ep = job.workers[static_cast<size_t>(i)]->connect(
          job.workers[static_cast<size_t>(j)]->address());
      REQUIRE_MESSAGE(ep.ok(), why(ep));
      job.peers[static_cast<size_t>(i)][j] = *ep;
    }
  }
  return job;
}

}  // namespace actorpipe::test
