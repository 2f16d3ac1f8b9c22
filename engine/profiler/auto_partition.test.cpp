// Tests of pipeline.partition = "auto": the plan comes from a cached profile when one of the
// same key is there (else a measured one, then cached), resolve_partition puts its counts in the
// config, and a memory limit that only recompute (or nothing) fits is an error naming why;
// pipeline.recompute = "auto" takes the planner's layers (for the partition given, if one is),
// a configured recompute is planned as such, and "auto" trains the bits of no recompute.
#include "engine/profiler/auto_partition.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "engine/config/config.hpp"
#include "engine/execution/serial_executor.hpp"
#include "engine/model/partition.hpp"
#include "engine/profiler/profile_cache.hpp"
#include "tests/support/bits.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The default GPT (V256 C128 L4: 6 layers), B 8, T 128, in `mode` over 2 stages.
Config default_gpt(const std::string& mode, int microbatches) {
  Config c;
  c.pipeline.mode = mode;
  c.pipeline.stages = 2;
  c.pipeline.microbatches = microbatches;
  c.pipeline.partition.automatic = true;
  return c;
}

// Writes a profile for `c` into `dir` with F, B per layer in ms: the embedding and the blocks
// 1 and 2, the head 3 and 6; so over 2 stages [4, 2] balances (12 ms and 12 ms per microbatch).
void cache_fake_profile(const std::string& dir, const Config& c) {
  const ProfileKey key = profile_key(c);
  LayerProfile p;
  p.threads = key.threads;
  p.B = key.B;
  p.T = key.T;
  p.reps = 1;
  p.tied = c.model.tied;
  const int n = c.model.depth + 2;
  for (int i = 0; i < n; ++i) {
    LayerTiming t;
    t.name = "layer " + std::to_string(i);
    t.forward = i == n - 1 ? 3e-3 : 1e-3;
    t.backward = 2 * t.forward;
    t.backward_weight = t.forward / 2;
    p.layers.push_back(t);
  }
  REQUIRE(write_cached_profile(dir, key, p).ok());
}

}  // namespace

TEST_CASE("auto partition: the planner's plan for the mode from a cached profile") {
  testing::TempDir dir;
  AutoPartitionOptions o;
  o.cache_dir = dir.path.string();
  for (const char* mode : {"gpipe", "1f1b", "2bw", "pipedream", "xpipe"}) {
    CAPTURE(mode);
    const Config c = default_gpt(mode, 4);
    cache_fake_profile(o.cache_dir, c);
    auto a = plan_auto_partition(c, o);
    REQUIRE_MESSAGE(a.ok(), (a.ok() ? "" : a.error().message));
    CHECK(a->from_cache);
    CHECK(a->cache_note.empty());
    CHECK(a->result.plan.layers_per_stage == std::vector<int>{4, 2});
    CHECK(a->result.plan.recomputed_layers == 0);
    CHECK(a->planner.stages == 2);
    CHECK(a->planner.microbatches == 4);
    CHECK(a->planner.memory_limit_bytes == 0);
    REQUIRE(a->costs.size() == 6);
    CHECK(a->costs[5].forward == 3e-3);
    CHECK(a->costs[1].activation_bytes > a->costs[1].recompute_activation_bytes);
    // resolve_partition writes those counts in place of "auto"
    auto r = resolve_partition(c, o);
    REQUIRE(r.ok());
    CHECK_FALSE(r->pipeline.partition.automatic);
    CHECK(r->pipeline.partition.counts == std::vector<int>{4, 2});
    CHECK(validate(*r).ok());
  }
  // any other partition comes back as it is, measuring nothing
  Config even = default_gpt("1f1b", 4);
  even.pipeline.partition.automatic = false;
  auto same = resolve_partition(even, o);
  REQUIRE(same.ok());
  CHECK(same->pipeline.partition.even());
}

