// Actor engine tests: every mode, d = 1..4, several m, GPT and BERT, run concurrently by the
// actors, equals the serial executor bitwise (losses, weights, optimizer state, versions used);
// sync modes also equal the single-stage reference trainer.
#include "actors/actor_engine.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "engine/data/loader.hpp"
#include "engine/execution/optimizer_shard.hpp"
#include "engine/execution/reference_trainer.hpp"
#include "engine/execution/serial_executor.hpp"
#include "engine/execution/stage_worker.hpp"
#include "engine/profiler/auto_partition.hpp"
#include "tests/support/bf16_skip.hpp"
#include "tests/support/bits.hpp"
#include "tests/support/checked_devices.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

Config tiny(Arch arch, const std::string& mode, int d, int m) {
  Config c = tiny_config(mode, d, m, tiny_model(arch, true, 5));
  c.optimizer = clipped_adamw();
  c.data.seed = 3;
  return c;
}

bool same_log(const std::vector<VersionUse>& a, const std::vector<VersionUse>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].stage != b[i].stage || a[i].kind != b[i].kind || a[i].microbatch != b[i].microbatch ||
        a[i].version != b[i].version || a[i].lookahead != b[i].lookahead ||
        a[i].tied_version != b[i].tied_version || a[i].tied_lookahead != b[i].tied_lookahead)
      return false;
  }
  return true;
}

// Runs `runs` (steps per run, one after another) on both engines and compares every bit. The
// actor engine is created from `actor_config` when given (e.g. the same config with
// pipeline.partition = "auto", which `c` names the counts of).
void check_against_serial(const Config& c, const std::vector<int>& runs, ActorEngineOptions o = {},
                          const Config* actor_config = nullptr) {
  auto serial = SerialExecutor::create(c, true);
  REQUIRE_MESSAGE(serial.ok(), (serial.ok() ? "" : serial.error().message));
  o.log_versions = true;
  auto actors = ActorEngine::create(actor_config != nullptr ? *actor_config : c, o);
  REQUIRE_MESSAGE(actors.ok(), (actors.ok() ? "" : actors.error().message));
  auto data_s = config_loader(c), data_a = config_loader(c);
  for (int steps : runs) {
    auto ls = (*serial)->run(steps, *data_s);
    REQUIRE_MESSAGE(ls.ok(), (ls.ok() ? "" : ls.error().message));
    auto la = (*actors)->run(steps, *data_a);
    REQUIRE_MESSAGE(la.ok(), (la.ok() ? "" : la.error().message));
    CHECK(same_bits(la->losses, *ls));
    CHECK(data_a->position() == data_s->position());
  }
  const int d = c.pipeline.stages;
  std::vector<VersionUse> log_a;
  for (int r = 0; r < d; ++r) {
    StageWorker& ws = (*serial)->worker(r);
    StageWorker& wa = (*actors)->worker(r);
    CHECK(wa.updates() == ws.updates());
    for (int i = 0; i < ws.num_layers(); ++i) {  // read where each stage keeps them
      CHECK(same_bits(host_copy(wa.memory(), wa.params(i)), host_copy(ws.memory(), ws.params(i))));
      CHECK(same_bits(host_copy(wa.memory(), (*actors)->optimizer(r).state(i)),
                      host_copy(ws.memory(), (*serial)->optimizer(r).state(i))));
    }
    log_a.insert(log_a.end(), wa.version_log().begin(), wa.version_log().end());
  }
  CHECK(!log_a.empty());
  CHECK(same_log(log_a, (*serial)->version_log()));
}

}  // namespace

