// Tests of the planner: equal to brute force over every partition and every recompute choice
// (n <= 12 layers, d <= 4 stages, seeded random costs, memory limits that bind or cannot be met),
// hand-worked plans (recompute, transfers, the simulator's prediction) and the errors.
#include "engine/planner/planner.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/planner/balanced_partition.hpp"
#include "tests/support/tsan_skip.hpp"

using namespace actorpipe;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ---- brute force: every partition, every recompute mask, the plan order written out plainly

constexpr int kMaxStages = 4;

// Closed forms of what each mode's schedule keeps at stage r (docs/planner.md), written here
// independently of stage_factors: versions kept, peak stash, updates per step.
std::array<int, 3> hand_factors(Mode mode, int d, int m, int r) {
  switch (mode) {
    case Mode::gpipe:
      return {1, m, 1};
    case Mode::onef1b:
      return {1, std::min(d - r, m), 1};
    case Mode::twobw:
      return {2, d - r, 1};
    case Mode::pipedream:
      return {d - r, d - r, m};
    case Mode::xpipe:
      return {1, d - r, 1};
  }
  return {0, 0, 0};
}

struct BrutePlan {
  int d = 0;
  std::array<int, kMaxStages> counts{};
  std::uint32_t mask = 0;  // bit l: layer l recomputed
  std::array<double, kMaxStages> seconds{};
  std::array<std::int64_t, kMaxStages> bytes{};
  std::array<std::int64_t, kMaxStages> activations{};
  double bottleneck = 0.0;
  int recomputed = 0;
};

// Plan order: bottleneck, recomputed layers, shorter last stages, then per stage (first to
// last) time, activation bytes, and flags in layer order with "not recomputed" first.
bool brute_before(const BrutePlan& a, const BrutePlan& b) {
  if (a.bottleneck != b.bottleneck) return a.bottleneck < b.bottleneck;
  if (a.recomputed != b.recomputed) return a.recomputed < b.recomputed;
  for (int r = a.d - 1; r >= 0; --r) {
    if (a.counts[r] != b.counts[r]) return a.counts[r] < b.counts[r];
  }
  int first = 0;
  for (int r = 0; r < a.d; ++r) {
    if (a.seconds[r] != b.seconds[r]) return a.seconds[r] < b.seconds[r];
    if (a.activations[r] != b.activations[r]) return a.activations[r] < b.activations[r];
    for (int l = first; l < first + a.counts[r]; ++l) {
      const bool x = (a.mask >> l) & 1U, y = (b.mask >> l) & 1U;
      if (x != y) return !x;
    }
    first += a.counts[r];
  }
  return false;
}

BrutePlan evaluate(const std::vector<LayerCosts>& layers, const PlannerOptions& o,
                   const std::vector<int>& counts, std::uint32_t mask) {
  const int n = static_cast<int>(layers.size());
  BrutePlan p;
  p.d = static_cast<int>(counts.size());
  p.mask = mask;
  int a = 0;
  for (int r = 0; r < p.d; ++r) {
    const int b = a + counts[r];
    const auto [versions, stash, updates] = hand_factors(o.mode, p.d, o.microbatches, r);
    double compute = 0.0, update = 0.0, transfer = 0.0;
    std::int64_t fixed = 0, version = 0, copies = 0, act = 0;
    for (int l = a; l < b; ++l) {
      const LayerCosts& c = layers[l];
      const bool re = (mask >> l) & 1U;
      compute += c.forward + c.backward + (re ? c.forward : 0.0);
      update += c.update;
      fixed += c.parameter_bytes + c.gradient_bytes + c.optimizer_bytes;
      version += c.version_bytes;
      copies += c.weight_copy_bytes;
      act += re ? c.recompute_activation_bytes : c.activation_bytes;
      p.recomputed += re ? 1 : 0;
    }
    auto link = [&](int l) {
      return o.latency + (o.bandwidth > 0 ? layers[l].output_bytes / o.bandwidth : 0.0);
    };
    if (a > 0) transfer += link(a - 1);
    if (b < n) transfer += link(b - 1);
    p.counts[r] = counts[r];
    const double k = o.stage_speed.empty() ? 1.0 : o.stage_speed[r];
    p.seconds[r] = k * (o.microbatches * compute + updates * update) + o.microbatches * transfer;
    p.activations[r] = stash * act;
    p.bytes[r] = fixed + (versions - 1) * version + versions * copies + stash * act;
    p.bottleneck = std::max(p.bottleneck, p.seconds[r]);
    a = b;
  }
  return p;
}