TEST_CASE("auto partition in bf16 counts a bf16 copy of every stored weight version") {
  testing::TempDir dir;
  AutoPartitionOptions o;
  o.cache_dir = dir.path.string();
  Config fp32 = default_gpt("2bw", 4);
  Config bf16 = fp32;
  bf16.pipeline.precision = "bf16";
  cache_fake_profile(o.cache_dir, fp32);  // the same times under each precision's key
  cache_fake_profile(o.cache_dir, bf16);
  auto a = plan_auto_partition(fp32, o);
  auto b = plan_auto_partition(bf16, o);
  REQUIRE(a.ok());
  REQUIRE_MESSAGE(b.ok(), (b.ok() ? "" : b.error().message));
  CHECK(b->from_cache);
  REQUIRE(a->costs.size() == b->costs.size());
  for (size_t i = 0; i < a->costs.size(); ++i) {
    CHECK(a->costs[i].weight_copy_bytes == 0);
    CHECK(b->costs[i].weight_copy_bytes == a->costs[i].parameter_bytes / 2);
  }
  CHECK(b->result.plan.layers_per_stage == a->result.plan.layers_per_stage);
  const auto& sa = a->result.plan.stages;
  const auto& sb = b->result.plan.stages;
  REQUIRE(sa.size() == 2);
  REQUIRE(sb.size() == 2);
  for (size_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    // 2bw stores two versions per stage: a copy of each, half their bytes; the blocks stash
    // their products' inputs in bf16
    CHECK(sa[r].bytes.weight_copies == 0);
    CHECK(sb[r].bytes.weight_copies == sb[r].bytes.parameters);
    CHECK(sb[r].bytes.activations < sa[r].bytes.activations);
    CHECK(sb[r].bytes.total() == sa[r].bytes.total() + sb[r].bytes.parameters -
                                     (sa[r].bytes.activations - sb[r].bytes.activations));
  }
}

TEST_CASE("auto partition: a limit only recompute fits is an error naming the layers (none)") {
  testing::TempDir dir;
  AutoPartitionOptions o;
  o.cache_dir = dir.path.string();
  Config c = default_gpt("gpipe", 4);
  cache_fake_profile(o.cache_dir, c);
  // a block stashes about 10.5 MB per microbatch, 42 MB for gpipe's 4: no stage fits 30 MiB
  // unless blocks keep only their input
  c.pipeline.memory_limit_mb = 30;
  auto a = plan_auto_partition(c, o);
  REQUIRE_FALSE(a.ok());
  CHECK_MESSAGE(contains(a.error().message, "needs recompute of layers {"), a.error().message);
  CHECK(contains(a.error().message,
                 "to fit pipeline.memory_limit_mb = 30 MiB per stage, but pipeline.recompute = "
                 "\"none\": set pipeline.recompute = \"auto\" (or those layers)"));
  auto r = resolve_partition(c, o);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.rfind("pipeline.partition = \"auto\": the plan [", 0) == 0);
  // 1 MiB: a block's parameters alone are more; the planner's error names the stage
  c.pipeline.memory_limit_mb = 1;
  a = plan_auto_partition(c, o);
  REQUIRE_FALSE(a.ok());
  CHECK_MESSAGE(contains(a.error().message,
                         "no plan of 6 layers in 2 stages fits the memory limit of 1048576 bytes "
                         "per stage"),
                a.error().message);
  CHECK(contains(a.error().message, "> 1048576"));
  // a generous limit plans as without one
  c.pipeline.memory_limit_mb = 4096;
  a = plan_auto_partition(c, o);
  REQUIRE(a.ok());
  CHECK(a->result.plan.layers_per_stage == std::vector<int>{4, 2});
  CHECK(a->planner.memory_limit_bytes == 4096LL << 20);
}

TEST_CASE("auto partition: measures once, then reads the cache, re-profiles when asked") {
  testing::TempDir dir;
  AutoPartitionOptions o;
  o.cache_dir = (dir.path / "cache").string();
  o.reps = 1;
  Config c = testing::tiny_config("1f1b", 2, 2, testing::tiny_model(Arch::gpt, true, 1));
  c.pipeline.partition.automatic = true;
  auto first = plan_auto_partition(c, o);
  REQUIRE_MESSAGE(first.ok(), (first.ok() ? "" : first.error().message));
  CHECK_FALSE(first->from_cache);
  CHECK(first->cache_note == "no cached profile");
  CHECK(first->cache_path == o.cache_dir + "/" + profile_key(c).file_name());
  CHECK(first->profile.layers.size() == 4);
  auto second = plan_auto_partition(c, o);
  REQUIRE(second.ok());
  CHECK(second->from_cache);
  CHECK(second->result.plan.layers_per_stage == first->result.plan.layers_per_stage);
  CHECK(second->profile.layers[2].forward == first->profile.layers[2].forward);
  // another seed is the same key: the cache serves it
  c.model.init_seed = 7;
  CHECK(plan_auto_partition(c, o)->from_cache);
  o.read_cache = false;
  auto again = plan_auto_partition(c, o);
  REQUIRE(again.ok());
  CHECK_FALSE(again->from_cache);
  CHECK(again->cache_note == "re-profiling as asked");
  int sum = 0;
  for (int n : again->result.plan.layers_per_stage) sum += n;
  CHECK(sum == 4);
  o.reps = 0;
  auto bad = plan_auto_partition(c, o);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message == "auto partition: reps = 0, expected >= 1");
}

