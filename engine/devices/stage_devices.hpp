// StageDevices: what pipeline.device asks the stages to compute on, opened. One compute backend
// per stage of this process, owned here, handed to the executors as StageWorkerOptions::backend
// (SerialExecutorOptions::backends, ActorEngineOptions::backends):
//   "cpu"      no backend: every stage computes on its own CPU backend, on host memory;
//   "cuda"     the CUDA backend (kernels/cuda/cuda_backend.hpp) on the stage's GPU,
//              pipeline.device_ids[r], or r mod (GPUs visible) when that list is empty;
//   "checked"  a CheckedBackend per stage (kernels/checked_backend.hpp): the CPU kernels on
//              memory closed to the host between operations, the CPU's bits.
// Opening fails, naming the key, where a backend cannot be made (no CUDA in the build, no usable
// GPU, an index out of range): a run never falls back to the CPU.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/expected.hpp"
#include "engine/options.hpp"

namespace actorpipe {

class ComputeBackend;
class Context;

class StageDevices {
 public:
  /// The backends of a pipeline of `stages` stages as `pipeline` (device, device_ids,
  /// threads_per_stage) asks, for the stages `local(r)` says this process runs (all when empty).
  static Expected<StageDevices> open(const PipelineOptions& pipeline, int stages,
                                     const std::function<bool(int)>& local = {});

  StageDevices();
  StageDevices(StageDevices&&) noexcept;
  StageDevices& operator=(StageDevices&&) noexcept;
  ~StageDevices();

  /// Per stage its backend, nullptr for a stage on the CPU or of another process; empty when
  /// no stage of this process is off the CPU.
  const std::vector<ComputeBackend*>& backends() const { return backends_; }
  /// Whether this process's stages compute with the CPU kernels ("cpu", "checked"): their bf16
  /// products need the CPU's bf16 instructions; a GPU's do not.
  bool cpu_kernels() const { return cpu_kernels_; }

 private:
  std::vector<std::unique_ptr<Context>> contexts_;  // the checked backends' CPU kernels
  std::vector<std::unique_ptr<ComputeBackend>> owned_;
  std::vector<ComputeBackend*> backends_;
  bool cpu_kernels_ = true;
};

}  // namespace actorpipe