TEST_CASE("gpipe and 1f1b equal the serial executor and the reference trainer bitwise") {
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    for (const char* mode : {"gpipe", "1f1b"}) {
      for (int d : {1, 2, 3, 4}) {
        for (int m : {1, 2, 3, 5, 8}) {
          CAPTURE(arch == Arch::gpt ? "gpt" : "bert");
          CAPTURE(mode);
          CAPTURE(d);
          CAPTURE(m);
          Config c = tiny(arch, mode, d, m);
          check_against_serial(c, {2, 1});
          // independently: single-stage gradient accumulation
          c.train.steps = 3;
          auto got = run_actor_pipeline(c);
          REQUIRE_MESSAGE(got.ok(), (got.ok() ? "" : got.error().message));
          auto model = Model::build(c.model);
          REQUIRE(model.ok());
          ReferenceTrainer ref(*model, c.optimizer, 2, 6);
          auto data = config_loader(c);
          std::vector<double> losses;
          for (int s = 0; s < c.train.steps; ++s) {
            std::vector<Microbatch> mbs;
            for (int j = 0; j < m; ++j) mbs.push_back(data->next());
            losses.push_back(ref.step(mbs));
          }
          CHECK(same_bits(got->run.losses, losses));
          for (int i = 0; i < ref.num_layers(); ++i)
            CHECK(same_bits(got->params[static_cast<size_t>(i)], ref.params(i)));
        }
      }
    }
  }
}

TEST_CASE("stages on a checked backend equal the serial executor on the CPU bitwise") {
  // the stages' actors compute on backends whose memory the host may not touch between ops, and
  // their shards on companions of them (threads of their own); the channels and the tied
  // exchange carry host tensors
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    for (const char* mode : {"gpipe", "1f1b", "2bw", "pipedream", "xpipe"}) {
      for (int d : {2, 3}) {
        CAPTURE(arch == Arch::gpt ? "gpt" : "bert");
        CAPTURE(mode);
        CAPTURE(d);
        const Config c = tiny(arch, mode, d, 3);
        for (const std::vector<int>& host : {std::vector<int>{}, std::vector<int>{d - 1}}) {
          CheckedDevices dev(d, host);
          ActorEngineOptions o;
          o.backends = dev.pointers;
          check_against_serial(c, {2, 1}, o);
          for (const auto& b : dev.backends) CHECK(b->ops() > 0);
        }
      }
    }
  }
  Config c = tiny(Arch::gpt, "1f1b", 2, 2);
  CheckedDevices dev(2);
  ActorEngineOptions o;
  o.backends = {dev.pointers[0]};
  auto bad = ActorEngine::create(c, o);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("backends: 1 entries for 2 stages") != std::string::npos);
}

TEST_CASE("stages on a checked backend drop a non-finite step as the CPU does") {
  // train.nonfinite = "skip": stage 0's B of microbatch 9 (step 3) gets a NaN output gradient;
  // the shards zero that step's gradients on their companions
  FaultInjection poison;
  poison.kind = FaultInjection::Kind::poison_gradient;
  poison.stage = 0;
  poison.microbatch = 9;
  for (const char* mode : {"gpipe", "1f1b"}) {
    CAPTURE(mode);
    Config c = tiny(Arch::gpt, mode, 2, 4);
    c.train.nonfinite = "skip";
    CheckedDevices dev(2);
    ActorEngineOptions on_cpu;
    on_cpu.fault = poison;
    ActorEngineOptions off_host = on_cpu;
    off_host.backends = dev.pointers;
    std::vector<bool> skipped[2];
    std::vector<double> losses[2];
    std::unique_ptr<ActorEngine> engines[2];
    for (int e = 0; e < 2; ++e) {
      auto created = ActorEngine::create(c, e == 0 ? on_cpu : off_host);
      REQUIRE_MESSAGE(created.ok(), (created.ok() ? "" : created.error().message));
      engines[e] = std::move(*created);
      auto data = config_loader(c);
      ActorCallbacks cb;
      cb.on_step = [&, e](const StepProgress& p) { skipped[e].push_back(p.skipped); };
      auto got = engines[e]->run(4, *data, cb);
      REQUIRE_MESSAGE(got.ok(), (got.ok() ? "" : got.error().message));
      losses[e] = got->losses;
    }
    CHECK(skipped[0] == std::vector<bool>{false, false, true, false});
    CHECK(skipped[1] == skipped[0]);
    CHECK(same_bits(losses[1], losses[0]));
    for (int r = 0; r < 2; ++r) {
      StageWorker& a = engines[0]->worker(r);
      StageWorker& b = engines[1]->worker(r);
      for (int i = 0; i < a.num_layers(); ++i) {
        CHECK(same_bits(host_copy(b.memory(), b.params(i)), host_copy(a.memory(), a.params(i))));
        CHECK(same_bits(host_copy(b.memory(), engines[1]->optimizer(r).state(i)),
                        host_copy(a.memory(), engines[0]->optimizer(r).state(i))));
      }
    }
  }
}