void compositions(int n, int d, std::vector<int>& cur, std::vector<std::vector<int>>& out) {
  if (d == 1) {
    cur.push_back(n);
    out.push_back(cur);
    cur.pop_back();
    return;
  }
  for (int first = 1; first <= n - (d - 1); ++first) {
    cur.push_back(first);
    compositions(n - first, d - 1, cur, out);
    cur.pop_back();
  }
}

std::vector<std::vector<int>> all_partitions(int n, int d) {
  std::vector<std::vector<int>> out;
  std::vector<int> cur;
  compositions(n, d, cur, out);
  return out;
}

bool same_counts(const BrutePlan& a, const BrutePlan& b) {
  for (int r = 0; r < a.d; ++r) {
    if (a.counts[r] != b.counts[r]) return false;
  }
  return true;
}

// The best plan and the best with other counts under each limit (0: none).
struct BruteResult {
  std::optional<BrutePlan> best, runner_up;
  std::vector<std::optional<BrutePlan>> per_partition;  // all_partitions' order
};

std::vector<BruteResult> brute_force(const std::vector<LayerCosts>& layers, const PlannerOptions& o,
                                     const std::vector<std::int64_t>& limits) {
  const int n = static_cast<int>(layers.size());
  const auto partitions = all_partitions(n, o.stages);
  // per limit, per partition: its best plan
  std::vector<std::vector<std::optional<BrutePlan>>> best(
      limits.size(), std::vector<std::optional<BrutePlan>>(partitions.size()));
  for (size_t k = 0; k < partitions.size(); ++k) {
    for (std::uint32_t mask = 0; mask < (1U << n); ++mask) {
      const BrutePlan p = evaluate(layers, o, partitions[k], mask);
      for (size_t x = 0; x < limits.size(); ++x) {
        bool fits = true;
        for (int r = 0; r < p.d; ++r) fits = fits && (limits[x] == 0 || p.bytes[r] <= limits[x]);
        if (fits && (!best[x][k] || brute_before(p, *best[x][k]))) best[x][k] = p;
      }
    }
  }
  std::vector<BruteResult> out(limits.size());
  for (size_t x = 0; x < limits.size(); ++x) {
    out[x].per_partition = best[x];
    for (const auto& p : best[x]) {
      if (p && (!out[x].best || brute_before(*p, *out[x].best))) out[x].best = p;
    }
    for (const auto& p : best[x]) {
      if (!p || !out[x].best || same_counts(*p, *out[x].best)) continue;
      if (!out[x].runner_up || brute_before(*p, *out[x].runner_up)) out[x].runner_up = p;
    }
  }
  return out;
}

// The largest stage of a partition, every stage at its fewest bytes (each layer stashing the
// smaller of its two activation sizes); without recompute when `plain`.
std::int64_t largest_stage_bytes(const std::vector<LayerCosts>& layers, const PlannerOptions& o,
                                 const std::vector<int>& counts, bool plain, int* stage = nullptr,
                                 std::int64_t* bytes = nullptr) {
  const int d = static_cast<int>(counts.size());
  std::int64_t worst = -1;
  int a = 0;
  for (int r = 0; r < d; ++r) {
    const auto [versions, stash, updates] = hand_factors(o.mode, d, o.microbatches, r);
    std::int64_t b = 0;
    for (int l = a; l < a + counts[r]; ++l) {
      const LayerCosts& c = layers[l];
      const std::int64_t act =
          plain ? c.activation_bytes : std::min(c.activation_bytes, c.recompute_activation_bytes);
      b += c.parameter_bytes + c.gradient_bytes + c.optimizer_bytes +
           (versions - 1) * c.version_bytes + versions * c.weight_copy_bytes + stash * act;
    }
    if (b > worst) {
      worst = b;
      if (stage) *stage = r;
    }
    a += counts[r];
  }
  if (bytes) *bytes = worst;
  return worst;
}

