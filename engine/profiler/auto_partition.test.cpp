// Tests of pipeline.partition = "auto": the plan comes from a cached profile when one of the
// same key is there (else a measured one, then cached), resolve_partition puts its counts in the
// config, and a memory limit that only recompute (or nothing) fits is an error naming why.
#include "engine/profiler/auto_partition.hpp"

#include <doctest/doctest.h>

#include <string>

#include "engine/config/config.hpp"
#include "engine/profiler/profile_cache.hpp"
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

TEST_CASE("auto partition: a limit only recompute fits is an error naming the layers") {
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
                 "to fit pipeline.memory_limit_mb = 30 MiB per stage, which the engine does not "
                 "support yet (there is no pipeline.recompute)"));
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

TEST_CASE("auto partition: measures once, then reads the cache; re-profiles when asked") {
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
