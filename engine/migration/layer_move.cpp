// Layer move: the rebuilt stages' state travels under the checkpoint's layer-granular names
// (pipeline_checkpoint_refs out of the old stages, load_pipeline_checkpoint into the new), the
// same mapping a checkpoint written at d stages and resumed at another partition takes.
#include "engine/migration/layer_move.hpp"

#include <chrono>
#include <cstring>
#include <utility>

#include "engine/checkpoint/pipeline_checkpoint.hpp"
#include "engine/execution/optimizer_shard.hpp"
#include "engine/execution/stage_worker.hpp"
#include "engine/execution/tied_params.hpp"
#include "engine/execution/weight_store.hpp"

namespace actorpipe {
namespace {

NamedTensor copy_of(const TensorRef& ref) {
  NamedTensor t;
  t.name = ref.name;
  t.dtype = "F32";
  t.shape = ref.shape;
  t.f32.resize(static_cast<size_t>(t.numel()));
  std::memcpy(t.f32.data(), ref.data, t.f32.size() * sizeof(float));
  return t;
}

Status check_sizes(const Partition& from, const Partition& to, size_t workers, size_t shards) {
  const int d = from.stages();
  if (to.stages() != d || to.num_layers() != from.num_layers()) {
    return make_error("migration: a move from {} stages over {} layers to {} stages over {} layers",
                      d, from.num_layers(), to.stages(), to.num_layers());
  }
  if (static_cast<int>(workers) != d || static_cast<int>(shards) != d)
    return make_error("migration: {} workers and {} shards for {} stages", workers, shards, d);
  return {};
}

// 2bw: a tied copy that follows its owner loads the owner's previous version with its own
// (load_pipeline_checkpoint). When the owner's stage is not rebuilt, the state holds none of the
// owner's tensors, but the copy's own previous version holds exactly that value (at rest a
// follow_owner copy holds the owner's versions: StageWorker::install_tied_weights), so it stands
// in under the owner's name.
void add_tied_owner_versions(CheckpointContents& state, std::span<StageWorker* const> rebuilt) {
  const std::string* text = nullptr;
  if (auto it = state.info.extra.find("updates"); it != state.info.extra.end()) text = &it->second;
  if (text == nullptr || *text == "0") return;
  const std::string suffix = fmt::format("@v{}", std::stol(*text) - 1);
  for (const StageWorker* w : rebuilt) {
    if (version_policy(w->mode()) != VersionPolicy::double_buffered) continue;
    for (size_t k = 0; k < w->num_tied(); ++k) {
      if (w->tied_role(k) != TiedRole::copy || tied_sync(w->mode()) != TiedSync::follow_owner)
        continue;
      const TiedParam& tp = w->model().tied()[k];
      const auto [owner, copy] = w->model().tied_slots(tp);
      const std::string owner_name = w->model().param_name(tp.owner_layer, owner) + suffix;
      if (find_tensor(state.versions, owner_name) != nullptr) continue;
      const NamedTensor* held =
          find_tensor(state.versions, w->model().param_name(tp.copy_layer, copy) + suffix);
      if (held == nullptr) continue;  // the load names what is missing
      NamedTensor alias = *held;
      alias.name = owner_name;
      state.versions.push_back(std::move(alias));
    }
  }
}

}  // namespace

RebuiltStages::RebuiltStages(RebuiltStages&& other) noexcept
    : stages(std::move(other.stages)),
      workers(std::move(other.workers)),
      shards(std::move(other.shards)),
      lenders(std::exchange(other.lenders, {})),
      scratch(std::move(other.scratch)) {}

RebuiltStages& RebuiltStages::operator=(RebuiltStages&& other) noexcept {
  if (this != &other) {
    RebuiltStages dropped(std::move(*this));  // hands its buffers back
    stages = std::move(other.stages);
    workers = std::move(other.workers);
    shards = std::move(other.shards);
    lenders = std::exchange(other.lenders, {});
    scratch = std::move(other.scratch);
  }
  return *this;
}

RebuiltStages::~RebuiltStages() {
  if (lenders.empty()) return;
  for (auto& w : workers)
    if (w && w->holds_scratch()) w->give_scratch(scratch);
  for (StageWorker* w : lenders) w->take_scratch(scratch);
}

int checkpoint_layer(const std::string& name) {
  constexpr std::string_view prefix = "layers.";
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) return -1;
  int layer = 0;
  size_t k = prefix.size();
  for (; k < name.size() && name[k] != '.'; ++k) {
    if (name[k] < '0' || name[k] > '9' || layer > 100'000'000) return -1;
    layer = layer * 10 + (name[k] - '0');
  }
  return k == prefix.size() ? -1 : layer;
}