std::vector<LayerCosts> random_layers(std::mt19937& rng, int n) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<LayerCosts> layers;
  for (int i = 0; i < n; ++i) {
    LayerCosts c;  // integer times: every sum is exact, so ties are ties
    c.forward = pick(0, 5);
    c.backward = pick(0, 8);
    c.backward_weight = pick(0, static_cast<int>(c.backward));
    c.update = pick(0, 3);
    c.parameter_bytes = pick(1, 20);
    c.gradient_bytes = c.parameter_bytes;
    c.optimizer_bytes = 2 * c.parameter_bytes;
    c.version_bytes = c.parameter_bytes;
    // every third layer as in bf16: a copy of each stored version (not drawn: the stream of
    // draws stays that of the cases before)
    c.weight_copy_bytes = i % 3 == 1 ? c.parameter_bytes / 2 : 0;
    c.activation_bytes = pick(0, 30);
    // now and then a layer whose recompute saves nothing or costs memory
    c.recompute_activation_bytes =
        pick(0, 4) == 0 ? c.activation_bytes + pick(0, 5) : pick(0, c.activation_bytes);
    c.output_bytes = pick(0, 16);
    layers.push_back(c);
  }
  return layers;
}

void check_same(const PartitionPlan& got, const BrutePlan& want, int n) {
  CHECK(got.layers_per_stage ==
        std::vector<int>(want.counts.begin(), want.counts.begin() + want.d));
  std::vector<bool> flags;
  for (int l = 0; l < n; ++l) flags.push_back((want.mask >> l) & 1U);
  CHECK(got.recompute == flags);
  CHECK(got.bottleneck_seconds == want.bottleneck);
  CHECK(got.recomputed_layers == want.recomputed);
  REQUIRE(static_cast<int>(got.stages.size()) == want.d);
  for (int r = 0; r < want.d; ++r) {
    CHECK(got.stages[r].step_seconds == want.seconds[r]);
    CHECK(got.stages[r].bytes.total() == want.bytes[r]);
    CHECK(got.stages[r].bytes.activations == want.activations[r]);
  }
}

// n layers of F = 1, B = 2 and nothing else.
std::vector<LayerCosts> uniform_layers(int n) {
  std::vector<LayerCosts> layers(static_cast<size_t>(n));
  for (LayerCosts& l : layers) {
    l.forward = 1;
    l.backward = 2;
  }
  return layers;
}

}  // namespace