TEST_CASE("2bw equals the serial executor bitwise") {
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    for (int d : {1, 2, 3, 4}) {
      for (int m : {d, d + 1, 2 * d + 1}) {
        CAPTURE(arch == Arch::gpt ? "gpt" : "bert");
        CAPTURE(d);
        CAPTURE(m);
        check_against_serial(tiny(arch, "2bw", d, m), {4, 3});
      }
    }
  }
}

TEST_CASE("2bw continues across runs of one update: the tied copy keeps the previous version") {
  // a run of one step publishes only the owner's newest version; the previous one is what the
  // copy installed at the end of the run before (it failed with "the owner's version 2 of tied
  // parameter 0 is gone at the end of the run")
  for (int d : {2, 3}) {
    for (const std::vector<int>& runs :
         {std::vector<int>{2, 1}, std::vector<int>{1, 2}, std::vector<int>{1, 1, 1}}) {
      CAPTURE(d);
      CAPTURE(runs.size());
      CAPTURE(runs.front());
      check_against_serial(tiny(Arch::gpt, "2bw", d, d), runs);
    }
  }
}

TEST_CASE("pipedream equals the serial executor bitwise") {
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    for (int d : {1, 2, 3, 4}) {
      CAPTURE(arch == Arch::gpt ? "gpt" : "bert");
      CAPTURE(d);
      check_against_serial(tiny(arch, "pipedream", d, 1), {9, 5});
      check_against_serial(tiny(arch, "pipedream", d, 3), {2 * d + 1});
    }
  }
}

TEST_CASE("xpipe equals the serial executor bitwise") {
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    for (int d : {1, 2, 3, 4}) {
      for (int m : {1, 2, 3, 5}) {
        CAPTURE(arch == Arch::gpt ? "gpt" : "bert");
        CAPTURE(d);
        CAPTURE(m);
        check_against_serial(tiny(arch, "xpipe", d, m), {4, 2});
      }
    }
  }
}

TEST_CASE("delay corrections: the actors compute the serial executor's bits") {
  // nesterov in every async mode, dc and secant (alone and with the look-ahead) in 2bw and
  // pipedream (Δ from the stage's stale version; secant's pairs from its optimizer state, which
  // crosses the run boundary), AdamW and SGD, over two runs (2bw's second run starts from the
  // kept previous version)
  for (const char* mode : {"2bw", "pipedream", "xpipe"}) {
    for (const char* correction : {"nesterov", "dc", "secant", "dc+nesterov", "secant+nesterov"}) {
      if (std::string(mode) == "xpipe" && std::string(correction) != "nesterov") continue;
      for (const char* kind : {"adamw", "sgd"}) {
        for (int d : {2, 3}) {
          CAPTURE(mode);
          CAPTURE(correction);
          CAPTURE(kind);
          CAPTURE(d);
          const int m = std::string(mode) == "pipedream" ? 1 : d + 1;
          Config c = tiny(Arch::gpt, mode, d, m);
          c.optimizer.kind = kind;
          if (c.optimizer.kind == "sgd") c.optimizer.lr = 5e-2f;
          c.optimizer.delay_correction = correction;
          c.optimizer.dc_lambda = 50.0f;
          const std::vector<int> runs =
              std::string(mode) == "pipedream" ? std::vector<int>{7, 4} : std::vector<int>{3, 2};
          check_against_serial(c, runs);
          if (std::string(correction).ends_with("nesterov") && c.optimizer.kind == "adamw") {
            c.optimizer.momentum_decay = 0.004f;  // NAdam's momentum schedule
            check_against_serial(c, runs);
          }
        }
      }
    }
  }
}

