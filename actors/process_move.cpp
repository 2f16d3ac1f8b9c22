// Layer move across processes: export (rebuilt_state), route by the layer's new stage's rank,
// one ucx_exchange round of safetensors bytes, build (build_rebuilt_stages), agree (all_gather
// of every process's outcome), install. A process that fails before the agreement still takes
// part in the exchange and the agreement, so no other process waits for it.
#include "actors/process_move.hpp"

#include <fmt/format.h>

#include <charconv>
#include <chrono>
#include <map>
#include <string>

#include "actors/process_group.hpp"
#include "engine/checkpoint/safetensors.hpp"
#include "engine/execution/optimizer_shard.hpp"
#include "engine/execution/stage_worker.hpp"
#include "transport/ucx_exchange.hpp"

namespace actorpipe {
namespace {

// The three groups of a state, in their order in a message.
constexpr const char* kGroups[] = {"model", "optimizer", "versions"};

std::vector<NamedTensor>& group_of(CheckpointContents& c, int g) {
  return g == 0 ? c.model : g == 1 ? c.optimizer : c.versions;
}

// One process's outcome in the agreement: "ok <layers> <moved> <copied> <sent>" or the error.
struct Outcome {
  bool ok = false;
  int64_t bytes_moved = 0, bytes_copied = 0, bytes_sent = 0;
  std::string error;
};

std::string encode(const Outcome& o) {
  if (!o.ok) return "error " + o.error;
  return fmt::format("ok {} {} {}", o.bytes_moved, o.bytes_copied, o.bytes_sent);
}

Outcome decode(const std::string& text) {
  Outcome o;
  if (text.rfind("ok ", 0) != 0) {
    o.error = text.rfind("error ", 0) == 0 ? text.substr(6) : "unreadable outcome: " + text;
    return o;
  }
  const char* p = text.data() + 3;
  const char* end = text.data() + text.size();
  for (int64_t* v : {&o.bytes_moved, &o.bytes_copied, &o.bytes_sent}) {
    while (p < end && *p == ' ') ++p;
    auto [next, ec] = std::from_chars(p, end, *v);
    if (ec != std::errc()) {
      o.error = "unreadable outcome: " + text;
      return o;
    }
    p = next;
  }
  o.ok = true;
  return o;
}

// The bound on what a peer may send: every layer's parameters, optimizer state and up to
// `stages` older versions, plus the headers.
uint64_t max_state_bytes(const Model& model, int stages) {
  uint64_t floats = 0;
  for (int l = 0; l < model.num_layers(); ++l) floats += model.layer(l).param_floats();
  return floats * sizeof(float) * static_cast<uint64_t>(3 + stages) + (uint64_t{1} << 24);
}

}  // namespace

Expected<MoveReport> move_layers_across(ProcessGroup& group, const Placement& placement,
                                        const Partition& from, const Partition& to,
                                        std::vector<std::unique_ptr<StageWorker>>& workers,
                                        std::vector<std::unique_ptr<OptimizerShard>>& shards,
                                        uint32_t round, std::chrono::milliseconds timeout) {
  const auto started = std::chrono::steady_clock::now();
  const int rank = group.rank();
  auto rebuilt = rebuilt_stages(from, to);
  if (!rebuilt) return rebuilt.error();  // the same on every process: nobody waits
  if (placement.stages() != from.stages())
    return make_error("migration: a placement of {} stages for {} stages", placement.stages(),
                      from.stages());
  const StageWorker* local = nullptr;
  for (const auto& w : workers)
    if (w) local = w.get();
  if (local == nullptr) return make_error("migration: rank {} holds no stage", rank);

  MoveReport report;
  report.from = from.counts();
  report.to = to.counts();
  for (int l = 0; l < from.num_layers(); ++l)
    report.layers_moved += from.stage_of(l) != to.stage_of(l) ? 1 : 0;
  report.stages_rebuilt = *rebuilt;

  Outcome mine;
  mine.ok = true;
  // 1. this process's rebuilt stages' state, routed by the rank of each layer's new stage
  CheckpointContents kept;  // what stays in this process
  kept.path = fmt::format("(rank {}'s stages)", rank);
  kept.info.model = local->model().options();
  kept.info.optimizer = local->optimizer_options();
  kept.info.extra["updates"] = std::to_string(local->updates());
  std::map<int, CheckpointContents> away;  // by rank
  std::map<int, std::vector<std::byte>> outgoing;
  auto state = rebuilt_state(from, to, workers, shards);
  if (!state) {
    mine = Outcome{false, 0, 0, 0, state.error().message};
  } else {
    for (int g = 0; g < 3; ++g) {
      for (NamedTensor& t : group_of(*state, g)) {
        const int layer = checkpoint_layer(t.name);
        if (layer < 0 || layer >= from.num_layers()) {
          mine =
              Outcome{false, 0, 0, 0, fmt::format("migration: tensor {} names no layer", t.name)};
          break;
        }
        const int64_t bytes = t.numel() * static_cast<int64_t>(sizeof(float));
        const int dst = placement.rank_of(to.stage_of(layer));
        mine.bytes_copied += bytes;
        if (from.stage_of(layer) != to.stage_of(layer)) mine.bytes_moved += bytes;
        if (dst == rank) {
          group_of(kept, g).push_back(std::move(t));
        } else {
          mine.bytes_sent += bytes;
          group_of(away[dst], g).push_back(std::move(t));
        }
      }
    }
    for (auto& [dst, contents] : away) {
      std::vector<TensorRef> refs;
      std::map<std::string, std::string> meta;
      for (int g = 0; g < 3; ++g) {
        for (const NamedTensor& t : group_of(contents, g))
          refs.push_back({t.name, t.shape, t.f32.data()});
        meta[kGroups[g]] = std::to_string(group_of(contents, g).size());
      }
      auto bytes =
          encode_safetensors(refs, meta, fmt::format("rank {}'s layers for rank {}", rank, dst));
      if (!bytes) {
        mine = Outcome{false, 0, 0, 0, bytes.error().message};
        break;
      }
      outgoing[dst] = std::move(*bytes);
    }
  }
  if (!mine.ok) outgoing.clear();

  // 2. one exchange round: every process sends to every other (empty where nothing moves)
  UcxExchangeOptions xo;
  xo.timeout = timeout;
  xo.max_bytes = max_state_bytes(local->model(), from.stages());
  auto incoming = ucx_exchange(*group.ucx(), rank, group.peers(), round, std::move(outgoing), xo);
  if (!incoming) {
    if (mine.ok) mine = Outcome{false, 0, 0, 0, incoming.error().message};
  } else if (mine.ok) {
    for (auto& [src, bytes] : *incoming) {
      if (bytes.empty()) continue;
      const std::string what = fmt::format("rank {}'s layers for rank {}", src, rank);
      auto decoded = decode_safetensors(bytes, what);
      if (!decoded) {
        mine = Outcome{false, 0, 0, 0, decoded.error().message};
        break;
      }
      // the tensors in their groups' order, as many of each as the metadata says
      size_t at = 0;
      for (int g = 0; g < 3 && mine.ok; ++g) {
        auto it = decoded->metadata.find(kGroups[g]);
        size_t n = 0;
        if (it == decoded->metadata.end() ||
            std::from_chars(it->second.data(), it->second.data() + it->second.size(), n).ec !=
                std::errc() ||
            n > decoded->tensors.size() - at) {
          mine = Outcome{false, 0, 0, 0,
                         fmt::format("{}: no valid count of {} tensors", what, kGroups[g])};
          break;
        }
        for (size_t k = 0; k < n; ++k)
          group_of(kept, g).push_back(std::move(decoded->tensors[at + k]));
        at += n;
      }
      if (mine.ok && at != decoded->tensors.size())
        mine = Outcome{
            false, 0, 0, 0,
            fmt::format("{}: {} tensors beyond the counts", what, decoded->tensors.size() - at)};
      if (!mine.ok) break;
    }
  }

  // 3. build and load this process's rebuilt stages
  Expected<RebuiltStages> built = make_error("not built");
  if (mine.ok) {
    built = build_rebuilt_stages(from, to, std::move(kept), workers, shards);
    if (!built) mine = Outcome{false, 0, 0, 0, built.error().message};
  }

  // 4. every process's outcome; all of them install, or none
  RankPart part;
  part.text = encode(mine);
  auto all = group.all_gather(std::move(part));
  if (!all) return make_error("migration (rank {}): {}", rank, all.error().message);
  for (const RankPart& p : *all) {
    const Outcome o = decode(p.text);
    if (!o.ok) return make_error("migration: rank {}: {}", p.rank, o.error);
    report.bytes_moved += o.bytes_moved;
    report.bytes_copied += o.bytes_copied;
    report.bytes_sent += o.bytes_sent;
  }
  report.bytes_reused = static_cast<int64_t>(built->scratch.bytes_reused());
  install_rebuilt_stages(std::move(*built), to, workers, shards);
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return report;
}

}  // namespace actorpipe