TEST_CASE("planner equals brute force over every partition and recompute choice, n <= 12, d <= 4") {
  if (testing::skip_single_threaded_under_tsan("the planner and the brute force")) return;
  std::mt19937 rng(2024);
  int planned = 0, recomputing = 0, unfit = 0, with_runner_up = 0;
  for (int n = 1; n <= 12; ++n) {
    for (int d = 1; d <= std::min(n, kMaxStages); ++d) {
      for (int set = 0; set < 5; ++set) {  // every mode at every (n, d)
        const std::vector<LayerCosts> layers = random_layers(rng, n);
        PlannerOptions o;
        o.mode = all_modes[(n + d + set) % all_modes.size()];
        o.stages = d;
        o.microbatches = o.mode == Mode::twobw ? d + set % 2 : 1 + set;
        o.bandwidth = set == 1 ? 0.0 : 4.0;  // exact quarters
        o.latency = set == 2 ? 0.5 : 0.0;
        // stages slower or faster than their layers' costs (powers of two: exact)
        if (set == 3) o.stage_speed = {1.0, 2.0, 1.0, 2.0};
        if (set == 4) o.stage_speed = {0.5, 1.0, 4.0, 1.0};
        if (!o.stage_speed.empty()) o.stage_speed.resize(static_cast<size_t>(d));
        // limits: none, the least any plan needs without recompute (and one byte less), the
        // least with every saving recompute (and one byte less: nothing fits), one between
        std::int64_t plain = std::numeric_limits<std::int64_t>::max();
        std::int64_t least = plain;
        for (const auto& counts : all_partitions(n, d)) {
          plain = std::min(plain, largest_stage_bytes(layers, o, counts, true));
          least = std::min(least, largest_stage_bytes(layers, o, counts, false));
        }
        const std::vector<std::int64_t> limits = {0,     plain,    plain - 1, (plain + least) / 2,
                                                  least, least - 1};
        const std::vector<BruteResult> want = brute_force(layers, o, limits);
        for (size_t x = 0; x < limits.size(); ++x) {
          o.memory_limit_bytes = limits[x];
          CAPTURE(n);
          CAPTURE(d);
          CAPTURE(set);
          CAPTURE(to_string(o.mode));
          CAPTURE(o.microbatches);
          CAPTURE(limits[x]);
          auto got = plan_partition(layers, o);
          if (!want[x].best) {
            REQUIRE_FALSE(got.ok());
            ++unfit;
            // the best attempt: the partition whose largest fewest-bytes stage is smallest
            // (ties: shorter last stages), its first largest stage
            std::vector<int> attempt;
            std::int64_t attempt_bytes = 0;
            for (const auto& counts : all_partitions(n, d)) {
              const std::int64_t b = largest_stage_bytes(layers, o, counts, false);
              if (attempt.empty() || b < attempt_bytes ||
                  (b == attempt_bytes &&
                   std::lexicographical_compare(counts.rbegin(), counts.rend(), attempt.rbegin(),
                                                attempt.rend()))) {
                attempt = counts;
                attempt_bytes = b;
              }
            }
            int stage = 0;
            largest_stage_bytes(layers, o, attempt, false, &stage);
            int first = 0;
            for (int r = 0; r < stage; ++r) first += attempt[r];
            CHECK_MESSAGE(contains(got.error().message,
                                   fmt::format("layers per stage [{}], has stage {} (layers {} .. "
                                               "{}) at {} bytes",
                                               fmt::join(attempt, ", "), stage, first,
                                               first + attempt[stage] - 1, attempt_bytes)),
                          got.error().message);
            CHECK(contains(got.error().message, fmt::format("> {}", limits[x])));
            continue;
          }
          // every fixed partition: its best recompute choice, or no fit
          const auto partitions = all_partitions(n, d);
          for (size_t k = 0; k < partitions.size(); ++k) {
            auto fixed = plan_fixed_partition(layers, o, partitions[k]);
            REQUIRE(fixed.ok() == want[x].per_partition[k].has_value());
            if (fixed.ok()) {
              check_same(*fixed, *want[x].per_partition[k], n);
            } else {
              CHECK(contains(fixed.error().message, "does not fit the memory limit"));
            }
          }
          REQUIRE_MESSAGE(got.ok(), got.error().message);
          ++planned;
          if (want[x].best->recomputed > 0) ++recomputing;
          check_same(got->plan, *want[x].best, n);
          REQUIRE(got->runner_up.has_value() == want[x].runner_up.has_value());
          if (want[x].runner_up) {
            ++with_runner_up;
            check_same(*got->runner_up, *want[x].runner_up, n);
          }
        }
      }
    }
  }
  // the limits did bind: plans with recompute and limits nothing fits were both checked
  MESSAGE("plans ", planned, ", with recompute ", recomputing, ", with a runner-up ",
          with_runner_up, ", unfit ", unfit);
  CHECK(recomputing > 50);
  CHECK(unfit > 50);
  CHECK(with_runner_up > 100);
}