TEST_CASE("basis rotation: the actors compute the serial executor's bits in every mode") {
  // the rotated update and xpipe's rotated prediction, alone and with the look-ahead, over two
  // runs; rotation_every 2 crosses a refresh inside each run
  for (const char* mode : {"gpipe", "1f1b", "2bw", "pipedream", "xpipe"}) {
    for (const char* correction : {"none", "nesterov"}) {
      const bool sync = std::string(mode) == "gpipe" || std::string(mode) == "1f1b";
      if (sync && std::string(correction) != "none") continue;
      CAPTURE(mode);
      CAPTURE(correction);
      const int d = 3, m = std::string(mode) == "pipedream" ? 1 : d + 1;
      Config c = tiny(Arch::gpt, mode, d, m);
      c.optimizer.delay_correction = correction;
      c.optimizer.basis_rotation = true;
      c.optimizer.rotation_every = 2;
      check_against_serial(
          c, std::string(mode) == "pipedream" ? std::vector<int>{7, 4} : std::vector<int>{3, 2});
    }
  }
}

TEST_CASE("basis rotation in blocks: the actors compute the serial executor's bits") {
  // rotation_block 24 splits every side of the tiny model (32, 96, 128, 64) in blocks
  for (const char* mode : {"gpipe", "2bw", "pipedream", "xpipe"}) {
    CAPTURE(mode);
    const int d = 3, m = std::string(mode) == "pipedream" ? 1 : d + 1;
    Config c = tiny(Arch::gpt, mode, d, m);
    c.optimizer.delay_correction = std::string(mode) == "gpipe" ? "none" : "nesterov";
    c.optimizer.basis_rotation = true;
    c.optimizer.rotation_every = 2;
    c.optimizer.rotation_block = 24;
    check_against_serial(
        c, std::string(mode) == "pipedream" ? std::vector<int>{7, 4} : std::vector<int>{3, 2});
  }
}

TEST_CASE("bf16: every mode's actors compute the serial executor's bits, near fp32's losses") {
  if (actorpipe::testing::skip_without_bf16()) return;
  // skipped on a CPU without bf16 instructions, where pipeline.precision = "bf16" is refused
  for (const char* mode : {"gpipe", "1f1b", "2bw", "pipedream", "xpipe"}) {
    for (Arch arch : {Arch::gpt, Arch::bert}) {
      CAPTURE(mode);
      CAPTURE(static_cast<int>(arch));
      const int d = 3, m = std::string(mode) == "pipedream" ? 1 : 4;
      Config c = tiny(arch, mode, d, m);
      c.pipeline.precision = "bf16";
      c.pipeline.threads_per_stage = 2;
      check_against_serial(
          c, std::string(mode) == "pipedream" ? std::vector<int>{6, 3} : std::vector<int>{3, 2});
      // the products really ran in bf16: other bits than fp32, the same losses to bf16's width
      Config f = c;
      f.pipeline.precision = "fp32";
      auto lb = SerialExecutor::create(c), lf = SerialExecutor::create(f);
      REQUIRE(lb.ok());
      REQUIRE(lf.ok());
      auto db = config_loader(c), df = config_loader(f);
      auto rb = (*lb)->run(5, *db), rf = (*lf)->run(5, *df);
      REQUIRE(rb.ok());
      REQUIRE(rf.ok());
      CHECK(!same_bits(*rb, *rf));
      for (size_t i = 0; i < rb->size(); ++i)
        CHECK((*rb)[i] == doctest::Approx((*rf)[i]).epsilon(0.01));
    }
  }
}

