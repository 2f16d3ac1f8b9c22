// Layer move: the rebuilt stages' state travels under the checkpoint's layer-granular names
// (pipeline_checkpoint_refs out of the old stages, load_pipeline_checkpoint into the new), the
// same mapping a checkpoint written at d stages and resumed at another partition takes.
#include "engine/migration/layer_move.hpp"

#include <chrono>
#include <cstring>

#include "engine/checkpoint/pipeline_checkpoint.hpp"
#include "engine/execution/optimizer_shard.hpp"
#include "engine/execution/stage_worker.hpp"
#include "kernels/check.hpp"

namespace actorpipe {
namespace {

// The global layer a checkpoint tensor name belongs to: "layers.<i>.<slot>[...]".
int layer_of(const std::string& name) {
  constexpr std::string_view prefix = "layers.";
  AP_CHECK(name.rfind(prefix, 0) == 0, "tensor {} names no layer", name);
  int layer = 0;
  for (size_t k = prefix.size(); k < name.size() && name[k] != '.'; ++k)
    layer = layer * 10 + (name[k] - '0');
  return layer;
}

NamedTensor copy_of(const TensorRef& ref) {
  NamedTensor t;
  t.name = ref.name;
  t.dtype = "F32";
  t.shape = ref.shape;
  t.f32.resize(static_cast<size_t>(t.numel()));
  std::memcpy(t.f32.data(), ref.data, t.f32.size() * sizeof(float));
  return t;
}

}  // namespace

Expected<MoveReport> move_layers(const Partition& from, const Partition& to,
                                 std::vector<std::unique_ptr<StageWorker>>& workers,
                                 std::vector<std::unique_ptr<OptimizerShard>>& shards) {
  const auto started = std::chrono::steady_clock::now();
  const int d = from.stages();
  if (to.stages() != d || to.num_layers() != from.num_layers()) {
    return make_error("migration: a move from {} stages over {} layers to {} stages over {} layers",
                      d, from.num_layers(), to.stages(), to.num_layers());
  }
  if (static_cast<int>(workers.size()) != d || static_cast<int>(shards.size()) != d) {
    return make_error("migration: {} workers and {} shards for {} stages", workers.size(),
                      shards.size(), d);
  }
  MoveReport report;
  report.from = from.counts();
  report.to = to.counts();
  std::vector<int> rebuilt;
  for (int r = 0; r < d; ++r) {
    if (!workers[static_cast<size_t>(r)] || !shards[static_cast<size_t>(r)])
      return make_error("migration: stage {} is not in this process", r);
    if (from.begin(r) != to.begin(r) || from.end(r) != to.end(r)) rebuilt.push_back(r);
  }
  for (int l = 0; l < from.num_layers(); ++l)
    report.layers_moved += from.stage_of(l) != to.stage_of(l) ? 1 : 0;
  if (rebuilt.empty()) {
    report.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return report;
  }

  // the rebuilt stages' state by layer-granular name (pipeline_checkpoint_refs checks that
  // they are idle and agree on the update count)
  std::vector<StageWorker*> old_workers;
  std::vector<OptimizerShard*> old_shards;
  for (int r : rebuilt) {
    old_workers.push_back(workers[static_cast<size_t>(r)].get());
    old_shards.push_back(shards[static_cast<size_t>(r)].get());
  }
  auto refs = pipeline_checkpoint_refs(old_workers, old_shards);
  if (!refs) return make_error("migration: {}", refs.error().message);
  const StageWorker& any = *old_workers.front();
  CheckpointContents state;
  state.path = "(the stages' memory)";
  state.info.model = any.model().options();
  state.info.optimizer = any.optimizer_options();
  state.info.extra["updates"] = std::to_string(any.updates());
  auto take = [&](const std::vector<TensorRef>& from_refs, std::vector<NamedTensor>& into) {
    for (const TensorRef& ref : from_refs) {
      NamedTensor t = copy_of(ref);
      const int64_t bytes = t.numel() * static_cast<int64_t>(sizeof(float));
      report.bytes_copied += bytes;
      const int layer = layer_of(t.name);
      if (from.stage_of(layer) != to.stage_of(layer)) report.bytes_moved += bytes;
      into.push_back(std::move(t));
    }
  };
  take(refs->model, state.model);
  take(refs->optimizer, state.optimizer);
  take(refs->versions, state.versions);

  std::vector<std::unique_ptr<StageWorker>> new_workers;
  std::vector<std::unique_ptr<OptimizerShard>> new_shards;
  std::vector<StageWorker*> new_w;
  std::vector<OptimizerShard*> new_s;
  for (int r : rebuilt) {
    const StageWorker& old = *workers[static_cast<size_t>(r)];
    StageWorkerOptions wo = old.options();
    wo.init_params = false;  // every parameter is loaded below
    new_workers.push_back(
        std::make_unique<StageWorker>(old.model(), to, old.optimizer_options(), wo));
    new_shards.push_back(
        std::make_unique<OptimizerShard>(old.model(), to, r, old.optimizer_options()));
    new_workers.back()->predict_from(*new_shards.back());
    new_w.push_back(new_workers.back().get());
    new_s.push_back(new_shards.back().get());
  }
  if (Status ok = load_pipeline_checkpoint(state, new_w, new_s); !ok)
    return make_error("migration: installing the moved state: {}", ok.error().message);
  // nothing can fail from here on: the new stages take their places
  for (size_t k = 0; k < rebuilt.size(); ++k) {
    workers[static_cast<size_t>(rebuilt[k])] = std::move(new_workers[k]);
    shards[static_cast<size_t>(rebuilt[k])] = std::move(new_shards[k]);
  }
  for (int r = 0; r < d; ++r) workers[static_cast<size_t>(r)]->repartition(to);
  report.stages_rebuilt = std::move(rebuilt);
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return report;
}

}  // namespace actorpipe
