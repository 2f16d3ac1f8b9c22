// StageDevices: pipeline.device opened into one backend per local stage.
#include "engine/devices/stage_devices.hpp"

#include <fmt/format.h>

#include "kernels/check.hpp"
#include "kernels/checked_backend.hpp"
#include "kernels/compute_backend.hpp"
#include "kernels/context.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/device.hpp"

namespace actorpipe {

StageDevices::StageDevices() = default;
StageDevices::StageDevices(StageDevices&&) noexcept = default;
StageDevices& StageDevices::operator=(StageDevices&&) noexcept = default;
// the backends before the Contexts their CPU kernels run on
StageDevices::~StageDevices() {
  backends_.clear();
  owned_.clear();
  contexts_.clear();
}

Expected<StageDevices> StageDevices::open(const PipelineOptions& pipeline, int stages,
                                          const std::function<bool(int)>& local) {
  StageDevices out;
  if (pipeline.device == "cpu") {
    if (!pipeline.device_ids.empty()) {
      return make_error("pipeline.device_ids: only with pipeline.device = \"cuda\"");
    }
    return out;
  }
  if (pipeline.device != "cuda" && pipeline.device != "checked") {
    return make_error("pipeline.device = \"{}\": unknown device (allowed: cpu, cuda, checked)",
                      pipeline.device);
  }
  if (stages < 1) return make_error("pipeline.device: {} stages", stages);
  int gpus = 0;
  if (pipeline.device == "cuda") {
    if (const std::string why = cuda_unavailable_reason(); !why.empty()) {
      return make_error("pipeline.device = \"cuda\": {}", why);
    }
    gpus = probe_devices().cuda_devices;
    if (gpus < 1) return make_error("pipeline.device = \"cuda\": no usable GPU");
    if (!pipeline.device_ids.empty() && static_cast<int>(pipeline.device_ids.size()) != stages) {
      return make_error("pipeline.device_ids: {} entries for {} stages", pipeline.device_ids.size(),
                        stages);
    }
  } else if (!pipeline.device_ids.empty()) {
    return make_error("pipeline.device_ids: only with pipeline.device = \"cuda\" (here \"{}\")",
                      pipeline.device);
  }
  out.backends_.assign(static_cast<size_t>(stages), nullptr);
  out.cpu_kernels_ = pipeline.device != "cuda";
  for (int r = 0; r < stages; ++r) {
    if (local && !local(r)) continue;
    std::unique_ptr<ComputeBackend> backend;
    if (pipeline.device == "checked") {
      out.contexts_.push_back(std::make_unique<Context>(pipeline.threads_per_stage));
      backend = std::make_unique<CheckedBackend>(*out.contexts_.back());
    } else {
      const int id =
          pipeline.device_ids.empty() ? r % gpus : pipeline.device_ids[static_cast<size_t>(r)];
      if (id < 0 || id >= gpus) {
        return make_error("pipeline.device_ids: stage {} on GPU {}, but {} GPU(s) are visible", r,
                          id, gpus);
      }
      try {
        backend = make_cuda_backend(id);
      } catch (const CheckFailure& e) {
        return make_error("pipeline.device = \"cuda\": stage {}: {}", r, e.what());
      }
    }
    out.backends_[static_cast<size_t>(r)] = backend.get();
    out.owned_.push_back(std::move(backend));
  }
  return out;
}

}  // namespace actorpipe