TEST_CASE(
    "bf16 stash: 2bw and pipedream actors compute the serial executor's bits, and the f32 "
    "stash's") {
  if (actorpipe::testing::skip_without_bf16()) return;
  for (const char* mode : {"2bw", "pipedream"}) {
    for (Arch arch : {Arch::gpt, Arch::bert}) {
      CAPTURE(mode);
      CAPTURE(static_cast<int>(arch));
      const bool pipedream = std::string(mode) == "pipedream";
      Config c = tiny(arch, mode, 3, pipedream ? 1 : 4);
      c.pipeline.precision = "bf16";
      c.pipeline.stash_precision = "bf16";
      c.pipeline.threads_per_stage = 2;
      check_against_serial(c, pipedream ? std::vector<int>{6, 3} : std::vector<int>{3, 2});
      Config f = c;
      f.pipeline.stash_precision = "fp32";
      auto ls = SerialExecutor::create(c), lf = SerialExecutor::create(f);
      REQUIRE(ls.ok());
      REQUIRE(lf.ok());
      auto ds = config_loader(c), df = config_loader(f);
      auto rs = (*ls)->run(5, *ds), rf = (*lf)->run(5, *df);
      REQUIRE(rs.ok());
      REQUIRE(rf.ok());
      CHECK(same_bits(*rs, *rf));
    }
  }
}

TEST_CASE("untied models, SGD, uneven partitions, no clipping, two threads per stage") {
  SUBCASE("untied 2bw") {
    Config c = tiny(Arch::gpt, "2bw", 3, 4);
    c.model.tied = false;
    check_against_serial(c, {3});
  }
  SUBCASE("sgd pipedream, partition [3, 1]") {
    Config c = tiny(Arch::bert, "pipedream", 2, 1);
    c.optimizer.kind = "sgd";
    c.pipeline.partition.counts = {3, 1};
    check_against_serial(c, {6});
  }
  SUBCASE("xpipe, two threads per stage") {
    Config c = tiny(Arch::gpt, "xpipe", 2, 3);
    c.pipeline.threads_per_stage = 2;
    check_against_serial(c, {3});
  }
  SUBCASE("threads sleep at once (no spin before a wait), two scheduler threads") {
    ActorEngineOptions o;
    o.spin_before_wait_us = 0;
    o.scheduler_threads = 2;
    check_against_serial(tiny(Arch::gpt, "2bw", 3, 4), {3}, o);
    check_against_serial(tiny(Arch::bert, "pipedream", 2, 1), {5}, o);
  }
  SUBCASE("warm-up and cosine lr decay: 1f1b and xpipe") {
    for (const char* mode : {"1f1b", "xpipe"}) {
      Config c = tiny(Arch::gpt, mode, 2, 2);
      c.optimizer.warmup_steps = 1;
      c.optimizer.decay_steps = 3;
      c.optimizer.min_lr = 1e-3f;
      check_against_serial(c, {4});
    }
  }
  SUBCASE("split_backward off: B in one pass") {
    for (const char* mode : {"gpipe", "pipedream"}) {
      Config c = tiny(Arch::bert, mode, 3, 3);
      c.pipeline.split_backward = false;
      check_against_serial(c, {2});
    }
  }
  SUBCASE("1f1b without clipping, partition [1, 1, 2]") {
    Config c = tiny(Arch::gpt, "1f1b", 3, 4);
    c.pipeline.partition.counts = {1, 1, 2};
    c.optimizer.grad_clip = 0.0f;
    check_against_serial(c, {2});
  }
}