TEST_CASE("planner without limits, transfers or updates is the balanced partition of F + B") {
  std::mt19937 rng(7);
  for (int n = 1; n <= 10; ++n) {
    for (int d = 1; d <= std::min(n, 5); ++d) {
      std::vector<LayerCosts> layers = random_layers(rng, n);
      std::vector<double> fb;
      for (LayerCosts& l : layers) {
        l.update = 0;
        fb.push_back(l.forward + l.backward);
      }
      PlannerOptions o;
      o.stages = d;
      auto got = plan_partition(layers, o);
      REQUIRE(got.ok());
      CHECK(got->plan.layers_per_stage == balanced_partition(fb, d).value());
      CHECK(got->plan.recomputed_layers == 0);
    }
  }
}

TEST_CASE("planner recomputes the layers with the cheapest forwards, the later ones on a tie") {
  std::vector<LayerCosts> layers(3);
  for (LayerCosts& l : layers) {
    l.backward = 2;
    l.activation_bytes = 10;
  }
  layers[0].forward = 1;
  layers[1].forward = 3;
  layers[2].forward = 1;
  PlannerOptions o;  // 1f1b, one stage, one microbatch: one stash
  o.memory_limit_bytes = 20;
  auto one = plan_partition(layers, o);
  REQUIRE(one.ok());
  // one of layers 0 and 2 (forward 1) must go; on the tie the later one
  CHECK(one->plan.recompute == std::vector<bool>{false, false, true});
  CHECK(one->plan.bottleneck_seconds == 5 + 6 + 1);
  CHECK(one->plan.stages[0].recompute_seconds == 1);
  CHECK(one->plan.stages[0].bytes.activations == 20);
  o.memory_limit_bytes = 10;  // two must go: 0 and 2 (1 + 1) rather than 1 (3)
  auto two = plan_partition(layers, o);
  REQUIRE(two.ok());
  CHECK(two->plan.recompute == std::vector<bool>{true, false, true});
  CHECK(two->plan.recomputed_layers == 2);
  // a slower recompute of one layer loses to a faster one of two
  layers[1].activation_bytes = 20;  // 40 in all; limit 20: layer 1 alone (3) or 0 and 2 (2)
  o.memory_limit_bytes = 20;
  auto fewer = plan_partition(layers, o);
  REQUIRE(fewer.ok());
  CHECK(fewer->plan.recompute == std::vector<bool>{true, false, true});
  CHECK(fewer->plan.bottleneck_seconds == 5 + 6 + 2);
}

TEST_CASE("planner prefers a partition to recompute when both are as fast") {
  // two layers of F 1, B 2; d = 2 needs no recompute, so is the plan; d = 1 with a limit does
  std::vector<LayerCosts> layers(2);
  for (LayerCosts& l : layers) {
    l.forward = 1;
    l.backward = 2;
    l.activation_bytes = 8;
    l.recompute_activation_bytes = 2;
  }
  PlannerOptions o;
  o.mode = Mode::gpipe;
  o.microbatches = 2;  // gpipe stashes both: 32 bytes on one stage
  o.memory_limit_bytes = 20;
  auto one = plan_partition(layers, o);
  REQUIRE(one.ok());
  CHECK(one->plan.recompute == std::vector<bool>{false, true});  // 16 + 4 = 20 bytes
  CHECK(one->plan.stages[0].bytes.total() == 20);
  CHECK(one->plan.bottleneck_seconds == 2 * (3 + 3 + 1));
  o.stages = 2;
  auto two = plan_partition(layers, o);
  REQUIRE(two.ok());
  CHECK(two->plan.layers_per_stage == std::vector<int>{1, 1});
  CHECK(two->plan.recomputed_layers == 0);
  CHECK_FALSE(two->runner_up.has_value());  // d = n: no other partition
}