Expected<std::vector<int>> rebuilt_stages(const Partition& from, const Partition& to) {
  if (to.stages() != from.stages() || to.num_layers() != from.num_layers()) {
    return make_error("migration: a move from {} stages over {} layers to {} stages over {} layers",
                      from.stages(), from.num_layers(), to.stages(), to.num_layers());
  }
  std::vector<int> out;
  for (int r = 0; r < from.stages(); ++r)
    if (from.begin(r) != to.begin(r) || from.end(r) != to.end(r)) out.push_back(r);
  return out;
}

Expected<CheckpointContents> rebuilt_state(
    const Partition& from, const Partition& to,
    std::span<const std::unique_ptr<StageWorker>> workers,
    std::span<const std::unique_ptr<OptimizerShard>> shards) {
  if (Status ok = check_sizes(from, to, workers.size(), shards.size()); !ok) return ok.error();
  auto rebuilt = rebuilt_stages(from, to);
  if (!rebuilt) return rebuilt.error();
  std::vector<StageWorker*> old_workers;
  std::vector<OptimizerShard*> old_shards;
  for (int r : *rebuilt) {
    const size_t k = static_cast<size_t>(r);
    if ((workers[k] == nullptr) != (shards[k] == nullptr))
      return make_error("migration: stage {} has a worker or a shard but not both here", r);
    if (workers[k] == nullptr) continue;  // another process's
    old_workers.push_back(workers[k].get());
    old_shards.push_back(shards[k].get());
  }
  CheckpointContents state;
  state.path = "(the stages' memory)";
  if (old_workers.empty()) return state;
  // pipeline_checkpoint_refs checks that they are idle and agree on the update count
  auto refs = pipeline_checkpoint_refs(old_workers, old_shards);
  if (!refs) return make_error("migration: {}", refs.error().message);
  const StageWorker& any = *old_workers.front();
  state.info.model = any.model().options();
  state.info.optimizer = any.optimizer_options();
  state.info.extra["updates"] = std::to_string(any.updates());
  for (const TensorRef& ref : refs->model) state.model.push_back(copy_of(ref));
  for (const TensorRef& ref : refs->optimizer) state.optimizer.push_back(copy_of(ref));
  for (const TensorRef& ref : refs->versions) state.versions.push_back(copy_of(ref));
  return state;
}