TEST_CASE("split_backward: the previous stage gets each gradient before the weight half ends") {
  // gpipe on two stages, large enough layers that the weight half of a B takes ~10 ms.
  // With split_backward, stage 0 receives microbatch k's gradient (RECV_B) before stage 1's
  // B of k has ended; in one pass, only after. Both runs compute the same bits.
  ModelOptions model = tiny_model(Arch::gpt, true, 5);
  model.vocab_size = 512;
  model.context = 64;
  model.width = 256;
  model.heads = 4;
  Config c = tiny_config("gpipe", 2, 4, model);
  c.pipeline.microbatch_size = 4;
  c.pipeline.seq_len = 64;
  c.train.steps = 2;
  ActorEngineOptions o;
  o.record_spans = true;
  auto early_receives = [&](bool split, std::vector<double>& losses) {
    c.pipeline.split_backward = split;
    auto r = run_actor_pipeline(c, o);
    REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
    losses = r->run.losses;
    int early = 0, pairs = 0;
    for (const ActionSpan& b : r->run.spans) {
      if (b.stage != 1 || b.action.kind != ActionKind::B) continue;
      for (const ActionSpan& recv : r->run.spans) {
        if (recv.stage != 0 || recv.action.kind != ActionKind::RECV_B ||
            recv.action.microbatch != b.action.microbatch || recv.start < b.start)
          continue;  // (the same microbatch index of the other step lies on the other side)
        ++pairs;
        if (recv.start < b.end) ++early;
        break;
      }
    }
    CHECK(pairs == c.pipeline.microbatches * c.train.steps);
    return early;
  };
  std::vector<double> split_losses, one_pass_losses;
  const int split = early_receives(true, split_losses);
  const int one_pass = early_receives(false, one_pass_losses);
  const int total = c.pipeline.microbatches * c.train.steps;
  CAPTURE(split);
  CAPTURE(one_pass);
  CHECK(one_pass == 0);  // causality: sent after the B
  // stage 0's thread may not get a core in time while other programs run: most, not all
  CHECK(split >= total / 4);
  CHECK(same_bits(split_losses, one_pass_losses));
}

TEST_CASE("partition = auto: the planner's partition, trained bitwise as the serial executor") {
  // profiles go to a fresh cache directory, not the user's
  TempDir dir;
  const char* old = std::getenv("ACTORPIPE_CACHE_DIR");
  const std::string saved = old != nullptr ? old : "";
  ::setenv("ACTORPIPE_CACHE_DIR", dir.path.c_str(), 1);
  for (const char* mode : {"1f1b", "2bw", "pipedream"}) {
    CAPTURE(mode);
    Config c = tiny(Arch::gpt, mode, 2, 3);
    c.pipeline.partition.automatic = true;
    // the plan, measured once and cached: the engine reads the same profile and takes its counts
    AutoPartitionOptions ao;
    ao.reps = 1;
    auto planned = plan_auto_partition(c, ao);
    REQUIRE_MESSAGE(planned.ok(), (planned.ok() ? "" : planned.error().message));
    const std::vector<int> counts = planned->result.plan.layers_per_stage;
    auto engine = ActorEngine::create(c);
    REQUIRE_MESSAGE(engine.ok(), (engine.ok() ? "" : engine.error().message));
    CHECK_FALSE((*engine)->config().pipeline.partition.automatic);
    CHECK((*engine)->config().pipeline.partition.counts == counts);
    // the auto engine against the serial executor given those counts
    Config fixed = c;
    fixed.pipeline.partition.automatic = false;
    fixed.pipeline.partition.counts = counts;
    // two runs, as the mode tests do
    check_against_serial(fixed, {4, 3}, {}, &c);
  }
  // the serial executor itself takes no "auto": it names who resolves it
  Config c = tiny(Arch::gpt, "1f1b", 2, 2);
  c.pipeline.partition.automatic = true;
  auto serial = SerialExecutor::create(c);
  REQUIRE_FALSE(serial.ok());
  CHECK(serial.error().message.find("pipeline.partition = \"auto\": the planner chooses") !=
        std::string::npos);
  if (old != nullptr) {
    ::setenv("ACTORPIPE_CACHE_DIR", saved.c_str(), 1);
  } else {
    ::unsetenv("ACTORPIPE_CACHE_DIR");
  }
}