TEST_CASE("recompute = auto: the planner's layers under the limit, for the partition in use") {
  testing::TempDir dir;
  AutoPartitionOptions o;
  o.cache_dir = dir.path.string();
  Config c = default_gpt("gpipe", 4);
  cache_fake_profile(o.cache_dir, c);
  c.pipeline.recompute.kind = RecomputeSpec::Kind::automatic;
  // no limit: recompute only costs time, nothing is recomputed
  auto a = plan_auto_partition(c, o);
  REQUIRE_MESSAGE(a.ok(), (a.ok() ? "" : a.error().message));
  CHECK(recomputed_layers(a->recompute).empty());
  auto r = resolve_partition(c, o);
  REQUIRE(r.ok());
  CHECK(r->pipeline.recompute.kind == RecomputeSpec::Kind::none);
  // 30 MiB binds: the planner recomputes blocks; the flags reach the config as a list
  c.pipeline.memory_limit_mb = 30;
  a = plan_auto_partition(c, o);
  REQUIRE_MESSAGE(a.ok(), (a.ok() ? "" : a.error().message));
  const std::vector<int> layers = recomputed_layers(a->recompute);
  CHECK_FALSE(layers.empty());
  CHECK(a->recompute == a->result.plan.recompute);
  CHECK(a->result.plan.recomputed_layers == static_cast<int>(layers.size()));
  for (const StagePlan& st : a->result.plan.stages) CHECK(st.bytes.total() <= 30LL << 20);
  r = resolve_partition(c, o);
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
  CHECK_FALSE(r->pipeline.partition.automatic);
  CHECK(r->pipeline.partition.counts == a->result.plan.layers_per_stage);
  CHECK(r->pipeline.recompute.kind == RecomputeSpec::Kind::layers);
  CHECK(r->pipeline.recompute.layers == layers);
  CHECK(validate(*r).ok());
  // a partition given: only its recompute flags are planned, the partition stays
  c.pipeline.partition = PartitionSpec{false, {5, 1}};
  a = plan_auto_partition(c, o);
  REQUIRE_MESSAGE(a.ok(), (a.ok() ? "" : a.error().message));
  CHECK(a->planner.layers_per_stage == std::vector<int>{5, 1});
  CHECK(a->result.plan.layers_per_stage == std::vector<int>{5, 1});
  CHECK_FALSE(a->result.runner_up.has_value());
  CHECK_FALSE(recomputed_layers(a->recompute).empty());
  r = resolve_partition(c, o);
  REQUIRE(r.ok());
  CHECK(r->pipeline.partition.counts == std::vector<int>{5, 1});
  CHECK(r->pipeline.recompute.layers == recomputed_layers(a->recompute));
  // "even" is a partition given too
  c.pipeline.partition = PartitionSpec{};
  a = plan_auto_partition(c, o);
  REQUIRE(a.ok());
  CHECK(a->result.plan.layers_per_stage == std::vector<int>{3, 3});
  // a limit that partition cannot fit even recomputing: the stage, its bytes and the limit
  c.pipeline.memory_limit_mb = 1;
  a = plan_auto_partition(c, o);
  REQUIRE_FALSE(a.ok());
  CHECK_MESSAGE(contains(a.error().message,
                         "planner: the partition [3, 3] does not fit the memory limit of 1048576 "
                         "bytes per stage, even recomputing every layer that saves memory: stage "),
                a.error().message);
  r = resolve_partition(c, o);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.rfind("pipeline.recompute = \"auto\": planner: the partition", 0) == 0);
}

