// Memory check: the least bytes of a run's stages against MemAvailable.
#include "engine/execution/memory_check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>

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

std::optional<uint64_t> available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream in(line.substr(13));
    uint64_t kib = 0;
    if (in >> kib) return kib * 1024;
  }
  return std::nullopt;
}

Status check_memory_fits(const Model& model, const Partition& partition, Mode mode,
                         const std::string& optimizer_kind, std::span<const int> stages, int B,
                         int T, std::optional<uint64_t> available, Precision precision,
                         bool bf16_stash) {
  if (!available) return {};
  const uint64_t need = least_stage_bytes(model, partition, mode, optimizer_kind, stages, B, T,
                                          precision, bf16_stash);
  if (need <= *available) return {};
  const uint64_t floats = param_floats(model, partition, stages);
  const ModelOptions& o = model.options();
  return make_error(
      "model.width = {}, model.depth = {}, model.vocab_size = {}, model.context = {}, "
      "pipeline.microbatch_size = {}, sequence length {}: the stages here need at least {} "
      "(weights, gradients, {} state and weight versions{} of {:.3g} parameter floats, and one "
      "microbatch's activations), {} of memory is available",
      o.width, o.depth, o.vocab_size, o.context, B, T, bytes_text(static_cast<double>(need)),
      optimizer_kind, precision == Precision::bf16 ? " with their bf16 copies" : "",
      static_cast<double>(floats), bytes_text(static_cast<double>(*available)));
}

}  // namespace actorpipe