TEST_CASE("recompute: the actors compute the bits of no recompute, split backward or not") {
  struct Case {
    const char* mode;
    int d, m;
    std::vector<int> runs;
  };
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    for (const Case& c :
         {Case{"gpipe", 2, 3, {2, 1}}, Case{"1f1b", 3, 4, {2, 1}}, Case{"2bw", 3, 3, {3, 2}},
          Case{"pipedream", 4, 1, {5, 3}}, Case{"xpipe", 3, 2, {3, 2}}}) {
      for (bool split : {true, false}) {
        for (const RecomputeSpec& r : {RecomputeSpec{RecomputeSpec::Kind::all, {}},
                                       RecomputeSpec{RecomputeSpec::Kind::layers, {0, 2}}}) {
          CAPTURE((arch == Arch::gpt ? "gpt" : "bert"));
          CAPTURE(c.mode);
          CAPTURE(split);
          CAPTURE(r.layers.size());
          // the serial executor without recompute, the actors with it
          Config plain = tiny(arch, c.mode, c.d, c.m);
          plain.pipeline.split_backward = split;
          Config recomputed = plain;
          recomputed.pipeline.recompute = r;
          check_against_serial(plain, c.runs, {}, &recomputed);
        }
      }
    }
  }
}

TEST_CASE(
    "a stop asked before a run: gpipe, 1f1b and 2bw end after one step, exactly as a run of one "
    "step, and the loader is past its microbatches only, pipedream and xpipe run to the end") {
  for (const char* mode : {"gpipe", "1f1b", "2bw", "pipedream", "xpipe"}) {
    const std::string what = mode;
    CAPTURE(what);
    const bool sync = what == "gpipe" || what == "1f1b";
    const Config c = tiny(Arch::gpt, mode, 3, 4);
    const int64_t T = c.pipeline.seq_len > 0 ? c.pipeline.seq_len : c.model.context;
    auto serial = SerialExecutor::create(c);
    REQUIRE(serial.ok());
    auto actors = ActorEngine::create(c);
    REQUIRE(actors.ok());
    auto data_s = config_loader(c), data_a = config_loader(c);
    StopFlag stop;
    stop.request();
    ActorCallbacks cb;
    cb.stop = &stop;
    auto r = (*actors)->run(5, *data_a, cb);
    REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
    CHECK(r->stopped);
    const int ran = sync || what == "2bw" ? 1 : 5;
    CHECK(static_cast<int>(r->losses.size()) == ran);
    auto ls = (*serial)->run(ran, *data_s);
    REQUIRE(ls.ok());
    CHECK(same_bits(*ls, r->losses));
    CHECK(data_a->position() == data_s->position());
    CHECK(r->tokens == (*serial)->microbatches_for(ran) * c.pipeline.microbatch_size * T);
    for (int i = 0; i < c.model.depth + 2; ++i)
      CHECK(same_bits((*serial)->params(i), (*actors)->params(i)));
    // the next run (no stop) continues exactly
    auto r2 = (*actors)->run(2, *data_a);
    auto l2 = (*serial)->run(2, *data_s);
    REQUIRE(r2.ok());
    REQUIRE(l2.ok());
    CHECK_FALSE(r2->stopped);
    CHECK(same_bits(*l2, r2->losses));
  }
}