TEST_CASE("auto partition with a configured recompute plans those layers as recomputed") {
  testing::TempDir dir;
  AutoPartitionOptions o;
  o.cache_dir = dir.path.string();
  Config c = default_gpt("gpipe", 4);
  cache_fake_profile(o.cache_dir, c);
  auto none = plan_auto_partition(c, o);
  REQUIRE(none.ok());
  c.pipeline.recompute = {RecomputeSpec::Kind::all, {}};
  auto all = plan_auto_partition(c, o);
  REQUIRE_MESSAGE(all.ok(), (all.ok() ? "" : all.error().message));
  CHECK(all->recompute == std::vector<bool>(6, true));
  CHECK(all->result.plan.recomputed_layers == 6);
  // the stages stash less and compute a forward more
  std::int64_t none_act = 0, all_act = 0;
  double none_time = 0, all_time = 0, recompute_time = 0;
  for (const StagePlan& st : none->result.plan.stages) {
    none_act += st.bytes.activations;
    none_time += st.compute_seconds;
  }
  for (const StagePlan& st : all->result.plan.stages) {
    all_act += st.bytes.activations;
    all_time += st.compute_seconds;
    recompute_time += st.recompute_seconds;
  }
  CHECK(all_act < none_act);
  CHECK(all_time > none_time);
  CHECK(recompute_time > 0);
  // 30 MiB: without recompute an error, with the blocks recomputed a plan
  c.pipeline.memory_limit_mb = 30;
  c.pipeline.recompute = {RecomputeSpec::Kind::layers, {1, 2, 3, 4}};
  auto listed = plan_auto_partition(c, o);
  REQUIRE_MESSAGE(listed.ok(), (listed.ok() ? "" : listed.error().message));
  CHECK(recomputed_layers(listed->recompute) == std::vector<int>{1, 2, 3, 4});
  auto r = resolve_partition(c, o);
  REQUIRE(r.ok());
  CHECK(r->pipeline.recompute.layers == std::vector<int>{1, 2, 3, 4});  // unchanged
}

TEST_CASE("recompute = auto trains the bits of no recompute (measured profile, every mode)") {
  testing::TempDir dir;
  AutoPartitionOptions o;
  o.cache_dir = dir.path.string();
  o.reps = 1;
  for (const char* mode : {"gpipe", "1f1b", "2bw", "pipedream", "xpipe"}) {
    CAPTURE(mode);
    // GPT V64 C64 L2, B 4 T 64: a block stashes about 1.3 MB per microbatch
    Config c;
    c.model.vocab_size = 64;
    c.model.context = 64;
    c.model.width = 64;
    c.model.heads = 2;
    c.model.depth = 2;
    c.pipeline.mode = mode;
    c.pipeline.stages = 2;
    c.pipeline.microbatches = 4;
    c.pipeline.microbatch_size = 4;
    c.pipeline.seq_len = 64;
    c.optimizer = testing::clipped_adamw();
    c.pipeline.recompute.kind = RecomputeSpec::Kind::automatic;
    // the largest stage without recompute, in whole MiB below it: a limit that binds
    auto free = plan_auto_partition(c, o);
    REQUIRE_MESSAGE(free.ok(), (free.ok() ? "" : free.error().message));
    std::int64_t most = 0;
    for (const StagePlan& st : free->result.plan.stages) most = std::max(most, st.bytes.total());
    c.pipeline.memory_limit_mb = static_cast<int>(most >> 20);
    REQUIRE(c.pipeline.memory_limit_mb >= 1);
    auto resolved = resolve_partition(c, o);
    REQUIRE_MESSAGE(resolved.ok(), (resolved.ok() ? "" : resolved.error().message));
    REQUIRE(resolved->pipeline.recompute.kind == RecomputeSpec::Kind::layers);
    CHECK_FALSE(resolved->pipeline.recompute.layers.empty());
    Config plain = *resolved;
    plain.pipeline.recompute = {};
    auto run = [&](const Config& cfg, std::vector<std::vector<float>>& params, size_t& stash) {
      auto e = SerialExecutor::create(cfg);
      REQUIRE_MESSAGE(e.ok(), (e.ok() ? "" : e.error().message));
      auto data = testing::config_loader(cfg);
      auto losses = (*e)->run(3, *data);
      REQUIRE_MESSAGE(losses.ok(), (losses.ok() ? "" : losses.error().message));
      for (int i = 0; i < (*e)->model().num_layers(); ++i)
        params.emplace_back((*e)->params(i).begin(), (*e)->params(i).end());
      stash = 0;
      for (int r = 0; r < (*e)->stages(); ++r) stash += (*e)->worker(r).stash_bytes();
      return *losses;
    };
    std::vector<std::vector<float>> p_auto, p_plain;
    size_t s_auto = 0, s_plain = 0;
    const auto l_auto = run(*resolved, p_auto, s_auto);
    const auto l_plain = run(plain, p_plain, s_plain);
    CHECK(testing::same_bits(l_auto, l_plain));
    REQUIRE(p_auto.size() == p_plain.size());
    for (size_t i = 0; i < p_auto.size(); ++i) CHECK(testing::same_bits(p_auto[i], p_plain[i]));
    if (std::string(mode) != "xpipe") CHECK(s_auto < s_plain);
  }
}
