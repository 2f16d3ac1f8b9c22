// Memory check: the least bytes of a run's stages against what their memory has left.
#include "engine/execution/memory_check.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace actorpipe {
namespace {

std::string bytes_text(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024.0 && u < 6) {
    b /= 1024.0;
    ++u;
  }
  return fmt::format("{:.1f} {}", b, units[u]);
}

// The parameter floats of the layers `stages` hold (all, or those a bf16 stash keeps in bf16).
uint64_t param_floats(const Model& model, const Partition& partition, std::span<const int> stages,
                      bool stashed_only = false) {
  uint64_t floats = 0;
  for (int r : stages)
    for (int i = partition.begin(r); i < partition.end(r); ++i)
      floats += stashed_only ? model.bf16_stash_floats(i) : model.layer(i).param_floats();
  return floats;
}

// The error when `need` bytes exceed `available`: `where` empty for the host's RAM, else the
// memory's name
Status fits(const Model& model, const Partition& partition, const std::string& optimizer_kind,
            std::span<const int> stages, int B, int T, uint64_t need,
            std::optional<uint64_t> available, bool bf16_copies, const std::string& where) {
  if (!available || need <= *available) return {};
  const uint64_t floats = param_floats(model, partition, stages);
  const ModelOptions& o = model.options();
  const std::string avail = bytes_text(static_cast<double>(*available));
  return make_error(
      "model.width = {}, model.depth = {}, model.vocab_size = {}, model.context = {}, "
      "pipeline.microbatch_size = {}, sequence length {}: the stages {} need at least {} "
      "(weights, gradients, {} state and weight versions{} of {:.3g} parameter floats, and one "
      "microbatch's activations), {}",
      o.width, o.depth, o.vocab_size, o.context, B, T,
      where.empty() ? std::string("here")
                    : fmt::format("[{}] on {}", fmt::join(stages, ", "), where),
      bytes_text(static_cast<double>(need)), optimizer_kind,
      bf16_copies ? " with their bf16 copies" : "", static_cast<double>(floats),
      where.empty() ? fmt::format("{} of memory is available", avail)
                    : fmt::format("{} is free there", avail));
}

}  // namespace

uint64_t least_stage_bytes(const Model& model, const Partition& partition, Mode mode,
                           const std::string& optimizer_kind, std::span<const int> stages, int B,
                           int T, Precision precision, bool bf16_stash) {
  const uint64_t versions =
      1 + (mode == Mode::twobw || mode == Mode::pipedream || mode == Mode::xpipe ? 1 : 0);
  const uint64_t per_float =
      4 * (versions + 1 /* gradients */ + (optimizer_kind == "sgd" ? 1 : 2)) +
      (precision == Precision::bf16 ? 2 * versions : 0);
  const ModelOptions& o = model.options();
  const uint64_t tokens =
      static_cast<uint64_t>(std::max(B, 0)) * static_cast<uint64_t>(std::max(T, 0));
  uint64_t bytes = param_floats(model, partition, stages) * per_float;
  // a bf16 stash keeps the extra versions' product operands as their bf16 copy alone
  if (bf16_stash) bytes -= 4 * (versions - 1) * param_floats(model, partition, stages, true);
  for (int r : stages) {
    bytes += 4 * tokens * static_cast<uint64_t>(o.width);  // the stage's output
    if (r == partition.stages() - 1) bytes += 4 * tokens * static_cast<uint64_t>(o.vocab_size);
  }
  return bytes;
}

Status check_memory_fits(const Model& model, const Partition& partition, Mode mode,
                         const std::string& optimizer_kind, std::span<const int> stages, int B,
                         int T, std::optional<uint64_t> available, Precision precision,
                         bool bf16_stash) {
  if (!available) return {};
  const uint64_t need = least_stage_bytes(model, partition, mode, optimizer_kind, stages, B, T,
                                          precision, bf16_stash);
  return fits(model, partition, optimizer_kind, stages, B, T, need, available,
              precision == Precision::bf16, "");
}

Status check_stages_fit(const Model& model, const Partition& partition, Mode mode,
                        const std::string& optimizer_kind, std::span<const int> stages,
                        std::span<BackendMemory* const> memories, int B, int T, Precision precision,
                        bool bf16_stash) {
  auto memory_of = [&](int r) -> BackendMemory& {
    BackendMemory* m = memories.empty() ? nullptr : memories[static_cast<size_t>(r)];
    return m != nullptr ? *m : host_backend_memory();
  };
  // the stages by pool, in order of their first stage
  std::vector<std::vector<int>> pools;
  for (int r : stages) {
    auto same = std::find_if(pools.begin(), pools.end(), [&](const std::vector<int>& p) {
      return memory_of(p.front()).pool() == memory_of(r).pool();
    });
    if (same == pools.end())
      pools.push_back({r});
    else
      same->push_back(r);
  }
  for (const std::vector<int>& in_pool : pools) {
    BackendMemory& memory = memory_of(in_pool.front());
    // a stage off the host keeps no bf16 copies of its weights (its backend rounds each
    // product's operands) and no bf16 stash (refused there)
    std::vector<int> host, off;
    for (int r : in_pool) (memory_of(r).host_memory() ? host : off).push_back(r);
    const uint64_t need = least_stage_bytes(model, partition, mode, optimizer_kind, host, B, T,
                                            precision, bf16_stash) +
                          least_stage_bytes(model, partition, mode, optimizer_kind, off, B, T);
    const bool on_host = memory.pool() == "host";
    if (Status ok =
            fits(model, partition, optimizer_kind, in_pool, B, T, need, memory.available_bytes(),
                 precision == Precision::bf16 && !host.empty(), on_host ? "" : memory.name());
        !ok)
      return ok;
  }
  return {};
}

}  // namespace actorpipe