TEST_CASE(
    "evaluate: held-out loss through the pipeline, the serial executor's and the "
    "reference forward's bits, and training unchanged by it" *
    doctest::timeout(120)) {
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    for (const char* mode : {"gpipe", "1f1b", "2bw", "pipedream", "xpipe"}) {
      for (int d : {2, 3}) {
        const std::string where =
            fmt::format("{} d={} {}", mode, d, arch == Arch::gpt ? "gpt" : "bert");
        CAPTURE(where);
        const Config c = tiny(arch, mode, d, 3);  // 2bw needs m >= d
        auto serial = SerialExecutor::create(c);
        REQUIRE(serial.ok());
        auto actors = ActorEngine::create(c);
        REQUIRE(actors.ok());
        auto plain = ActorEngine::create(c);  // the same training without evaluations
        REQUIRE(plain.ok());
        auto data_s = config_loader(c), data_a = config_loader(c), data_p = config_loader(c);
        auto held = open_heldout_source(c.data, "", c.model.arch, c.model.vocab_size, kB, kT);
        REQUIRE(held.ok());
        std::vector<Microbatch> held_mbs;
        for (uint64_t n = 0; n < 5; ++n) held_mbs.push_back((*held)->microbatch(n));
        for (int run = 0; run < 2; ++run) {
          REQUIRE((*serial)->run(3, *data_s).ok());
          REQUIRE((*actors)->run(3, *data_a).ok());
          REQUIRE((*plain)->run(3, *data_p).ok());
          auto heldout = DataLoader::over(*held);
          auto ea = (*actors)->evaluate(*heldout, 5);
          REQUIRE_MESSAGE(ea.ok(), (ea.ok() ? "" : ea.error().message));
          auto es = (*serial)->evaluate(held_mbs);
          REQUIRE(es.ok());
          CHECK(same_bits(ea->loss, es->loss));
          CHECK(ea->microbatches == 5);
          CHECK(ea->tokens == 5 * kB * kT);
          CHECK(heldout->position() == 5);
          // the reference: the whole model, one forward per microbatch, at the stages' weights
          ReferenceTrainer ref(build_model(c.model), c.optimizer, kB, kT);
          for (int r = 0; r < d; ++r) {
            const StageWorker& w = (*actors)->worker(r);
            for (int i = 0; i < w.num_layers(); ++i) {
              auto p = w.params(i);
              std::copy(p.begin(), p.end(), ref.params(w.first_layer() + i).begin());
            }
          }
          double want = 0.0;
          for (const Microbatch& mb : held_mbs) want += ref.forward(mb).mean();
          CHECK(same_bits(ea->loss, want / 5));
        }
        // evaluating changed nothing training sees
        for (int r = 0; r < d; ++r) {
          for (int i = 0; i < (*plain)->worker(r).num_layers(); ++i) {
            CHECK(same_bits((*actors)->worker(r).params(i), (*plain)->worker(r).params(i)));
            CHECK(same_bits((*actors)->optimizer(r).state(i), (*plain)->optimizer(r).state(i)));
          }
        }
        auto la = (*actors)->run(2, *data_a);
        auto lp = (*plain)->run(2, *data_p);
        REQUIRE(la.ok());
        REQUIRE(lp.ok());
        CHECK(same_bits(la->losses, lp->losses));
      }
    }
  }
}

TEST_CASE(
    "2bw stopped mid-run ends after the step in flight, and the next run continues it to the "
    "uninterrupted training's bits") {
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    for (int d : {2, 3}) {
      const std::string what = fmt::format("{} d={}", arch == Arch::gpt ? "gpt" : "bert", d);
      CAPTURE(what);
      const Config c = tiny(arch, "2bw", d, 4);
      auto serial = SerialExecutor::create(c);
      REQUIRE(serial.ok());
      auto actors = ActorEngine::create(c);
      REQUIRE(actors.ok());
      auto data_s = config_loader(c), data_a = config_loader(c);
      // the stop comes with step 2's report; the driver may have fed step 3 or 4 already
      StopFlag stop;
      ActorCallbacks cb;
      cb.stop = &stop;
      cb.on_step = [&](const StepProgress& p) {
        if (p.step == 2) stop.request();
      };
      auto r = (*actors)->run(8, *data_a, cb);
      REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
      CHECK(r->stopped);
      const int ran = static_cast<int>(r->losses.size());
      CHECK(ran >= 2);
      CHECK(ran < 8);
      auto rest = (*actors)->run(8 - ran, *data_a);
      REQUIRE_MESSAGE(rest.ok(), (rest.ok() ? "" : rest.error().message));
      // one uninterrupted run of 8 steps
      auto ls = (*serial)->run(8, *data_s);
      REQUIRE(ls.ok());
      std::vector<double> both = r->losses;
      both.insert(both.end(), rest->losses.begin(), rest->losses.end());
      CHECK(same_bits(*ls, both));
      CHECK(data_a->position() == data_s->position());
      for (int i = 0; i < c.model.depth + 2; ++i)
        CHECK(same_bits((*serial)->params(i), (*actors)->params(i)));
    }
  }
}
