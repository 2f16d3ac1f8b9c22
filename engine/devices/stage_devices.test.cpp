// StageDevices: pipeline.device opened into one backend per stage of this process, and the
// errors that name the key where it cannot be.
#include "engine/devices/stage_devices.hpp"

#include <doctest/doctest.h>

#include <string>

#include "kernels/compute_backend.hpp"
#include "kernels/cuda/cuda_backend.hpp"

using namespace actorpipe;

namespace {

PipelineOptions on(const std::string& device, std::vector<int> ids = {}) {
  PipelineOptions p;
  p.device = device;
  p.device_ids = std::move(ids);
  return p;
}

std::string error_of(const Expected<StageDevices>& d) {
  REQUIRE_FALSE(d.ok());
  return d.error().message;
}

}  // namespace

TEST_CASE("cpu: no backend, every stage on its own CPU backend") {
  auto d = StageDevices::open(on("cpu"), 3);
  REQUIRE(d.ok());
  CHECK(d->backends().empty());
  CHECK(d->cpu_kernels());
}

TEST_CASE("checked: a backend per local stage, each with memory of its own, closed to the host") {
  auto d = StageDevices::open(on("checked"), 3, [](int r) { return r != 1; });
  REQUIRE(d.ok());
  const auto& b = d->backends();
  REQUIRE(b.size() == 3);
  REQUIRE(b[0] != nullptr);
  CHECK(b[1] == nullptr);  // another process's stage
  REQUIRE(b[2] != nullptr);
  CHECK(b[0] != b[2]);
  for (ComputeBackend* be : {b[0], b[2]}) {
    CHECK_FALSE(be->host_memory());
    CHECK(be->name().find("checked") != std::string::npos);
  }
  // the memory works through the backend
  float* p = b[0]->allocate(4);
  const float in[4] = {1, 2, 3, 4};
  float out[4] = {};
  b[0]->to_backend(p, in, 4);
  b[0]->to_host(out, p, 4);
  b[0]->release(p);
  CHECK(out[3] == 4.0f);
  CHECK(d->cpu_kernels());  // the checked device computes with the CPU's kernels
}

TEST_CASE("cuda: opened on a usable GPU, else an error naming the key and the reason") {
  const std::string why = cuda_unavailable_reason();
  auto d = StageDevices::open(on("cuda"), 2);
  if (!why.empty()) {
    const std::string e = error_of(d);
    CHECK(e.find("pipeline.device = \"cuda\"") != std::string::npos);
    CHECK(e.find(why) != std::string::npos);
  } else {
    REQUIRE(d.ok());
    REQUIRE(d->backends().size() == 2);
    CHECK(d->backends()[0]->device() == Device::cuda);
    const std::string e = error_of(StageDevices::open(on("cuda", {0, 4096}), 2));
    CHECK(e.find("stage 1 on GPU 4096") != std::string::npos);
  }
}

TEST_CASE("bad requests name the key") {
  CHECK(error_of(StageDevices::open(on("tpu"), 2)).find("pipeline.device = \"tpu\"") !=
        std::string::npos);
  CHECK(error_of(StageDevices::open(on("checked", {0, 1}), 2)).find("pipeline.device_ids") !=
        std::string::npos);
  CHECK(error_of(StageDevices::open(on("cpu", {0}), 1)).find("pipeline.device_ids") !=
        std::string::npos);
}