TEST_CASE("planner counts transfers: a cut after a large output costs both stages") {
  std::vector<LayerCosts> layers(3);
  for (LayerCosts& l : layers) {
    l.forward = 0.5;
    l.backward = 0.5;
  }
  layers[0].output_bytes = 100;  // 1 s at 100 B/s
  PlannerOptions o;
  o.stages = 2;
  o.bandwidth = 100;
  o.latency = 0.25;
  auto got = plan_partition(layers, o);
  REQUIRE(got.ok());
  // [1, 2]: 1 + 1.25 | 2 + 1.25; [2, 1]: 2 + 0.25 | 1 + 0.25
  CHECK(got->plan.layers_per_stage == std::vector<int>{2, 1});
  CHECK(got->plan.bottleneck_seconds == 2.25);
  CHECK(got->plan.stages[0].transfer_seconds == 0.25);
  CHECK(got->plan.stages[1].transfer_seconds == 0.25);
  REQUIRE(got->runner_up.has_value());
  CHECK(got->runner_up->layers_per_stage == std::vector<int>{1, 2});
  CHECK(got->runner_up->bottleneck_seconds == 3.25);
}

TEST_CASE("planner predicts the step with the simulator: gpipe's closed form, and ranks") {
  const std::vector<LayerCosts> layers = uniform_layers(4);
  PlannerOptions o;
  o.mode = Mode::gpipe;
  o.stages = 2;
  o.microbatches = 4;
  auto got = plan_partition(layers, o);
  REQUIRE(got.ok());
  CHECK(got->plan.layers_per_stage == std::vector<int>{2, 2});
  CHECK(got->plan.bottleneck_seconds == 4 * 6);
  // (m + d - 1)(F + B) and bubble (d - 1) / (m + d - 1)
  CHECK(got->plan.predicted_step_seconds == doctest::Approx(5 * 6.0));
  CHECK(got->plan.predicted_bubble == doctest::Approx(1.0 / 5));
  REQUIRE(got->runner_up.has_value());
  CHECK(got->runner_up->layers_per_stage == std::vector<int>{3, 1});
  // the simulator's ranking puts the balanced plan first
  REQUIRE(got->ranked.size() == 2);
  CHECK(got->ranked[0].layers_per_stage == std::vector<int>{2, 2});
  CHECK(got->ranked[0].predicted_step_seconds <= got->ranked[1].predicted_step_seconds);
  CHECK(got->plan.to_string() ==
        "[2, 2] recompute {}: bottleneck 24 s, predicted step 30 s, bubble 0.200");

  // asynchronous: steps steps of m microbatches, amortised
  o.mode = Mode::twobw;
  o.steps = 3;
  auto async = plan_partition(layers, o);
  REQUIRE(async.ok());
  // 2bw keeps uniform stages busy after the warm-up: (steps·m + d - 1)(F + B) / steps
  CHECK(async->plan.predicted_step_seconds == doctest::Approx((3 * 4 + 1) * 6.0 / 3));
}

TEST_CASE("planner gives a slower stage fewer layers, and predicts with its speed") {
  const std::vector<LayerCosts> layers = uniform_layers(8);
  PlannerOptions o;
  o.mode = Mode::gpipe;
  o.stages = 2;
  o.microbatches = 4;
  auto even = plan_partition(layers, o);
  REQUIRE(even.ok());
  CHECK(even->plan.layers_per_stage == std::vector<int>{4, 4});
  o.stage_speed = {1.0, 3.0};  // stage 1 three times slower: 6 and 2 layers take 6 units each
  auto slow = plan_partition(layers, o);
  REQUIRE(slow.ok());
  CHECK(slow->plan.layers_per_stage == std::vector<int>{6, 2});
  CHECK(slow->plan.stages[1].compute_seconds == 18.0);
  CHECK(slow->plan.bottleneck_seconds == 72.0);
  auto stay = plan_fixed_partition(layers, o, std::vector<int>{4, 4});
  REQUIRE(stay.ok());
  CHECK(stay->bottleneck_seconds == 144.0);
  // gpipe's closed form with the slower stage as the bottleneck: (m + d - 1) of its F + B... at
  // least m of them, more than the balanced plan's
  CHECK(stay->predicted_step_seconds > slow->plan.predicted_step_seconds);
}

