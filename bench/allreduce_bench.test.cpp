// Tests of `actorpipe-bench allreduce`'s parts that need no second process: the command line, the
// sizes taken from GPT small, the figures (bandwidths, bytes sent) and the tables.
#include "bench/allreduce_bench.hpp"

#include <doctest/doctest.h>

#include <algorithm>

#include "bench/bench_shapes.hpp"
#include "engine/model/model.hpp"

using namespace actorpipe;
using namespace actorpipe::bench;

namespace {

Expected<AllreduceBenchOptions> parse(std::vector<std::string> args) {
  return parse_allreduce_options(args);
}

std::string error_of(std::vector<std::string> args) {
  auto r = parse(std::move(args));
  REQUIRE_FALSE(r.ok());
  return r.error().message;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("GPT small's stage gradients: the even 2-stage partition's layers, all of the model") {
  const BenchShape small = find_bench_shape("small").value();
  auto floats = stage_gradient_floats(small.model, 2);
  REQUIRE(floats.ok());
  REQUIRE(floats->size() == 2);
  const Model model = Model::build(small.model).value();
  // the stages together hold every layer's buffer (the tied copy in the head included)
  CHECK((*floats)[0] + (*floats)[1] == static_cast<int64_t>(model.total_param_floats()));
  // 8 layers, 4 and 4: the embedding and 3 blocks, 3 blocks and the head
  int64_t first = 0;
  for (int l = 0; l < 4; ++l) first += static_cast<int64_t>(model.layer(l).param_floats());
  CHECK((*floats)[0] == first);
  // a block is 12 C^2 + 13 C floats (qkv, proj, fc, fc_proj and their biases, two layernorms)
  const int64_t C = small.model.width;
  const int64_t block = 12 * C * C + 13 * C;
  CHECK(static_cast<int64_t>(model.layer(1).param_floats()) == block);
  // embedding: tokens and positions; head: ln_f and the tied copy of the token table
  CHECK((*floats)[0] == int64_t{8192} * C + int64_t{256} * C + 3 * block);
  CHECK((*floats)[1] == 3 * block + 2 * C + int64_t{8192} * C);
  CHECK_FALSE(stage_gradient_floats(small.model, 100).ok());
}

TEST_CASE("default sizes: 64 KiB, 4 MiB, GPT small's two stages, 64 MiB") {
  const auto sizes = default_allreduce_sizes();
  REQUIRE(sizes.size() == 5);
  CHECK(sizes[0] == AllreduceSize{65536, ""});
  CHECK(sizes[1] == AllreduceSize{4194304, ""});
  const BenchShape small = find_bench_shape("small").value();
  const auto floats = stage_gradient_floats(small.model, 2).value();
  CHECK(sizes[2] == AllreduceSize{floats[0] * 4, "small stage 0 of 2"});
  CHECK(sizes[3] == AllreduceSize{floats[1] * 4, "small stage 1 of 2"});
  CHECK(sizes[4] == AllreduceSize{67108864, ""});
}

TEST_CASE("options: defaults, sizes (labelled when a stage's), rounds, calls, json, no peer") {
  auto d = parse({});
  REQUIRE(d.ok());
  CHECK(d->sizes == default_allreduce_sizes());
  CHECK(d->rounds == 3);
  CHECK(d->calls == 0);
  CHECK(d->scale == 1.0);
  CHECK(d->peer);
  CHECK_FALSE(d->json);
  CHECK_FALSE(d->quick);
  CHECK_FALSE(d->rank_child);

  const int64_t stage1 = default_allreduce_sizes()[3].bytes;
  auto o = parse({"--sizes", "1024," + std::to_string(stage1), "--rounds", "5", "--calls", "7",
                  "--json", "--no-peer"});
  REQUIRE(o.ok());
  CHECK(o->sizes == std::vector<AllreduceSize>{{1024, ""}, {stage1, "small stage 1 of 2"}});
  CHECK(o->rounds == 5);
  CHECK(o->calls == 7);
  CHECK(o->json);
  CHECK_FALSE(o->peer);
  CHECK(parse({"--rank-child"})->rank_child);
  CHECK(parse({"--help"})->help);
}

TEST_CASE("--quick: small sizes, one round, 5 calls, unless given explicitly") {
  auto q = parse({"--quick"});
  REQUIRE(q.ok());
  CHECK(q->quick);
  CHECK(q->sizes == std::vector<AllreduceSize>{{65536, ""}, {1048576, ""}});
  CHECK(q->rounds == 1);
  CHECK(q->calls == 5);
  CHECK(q->scale < 1.0);
  auto e = parse({"--sizes", "4096", "--quick", "--rounds", "2", "--calls", "3"});
  REQUIRE(e.ok());
  CHECK(e->sizes == std::vector<AllreduceSize>{{4096, ""}});
  CHECK(e->rounds == 2);
  CHECK(e->calls == 3);
}

TEST_CASE("bad options name the option, the value and what is allowed") {
  CHECK(contains(error_of({"--sizes", "6"}), "not a multiple of 4"));
  CHECK(contains(error_of({"--sizes", "0"}), "--sizes"));
  CHECK(contains(error_of({"--sizes", "2147483644"}), "--sizes"));
  CHECK(contains(error_of({"--rounds", "0"}), "--rounds"));
  CHECK(contains(error_of({"--calls", "x"}), "--calls"));
  CHECK(contains(error_of({"--rounds"}), "missing value"));
  CHECK(contains(error_of({"--bogus"}), "unknown option '--bogus'"));
  CHECK(contains(allreduce_usage(), "--quick"));
}

TEST_CASE("calls by size, warm-up, bytes a member sends") {
  CHECK(allreduce_calls(65536, 0) == 200);
  CHECK(allreduce_calls(4 << 20, 0) == 50);
  CHECK(allreduce_calls(16 << 20, 0) == 20);
  CHECK(allreduce_calls(int64_t{64} << 20, 0) == 10);
  CHECK(allreduce_calls(int64_t{64} << 20, 3) == 3);
  CHECK(allreduce_warmup(200) == 20);
  CHECK(allreduce_warmup(5) == 1);
  // 2 (w-1) ceil(n/w) floats: the whole buffer at w = 2, 3/2 of it at w = 4 (padded chunks)
  CHECK(allreduce_bytes_sent(1000, 2) == 4000);
  CHECK(allreduce_bytes_sent(1001, 2) == 4008);
  CHECK(allreduce_bytes_sent(1000, 4) == 6000);
  CHECK(allreduce_bytes_sent(1000, 1) == 0);
  CHECK(allreduce_bytes_sent(0, 2) == 0);
}

TEST_CASE("figures: algorithm and bus bandwidth of the median call, ratio per round") {
  const AllreduceFigures f = allreduce_figures(4000000, 3000000, 0.002);
  CHECK(f.seconds == 0.002);
  CHECK(f.alg_bytes_per_s == doctest::Approx(2e9));
  CHECK(f.bus_bytes_per_s == doctest::Approx(1.5e9));
  CHECK(allreduce_figures(100, 100, 0.0).bus_bytes_per_s == 0.0);

  AllreduceRow r;
  r.size = {1 << 20, ""};
  r.bytes_sent_per_call = 1 << 20;
  r.seconds = {0.002, 0.001, 0.004};
  r.peer_bytes_per_s = {1e9, 2e9, 0.5e9};
  CHECK(r.figures().seconds == 0.002);
  CHECK(r.figures().bus_bytes_per_s == doctest::Approx(1048576 / 0.002));
  CHECK(r.peer_median() == 1e9);
  const std::vector<double> ratios = r.ratios();
  REQUIRE(ratios.size() == 3);
  CHECK(ratios[0] == doctest::Approx(1048576 / 0.002 / 1e9));
  CHECK(ratios[1] == doctest::Approx(1048576 / 0.001 / 2e9));
  CHECK(ratios[2] == doctest::Approx(1048576 / 0.004 / 0.5e9));
  r.peer_bytes_per_s.clear();
  CHECK(r.ratios().empty());
  CHECK_FALSE(r.peer_ran());
}

TEST_CASE("size labels") {
  CHECK(allreduce_size_label(12) == "12 B");
  CHECK(allreduce_size_label(65536) == "64 KiB");
  CHECK(allreduce_size_label(1536) == "1.5 KiB");
  CHECK(allreduce_size_label(4 << 20) == "4 MiB");
  CHECK(allreduce_size_label(34'195'456) == "32.6 MiB");
}

TEST_CASE("tables: medians with the ratio per round, and every round") {
  AllreduceRow a;
  a.size = {65536, ""};
  a.calls = 200;
  a.bytes_sent_per_call = 65536;
  a.seconds = {0.0001, 0.0002};
  a.peer_bytes_per_s = {1e9, 1e9};
  a.other = "0.01";
  AllreduceRow b;
  b.size = {34'195'456, "small stage 0 of 2"};
  b.calls = 10;
  b.bytes_sent_per_call = 34'195'456;
  b.seconds = {0.02};
  b.peer_note = "--no-peer";
  b.other = "0.30 BUSY";

  const std::string t = allreduce_table({a, b});
  CHECK(contains(t, "ours bus"));
  CHECK(contains(t, "perftest"));
  // 64 KiB: median 0.15 ms, 0.44 GB/s; rounds 66% and 33% of 1 GB/s
  CHECK(contains(t, "64 KiB"));
  CHECK(contains(t, "0.150"));
  CHECK(contains(t, "0.44 GB/s"));
  CHECK(contains(t, "1.00 GB/s"));
  CHECK(contains(t, "66 33"));
  CHECK(contains(t, "0.01"));
  // the stage: its label, 1.71 GB/s, no peer (the reason shown)
  CHECK(contains(t, "32.6 MiB (small stage 0 of 2)"));
  CHECK(contains(t, "1.71 GB/s"));
  CHECK(contains(t, "--no-peer"));
  CHECK(contains(t, "0.30 BUSY"));

  const std::string r = allreduce_rounds_table({a, b});
  CHECK(contains(r, "round"));
  CHECK(contains(r, "0.66 GB/s"));  // 64 KiB in 0.1 ms
  CHECK(contains(r, "66%"));
  CHECK(contains(r, "33%"));
  CHECK(contains(r, "20.000"));
  // one line per size and round, plus the header
  CHECK(std::count(r.begin(), r.end(), '\n') == 4);
}