Expected<RebuiltStages> build_rebuilt_stages(
    const Partition& from, const Partition& to, CheckpointContents state,
    std::span<const std::unique_ptr<StageWorker>> workers,
    std::span<const std::unique_ptr<OptimizerShard>> shards) {
  if (Status ok = check_sizes(from, to, workers.size(), shards.size()); !ok) return ok.error();
  auto stages = rebuilt_stages(from, to);
  if (!stages) return stages.error();
  RebuiltStages out;  // on an error, its destructor hands the lent scratch back
  for (int r : *stages) {
    const size_t k = static_cast<size_t>(r);
    if (workers[k] == nullptr || shards[k] == nullptr) continue;  // another process's
    workers[k]->give_scratch(out.scratch);
    out.lenders.push_back(workers[k].get());
  }
  std::vector<StageWorker*> new_w;
  std::vector<OptimizerShard*> new_s;
  for (int r : *stages) {
    const size_t k = static_cast<size_t>(r);
    if (workers[k] == nullptr || shards[k] == nullptr) continue;  // another process's
    const StageWorker& old = *workers[k];
    StageWorkerOptions wo = old.options();
    wo.init_params = false;  // every parameter is loaded below
    out.stages.push_back(r);
    out.workers.push_back(
        std::make_unique<StageWorker>(old.model(), to, old.optimizer_options(), wo, &out.scratch));
    // the shard's state lives where the stage computes (its backend's memory)
    out.shards.push_back(std::make_unique<OptimizerShard>(
        old.model(), to, r, old.optimizer_options(), out.workers.back()->memory()));
    out.workers.back()->predict_from(*out.shards.back());
    new_w.push_back(out.workers.back().get());
    new_s.push_back(out.shards.back().get());
  }
  if (new_w.empty()) return out;
  add_tied_owner_versions(state, new_w);
  if (Status ok = load_pipeline_checkpoint(state, new_w, new_s); !ok)
    return make_error("migration: installing the moved state: {}", ok.error().message);
  return out;
}

void install_rebuilt_stages(RebuiltStages rebuilt, const Partition& to,
                            std::vector<std::unique_ptr<StageWorker>>& workers,
                            std::vector<std::unique_ptr<OptimizerShard>>& shards) {
  rebuilt.lenders.clear();  // they are replaced: their buffers stay with the new stages
  for (size_t k = 0; k < rebuilt.stages.size(); ++k) {
    workers[static_cast<size_t>(rebuilt.stages[k])] = std::move(rebuilt.workers[k]);
    shards[static_cast<size_t>(rebuilt.stages[k])] = std::move(rebuilt.shards[k]);
  }
  for (auto& w : workers)
    if (w) w->repartition(to);
}

Expected<MoveReport> move_layers(const Partition& from, const Partition& to,
                                 std::vector<std::unique_ptr<StageWorker>>& workers,
                                 std::vector<std::unique_ptr<OptimizerShard>>& shards) {
  const auto started = std::chrono::steady_clock::now();
  if (Status ok = check_sizes(from, to, workers.size(), shards.size()); !ok) return ok.error();
  for (int r = 0; r < from.stages(); ++r) {
    if (!workers[static_cast<size_t>(r)] || !shards[static_cast<size_t>(r)])
      return make_error("migration: stage {} is not in this process", r);
  }
  auto rebuilt = rebuilt_stages(from, to);
  if (!rebuilt) return rebuilt.error();
  MoveReport report;
  report.from = from.counts();
  report.to = to.counts();
  for (int l = 0; l < from.num_layers(); ++l)
    report.layers_moved += from.stage_of(l) != to.stage_of(l) ? 1 : 0;
  if (!rebuilt->empty()) {
    auto state = rebuilt_state(from, to, workers, shards);
    if (!state) return state.error();
    for (const auto* group : {&state->model, &state->optimizer, &state->versions}) {
      for (const NamedTensor& t : *group) {
        const int64_t bytes = t.numel() * static_cast<int64_t>(sizeof(float));
        report.bytes_copied += bytes;
        const int layer = checkpoint_layer(t.name);
        if (from.stage_of(layer) != to.stage_of(layer)) report.bytes_moved += bytes;
      }
    }
    auto built = build_rebuilt_stages(from, to, std::move(*state), workers, shards);
    if (!built) return built.error();
    report.bytes_reused = static_cast<int64_t>(built->scratch.bytes_reused());
    // nothing can fail from here on: the new stages take their places
    install_rebuilt_stages(std::move(*built), to, workers, shards);
  }
  report.stages_rebuilt = std::move(*rebuilt);
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return report;
}

}  // namespace actorpipe