TEST_CASE("planner errors name the bad value") {
  std::vector<LayerCosts> layers(3);
  for (LayerCosts& l : layers) l.forward = 1;
  PlannerOptions o;
  auto message = [&](const PlannerOptions& opt, const std::vector<LayerCosts>& ls) {
    auto r = plan_partition(ls, opt);
    REQUIRE_FALSE(r.ok());
    return r.error().message;
  };
  o.stages = 0;
  CHECK(message(o, layers) ==
        "planner: stages = 0 is not allowed: expected 1 .. 3 (every stage holds at least one of "
        "the 3 layers)");
  o.stages = 4;
  CHECK(contains(message(o, layers), "stages = 4 is not allowed: expected 1 .. 3"));
  o.stages = 1;
  CHECK(message(o, {}) == "planner: no layers to plan");
  o.microbatches = 0;
  CHECK(contains(message(o, layers), "microbatches = 0 is not allowed"));
  o.microbatches = 1;
  o.memory_limit_bytes = -5;
  CHECK(contains(message(o, layers), "memory_limit_bytes = -5 is not allowed"));
  o.memory_limit_bytes = 0;
  o.bandwidth = -1;
  CHECK(contains(message(o, layers), "bandwidth = -1 is not allowed"));
  o.bandwidth = std::numeric_limits<double>::infinity();
  CHECK(contains(message(o, layers), "bandwidth = inf is not allowed"));
  o.bandwidth = 0;
  o.latency = std::numeric_limits<double>::quiet_NaN();
  CHECK(contains(message(o, layers), "latency = nan is not allowed"));
  o.latency = 0;
  o.steps = 0;
  CHECK(contains(message(o, layers), "steps = 0 is not allowed"));
  o.steps = 4;
  o.stages = 2;
  o.stage_speed = {1.0};
  CHECK(contains(message(o, layers), "planner: 1 stage speeds for 2 stages"));
  o.stage_speed = {1.0, 0.0};
  CHECK(contains(message(o, layers), "stage 1's speed factor 0 is not allowed"));
  o.stage_speed = {};
  for (const std::vector<int>& counts : {std::vector<int>{3}, {1, 1}, {0, 3}, {1, 1, 1}}) {
    auto fixed = plan_fixed_partition(layers, o, counts);
    REQUIRE_FALSE(fixed.ok());
    CHECK(contains(fixed.error().message,
                   fmt::format("layers_per_stage = [{}] is not allowed: expected 2 counts >= 1 "
                               "summing to the 3 layers",
                               fmt::join(counts, ", "))));
  }
  o.stages = 1;
  std::vector<LayerCosts> bad = layers;
  bad[2].backward = -0.5;
  CHECK(message(o, bad) ==
        "planner: layer 2: backward = -0.5 is not allowed: it must be finite and >= 0 seconds");
  o.mode = Mode::twobw;
  o.stages = 3;
  o.microbatches = 2;
  CHECK(contains(message(o, layers), "planner: 2bw needs microbatches >= stages"));
}

TEST_CASE("planner: a limit no plan fits names the best attempt's stage, bytes and the limit") {
  std::vector<LayerCosts> layers(3);
  for (LayerCosts& l : layers) {
    l.forward = 1;
    l.parameter_bytes = 10;
    l.gradient_bytes = 10;
    l.optimizer_bytes = 20;
    l.activation_bytes = 8;
    l.recompute_activation_bytes = 2;
  }
  layers[2].parameter_bytes = 30;  // the head
  PlannerOptions o;
  o.mode = Mode::onef1b;
  o.stages = 2;
  o.microbatches = 4;  // stage 0 stashes 2, stage 1 one
  o.memory_limit_bytes = 50;
  // every saving recompute: [1, 2] stage 0: 40 + 2·2 = 44, stage 1: 40 + 60 + 2 + 2 = 104;
  // [2, 1]: stage 0: 80 + 2·4 = 88, stage 1: 60 + 2 = 62: the best attempt, its stage 0
  auto r = plan_partition(layers, o);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message ==
        "planner: no plan of 3 layers in 2 stages fits the memory limit of 50 bytes per stage, "
        "even recomputing every layer that saves memory: the best attempt, layers per stage "
        "[2, 1], has stage 0 (layers 0 .. 1) at 88 bytes (parameters 20, gradients 20, "
        "optimizer 40, versions 0, activations 8) > 50");
  o.memory_limit_bytes = 88;  // now [2, 1] fits, recomputing both layers of stage 0
  auto fits = plan_partition(layers, o);
  REQUIRE(fits.ok());
  CHECK(fits->plan.layers_per_stage == std::vector<int>{2, 1});
  CHECK(fits->plan.recompute == std::vector<bool>{true, true, false});
}

TEST_CASE("planner with a fixed partition equals brute force over its recompute choices") {
  std::mt19937 rng(99);
  int planned = 0, recomputing = 0, unfit = 0;
  for (int n = 1; n <= 8; ++n) {
    for (int d = 1; d <= std::min(n, kMaxStages); ++d) {
      const std::vector<LayerCosts> layers = random_layers(rng, n);
      PlannerOptions o;
      o.mode = all_modes[static_cast<size_t>(n + d) % all_modes.size()];
      o.stages = d;
      o.microbatches = o.mode == Mode::twobw ? d : 2;
      for (const std::vector<int>& counts : all_partitions(n, d)) {
        const std::int64_t plain = largest_stage_bytes(layers, o, counts, true);
        const std::int64_t least = largest_stage_bytes(layers, o, counts, false);
        for (std::int64_t limit : {std::int64_t{0}, plain, (plain + least) / 2, least, least - 1}) {
          CAPTURE(n);
          CAPTURE(d);
          CAPTURE(fmt::format("[{}]", fmt::join(counts, ", ")));
          CAPTURE(limit);
          o.memory_limit_bytes = limit;
          o.layers_per_stage = counts;
          std::optional<BrutePlan> want;
          for (std::uint32_t mask = 0; mask < (1U << n); ++mask) {
            const BrutePlan p = evaluate(layers, o, counts, mask);
            bool fits = true;
            for (int r = 0; r < p.d; ++r) fits = fits && (limit == 0 || p.bytes[r] <= limit);
            // without a limit the planner recomputes nothing (it would only cost time)
            if (limit == 0 && mask != 0) fits = false;
            if (fits && (!want || brute_before(p, *want))) want = p;
          }
          auto got = plan_partition(layers, o);
          if (!want) {
            REQUIRE_FALSE(got.ok());
            ++unfit;
            CHECK_MESSAGE(contains(got.error().message,
                                   fmt::format("planner: the partition [{}] does not fit the "
                                               "memory limit of {} bytes per stage",
                                               fmt::join(counts, ", "), limit)),
                          got.error().message);
            CHECK(contains(got.error().message, fmt::format("at {} bytes", least)));
            continue;
          }
          REQUIRE_MESSAGE(got.ok(), got.error().message);
          ++planned;
          if (want->recomputed > 0) ++recomputing;
          check_same(got->plan, *want, n);
          CHECK_FALSE(got->runner_up.has_value());
          CHECK(got->ranked.size() == 1);
        }
      }
    }
  }
  MESSAGE("plans ", planned, ", with recompute ", recomputing, ", unfit ", unfit);
  CHECK(recomputing > 20);
  CHECK(unfit > 20);
  // counts that are not a partition of the layers
  std::vector<LayerCosts> four(4);
  PlannerOptions o;
  o.stages = 2;
  for (const std::vector<int>& bad :
       {std::vector<int>{1, 2}, std::vector<int>{4, 0}, std::vector<int>{1, 1, 2}}) {
    o.layers_per_stage = bad;
    auto r = plan_partition(four, o);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message ==
          fmt::format("planner: layers_per_stage = [{}] is not allowed: expected 2 counts >= 1 "
                      "summing to the 4 layers",
                      fmt::join(bad, ", ")));
  }
}
