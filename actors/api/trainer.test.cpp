// Trainer tests: the actors backend equals the serial one bitwise through the public API;
// train() with checkpoints then a resume equals an uninterrupted train() bitwise (also at another
// stage count); metrics lines and the trace of a real run; bad checkpoints are refused.
#include "actors/api/actorpipe/trainer.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <array>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>

#include "engine/mode.hpp"
#include "engine/model/internal/transformer_layers.hpp"
#include "engine/schedule/generators.hpp"
#include "engine/schedule/lowering.hpp"
#include "tests/support/bits.hpp"
#include "tests/support/files.hpp"
#include "tests/support/make_trainer.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;
namespace fs = std::filesystem;

namespace {

Config tiny(const std::string& mode, int stages, int steps) {
  Config c = tiny_config(mode, stages, 4, tiny_model(Arch::gpt, true, 3));
  c.optimizer.lr = 2e-2f;
  c.optimizer.grad_clip = 0.5f;
  c.train.steps = steps;
  return c;
}

void train(Trainer& t) {
  Status ok = t.train();
  REQUIRE_MESSAGE(ok.ok(), ok.error().message);
}

bool same_weights(const Trainer& a, const Trainer& b) {
  const auto wa = a.weights(), wb = b.weights();
  if (wa.size() != wb.size()) return false;
  for (size_t i = 0; i < wa.size(); ++i) {
    if (wa[i].name != wb[i].name || wa[i].shape != wb[i].shape || !same_bits(wa[i].f32, wb[i].f32))
      return false;
  }
  return true;
}

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(f, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// Losses of every step reported through on_step; each step's time must be later than the
// previous one's (a step is reported when it completes, on either backend).
std::vector<double> record_losses(Trainer& t) {
  auto losses = std::make_shared<std::vector<double>>();
  auto last = std::make_shared<double>(-1.0);
  t.on_step([losses, last](const StepMetrics& m) {
    losses->push_back(m.loss);
    CHECK(m.seconds > *last);
    *last = m.seconds;
  });
  train(t);
  return *losses;
}

}  // namespace

TEST_CASE("the actors and the serial backend train to the same bits in every mode") {
  for (const char* mode : {"gpipe", "1f1b", "2bw", "pipedream", "xpipe"}) {
    const std::string what = mode;
    CAPTURE(what);
    const Config c = tiny(mode, 3, 3);
    auto actors = make_trainer(c, Backend::actors);
    auto serial = make_trainer(c, Backend::serial);
    const auto la = record_losses(*actors);
    const auto ls = record_losses(*serial);
    CHECK(la.size() == 3);
    CHECK(same_bits(la, ls));
    CHECK(same_weights(*actors, *serial));
    CHECK(actors->step_count() == 3);
  }
}

TEST_CASE(
    "gpipe, 1f1b and 2bw: train 2N == train N, resume, train N, bitwise, pipedream, xpipe "
    "with checkpoints every N") {
  constexpr int N = 3;
  for (const char* mode : {"gpipe", "1f1b", "2bw", "pipedream", "xpipe"}) {
    const std::string what = mode;
    CAPTURE(what);
    // 2bw continues exactly across a resume; pipedream and xpipe drain and refill
    const bool exact = what == "gpipe" || what == "1f1b" || what == "2bw";
    TempDir tmp;
    // uninterrupted; pipedream and xpipe checkpoint at N, which ends a pipeline run there
    Config whole = tiny(mode, 2, 2 * N);
    whole.checkpoint.dir = tmp.file("whole");
    whole.checkpoint.every = exact ? 0 : N;
    whole.train.metrics = tmp.file("whole.jsonl");
    auto a = make_trainer(whole);
    train(*a);
    CHECK(fs::exists(tmp.file("whole/final/manifest.json")));
    CHECK(fs::exists(tmp.file("whole/step-3/manifest.json")) == !exact);

    // interrupted after N steps, continued by a fresh trainer from the directory's latest
    Config first = tiny(mode, 2, N);
    first.checkpoint.dir = tmp.file("run");
    first.train.metrics = tmp.file("run.jsonl");
    train(*make_trainer(first));
    {
      // as if the run had gone on past its checkpoint and been killed mid-write: two steps
      // the resumed run replays, then half a line
      std::ofstream more(tmp.file("run.jsonl"), std::ios::app);
      more << R"({"step":4,"loss":1.0,"tokens":1,"time":9.000000,"busy":[],"idle":[]})" << '\n'
           << R"({"migration":{"step":4,"forced":true})" << '}' << '\n'
           << R"({"step":5,"loss":1.0,"tok)";
    }
    Config second = tiny(mode, 2, 2 * N);
    second.checkpoint.dir = tmp.file("run");
    second.checkpoint.resume = tmp.file("run");
    second.train.metrics = tmp.file("run.jsonl");
    auto b = make_trainer(second);
    CHECK(b->step_count() == N);
    CHECK(b->resumed_from() == tmp.file("run/final"));
    train(*b);
    CHECK(b->step_count() == 2 * N);
    CHECK(same_weights(*a, *b));

    // the metrics file continued: the same 2N lines with the same losses, each step once, the
    // lost run's lines past the checkpoint dropped and the resume said where it happened
    const auto la = read_lines(tmp.file("whole.jsonl"));
    auto lb = read_lines(tmp.file("run.jsonl"));
    REQUIRE(la.size() == 2 * N);
    REQUIRE(lb.size() == 2 * N + 1);
    const auto resumed = lb[N].at("resumed");
    CHECK(resumed.at("step") == N);
    CHECK(resumed.at("checkpoint") == tmp.file("run/final"));
    CHECK(resumed.at("dropped") == 3);
    lb.erase(lb.begin() + N);
    for (size_t i = 0; i < la.size(); ++i) {
      CHECK(lb[i].at("step") == static_cast<int>(i) + 1);
      CHECK(la[i].at("loss").get<double>() == lb[i].at("loss").get<double>());
    }
    // both final checkpoints hold the same model bytes
    std::ifstream fa(tmp.file("whole/final/model.safetensors"), std::ios::binary);
    std::ifstream fb(tmp.file("run/final/model.safetensors"), std::ios::binary);
    std::stringstream sa, sb;
    sa << fa.rdbuf();
    sb << fb.rdbuf();
    CHECK(sa.str() == sb.str());
  }
}

TEST_CASE("2bw on both backends: train 2N == train N, checkpoint, resume, train N, bitwise") {
  constexpr int N = 2;
  for (Backend backend : {Backend::serial, Backend::actors}) {
    for (int stages : {2, 3}) {
      CAPTURE(stages);
      CAPTURE(backend == Backend::serial);
      TempDir tmp;
      auto whole = make_trainer(tiny("2bw", stages, 2 * N), backend);
      const auto lw = record_losses(*whole);
      Config first = tiny("2bw", stages, N);
      first.checkpoint.dir = tmp.file("ckpt");
      auto f = make_trainer(first, backend);
      const auto l1 = record_losses(*f);
      Config next = tiny("2bw", stages, 2 * N);
      next.checkpoint.resume = tmp.file("ckpt/final");
      auto t = make_trainer(next, backend);
      const auto l2 = record_losses(*t);
      std::vector<double> both = l1;
      both.insert(both.end(), l2.begin(), l2.end());
      CHECK(same_bits(lw, both));
      CHECK(same_weights(*whole, *t));
    }
  }
}

TEST_CASE("a 1f1b checkpoint of 2 stages continues bitwise on 3 and on 1 stages") {
  TempDir tmp;
  auto whole = make_trainer(tiny("1f1b", 2, 4));
  train(*whole);
  Config first = tiny("1f1b", 2, 2);
  first.checkpoint.dir = tmp.file("ckpt");
  train(*make_trainer(first));
  for (int d : {3, 1}) {
    CAPTURE(d);
    Config next = tiny("1f1b", d, 4);
    next.checkpoint.resume = tmp.file("ckpt/final");
    auto t = make_trainer(next);
    CHECK(t->stages() == d);
    train(*t);
    CHECK(same_weights(*whole, *t));
  }
}

TEST_CASE("run() and step() continue like train()") {
  auto whole = make_trainer(tiny("1f1b", 2, 3));
  train(*whole);
  auto t = make_trainer(tiny("1f1b", 2, 3));
  auto m1 = t->step();
  REQUIRE(m1.ok());
  CHECK(m1->step == 1);
  auto m2 = t->run(2);
  REQUIRE(m2.ok());
  CHECK(m2->step == 3);
  CHECK(m2->tokens == 3 * 4 * 2 * 6);
  CHECK(same_weights(*whole, *t));
  CHECK(t->run(0).ok() == false);
}

TEST_CASE("metrics: one JSON line per step with step, loss, tokens, time, busy and idle") {
  TempDir tmp;
  Config c = tiny("2bw", 2, 5);
  c.train.metrics = tmp.file("m.jsonl");
  auto t = make_trainer(c);
  std::vector<StepMetrics> seen;
  t->on_step([&](const StepMetrics& m) { seen.push_back(m); });
  train(*t);
  const auto lines = read_lines(c.train.metrics);
  REQUIRE(lines.size() == 5);
  REQUIRE(seen.size() == 5);
  double last_time = 0.0;
  std::vector<double> last_busy(2, 0.0);
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto& j = lines[i];
    CHECK(j.at("step") == i + 1);
    CHECK(j.at("loss").get<double>() == seen[i].loss);
    CHECK(j.at("tokens") == static_cast<int64_t>(i + 1) * 4 * 2 * 6);  // m·B·T per step
    CHECK(j.at("time").get<double>() >= last_time);
    last_time = j.at("time").get<double>();
    REQUIRE(j.at("busy").size() == 2);
    REQUIRE(j.at("idle").size() == 2);
    for (size_t r = 0; r < 2; ++r) {
      CHECK(j.at("busy")[r].get<double>() >= last_busy[r]);  // cumulative
      CHECK(j.at("idle")[r].get<double>() >= 0.0);
      last_busy[r] = j.at("busy")[r].get<double>();
    }
  }
  CHECK(last_busy[0] > 0.0);
  CHECK(last_busy[1] > 0.0);
}

TEST_CASE("forced moves: reported, in the metrics, the trace and the checkpoint, equal bits") {
  TempDir tmp;
  Config c = tiny("1f1b", 2, 6);
  c.train.metrics = tmp.file("m.jsonl");
  c.train.trace = tmp.file("t.json");
  c.checkpoint.dir = tmp.file("ckpt");
  c.checkpoint.every = 3;
  c.migration.moves = "2: 1, 3; 4: 3, 1";
  auto t = make_trainer(c);
  std::vector<MigrationEvent> seen;
  t->on_migration([&](const MigrationEvent& e) { seen.push_back(e); });
  const auto losses = record_losses(*t);
  REQUIRE(seen.size() == 2);
  CHECK(seen[1].to == std::vector<int>{3, 1});
  CHECK(t->partition() == std::vector<int>{3, 1});
  // the metrics: 6 steps and 2 migrations, in order
  const auto lines = read_lines(c.train.metrics);
  REQUIRE(lines.size() == 8);
  CHECK(lines[2].at("migration").at("step") == 2);
  CHECK(lines[2].at("migration").at("to") == nlohmann::json::array({1, 3}));
  CHECK(lines[5].at("migration").at("step") == 4);
  CHECK(lines[7].at("step") == 6);
  // the trace: one instant event per move
  std::ifstream f(c.train.trace);
  const auto trace = nlohmann::json::parse(f);
  int marks = 0;
  for (const auto& e : trace.at("traceEvents")) marks += e.at("ph") == "i" ? 1 : 0;
  CHECK(marks == 2);
  // the checkpoints name the layout their stages held
  std::ifstream m3(fs::path(c.checkpoint.dir) / "step-3" / "manifest.json");
  CHECK(nlohmann::json::parse(m3).at("partition") == nlohmann::json::array({1, 3}));
  // the same run without moves: the same bits (1f1b clips globally)
  Config plain = tiny("1f1b", 2, 6);
  auto u = make_trainer(plain);
  CHECK(same_bits(record_losses(*u), losses));
  CHECK(same_weights(*t, *u));
  // the serial backend has no migration manager
  TrainerOptions serial_options;
  serial_options.backend = Backend::serial;
  auto serial = Trainer::create(c, serial_options);
  REQUIRE_FALSE(serial.ok());
  CHECK(serial.error().message.find("migration.moves: the serial backend") != std::string::npos);
}

TEST_CASE("the trace of a run: one track per stage and per shard, one span per action and update") {
  TempDir tmp;
  Config c = tiny("1f1b", 3, 2);
  c.train.trace = tmp.file("trace.json");
  auto t = make_trainer(c);
  train(*t);
  std::ifstream f(c.train.trace);
  const auto j = nlohmann::json::parse(f);
  // every action of the two one-step schedules, per stage, by text
  auto sched = lower(*make_1f1b(3, 4));
  REQUIRE(sched.ok());
  std::map<int, std::multiset<std::string>> expected, got;
  for (int r = 0; r < 3; ++r) {
    for (const Action& a : sched->per_stage[static_cast<size_t>(r)]) {
      expected[r].insert(to_string(a));
      expected[r].insert(to_string(a));
      // the update the stage's shard ran for it, on the shard's track (tid 3 + r)
      if (a.kind == ActionKind::OPT_STEP) {
        expected[3 + r].insert(to_string(a));
        expected[3 + r].insert(to_string(a));
      }
    }
  }
  std::map<int, std::string> tracks;
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "thread_name") {
      tracks[e.at("tid").get<int>()] = e.at("args").at("name").get<std::string>();
    } else if (e.at("ph") == "X") {
      got[e.at("tid").get<int>()].insert(e.at("name").get<std::string>());
      CHECK(e.at("dur").get<double>() >= 0.0);
    }
  }
  CHECK(tracks == std::map<int, std::string>{{0, "stage 0"},
                                             {1, "stage 1"},
                                             {2, "stage 2"},
                                             {3, "stage 0 optimizer"},
                                             {4, "stage 1 optimizer"},
                                             {5, "stage 2 optimizer"}});
  CHECK(got == expected);
  size_t spans = 0;
  for (const auto& [tid, names] : expected) spans += names.size();
  CHECK(t->trace().size() == spans);
}

TEST_CASE("bad checkpoints and options are refused with a message saying what is wrong") {
  TempDir tmp;
  Config c = tiny("1f1b", 2, 1);
  c.checkpoint.dir = tmp.file("ckpt");
  train(*make_trainer(c));

  SUBCASE("a damaged file") {
    const std::string file = tmp.file("ckpt/final/model.safetensors");
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
    f.close();
    Config next = tiny("1f1b", 2, 2);
    next.checkpoint.resume = tmp.file("ckpt");
    auto t = Trainer::create(next);
    REQUIRE_FALSE(t.ok());
    CHECK(t.error().message.find("checkpoint.resume") != std::string::npos);
    CHECK(t.error().message.find("model.safetensors") != std::string::npos);
  }
  SUBCASE("a damaged newest checkpoint in a directory of them: reported, an older one used") {
    Config three = tiny("1f1b", 2, 3);
    three.checkpoint.dir = tmp.file("three");
    three.checkpoint.every = 1;
    train(*make_trainer(three));
    for (const char* name :
         {"three/final/model.safetensors", "three/step-3/optimizer.safetensors"}) {
      std::fstream f(tmp.file(name), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(-3, std::ios::end);
      f.put('\x7f');
    }
    Config next = tiny("1f1b", 2, 4);
    next.checkpoint.resume = tmp.file("three");
    auto t = make_trainer(next);
    CHECK(t->resumed_from() == tmp.file("three/step-2"));
    CHECK(t->step_count() == 2);
    REQUIRE(t->skipped_checkpoints().size() == 2);
    CHECK(t->skipped_checkpoints()[0].find("three/final/model.safetensors: checksum mismatch") !=
          std::string::npos);
    CHECK(t->skipped_checkpoints()[1].find("three/step-3/optimizer.safetensors: checksum") !=
          std::string::npos);
    // naming the damaged one refuses
    next.checkpoint.resume = tmp.file("three/final");
    CHECK_FALSE(Trainer::create(next).ok());
  }
  SUBCASE("another model") {
    Config next = tiny("1f1b", 2, 2);
    next.model.depth = 3;
    next.checkpoint.resume = tmp.file("ckpt");
    auto t = Trainer::create(next);
    REQUIRE_FALSE(t.ok());
    CHECK(t.error().message.find("model.depth: the checkpoint has 2, the config has 3") !=
          std::string::npos);
  }
  SUBCASE("no checkpoint there") {
    Config next = tiny("1f1b", 2, 2);
    next.checkpoint.resume = tmp.file("nothing");
    auto t = Trainer::create(next);
    REQUIRE_FALSE(t.ok());
    CHECK(t.error().message.find(tmp.file("nothing")) != std::string::npos);
  }
  SUBCASE("a trace with the serial backend, an unknown backend name") {
    Config next = tiny("1f1b", 2, 2);
    next.train.trace = tmp.file("t.json");
    TrainerOptions o;
    o.backend = Backend::serial;
    auto t = Trainer::create(next, o);
    REQUIRE_FALSE(t.ok());
    CHECK(t.error().message.find("train.trace") != std::string::npos);
    auto b = parse_backend("gpu");
    REQUIRE_FALSE(b.ok());
    CHECK(b.error().message == "backend \"gpu\": unknown (allowed: actors, serial)");
  }
}

TEST_CASE("preflight: what would fail at a checkpoint or at the end fails before training") {
  TempDir tmp;
  Config c = tiny("1f1b", 2, 1);
  c.checkpoint.dir = tmp.file("ckpt");
  auto steps = std::make_shared<int>(0);
  auto refused = [&](const Config& next, const std::string& part) {
    auto t = Trainer::create(next);
    REQUIRE_FALSE(t.ok());
    MESSAGE(t.error().message);
    CHECK(t.error().message.find(part) != std::string::npos);
  };
  {
    auto first = make_trainer(c);
    // a second run into the directory the first holds, even one resuming from it
    refused(c, "checkpoint.dir = \"" + c.checkpoint.dir + "\" is in use by another run (pid");
    first->on_step([steps](const StepMetrics&) { ++*steps; });
    train(*first);
  }
  CHECK(*steps == 1);
  // a fresh run where the first one's checkpoints lie
  refused(c, "holds checkpoints of another run (final)");
  // ... resuming from them, or overwriting them, may
  Config resumed = tiny("1f1b", 2, 2);
  resumed.checkpoint.dir = c.checkpoint.dir;
  resumed.checkpoint.resume = c.checkpoint.dir;
  train(*make_trainer(resumed));
  Config over = c;
  over.checkpoint.overwrite = true;
  {
    auto t = make_trainer(over);
    CHECK(!fs::exists(tmp.file("ckpt/final")));  // removed before training
    train(*t);
  }
  CHECK(fs::exists(tmp.file("ckpt/final/manifest.json")));
  // a checkpoint directory or a trace that cannot be written: refused by create(), not after
  // the training
  std::ofstream(tmp.file("file")) << "x";
  Config bad_dir = tiny("1f1b", 2, 1);
  bad_dir.checkpoint.dir = tmp.file("file/ckpt");
  refused(bad_dir, "checkpoint.dir = \"" + bad_dir.checkpoint.dir + "\": cannot create it");
  Config bad_trace = tiny("1f1b", 2, 1);
  bad_trace.train.trace = tmp.file("no-such-dir/trace.json");
  refused(bad_trace, "train.trace = \"" + bad_trace.train.trace + "\": cannot open for writing");
  Config trace_dir = tiny("1f1b", 2, 1);
  trace_dir.train.trace = tmp.path.string();
  refused(trace_dir, "is a directory");
  // the probe leaves nothing behind
  Config fine = tiny("1f1b", 2, 1);
  fine.train.trace = tmp.file("t.json");
  {
    auto t = make_trainer(fine);
    CHECK(!fs::exists(tmp.file("t.json")));
  }
}

TEST_CASE("partition = auto: both backends take the planner's partition and agree bitwise") {
  // profiles go to a fresh cache directory, not the user's; both trainers read the same profile
  TempDir dir;
  const char* old = std::getenv("ACTORPIPE_CACHE_DIR");
  const std::string saved = old != nullptr ? old : "";
  ::setenv("ACTORPIPE_CACHE_DIR", dir.path.c_str(), 1);
  Config c = tiny("1f1b", 2, 2);
  c.pipeline.partition.automatic = true;
  auto actors = make_trainer(c);
  auto serial = make_trainer(c, Backend::serial);
  CHECK_FALSE(actors->config().pipeline.partition.automatic);
  CHECK(actors->config().pipeline.partition.counts == actors->partition());
  CHECK(serial->partition() == actors->partition());
  int layers = 0;
  for (int n : actors->partition()) layers += n;
  CHECK(layers == actors->num_layers());
  train(*actors);
  train(*serial);
  CHECK(same_weights(*actors, *serial));
  if (old != nullptr) {
    ::setenv("ACTORPIPE_CACHE_DIR", saved.c_str(), 1);
  } else {
    ::unsetenv("ACTORPIPE_CACHE_DIR");
  }
}

TEST_CASE(
    "request_stop: train() ends after the step in flight with a checkpoint that resumes to "
    "the uninterrupted bits (train.stop = run) or to a run boundary there (train.stop = step)") {
  constexpr int kSteps = 12, kEvery = 6, kAt = 2;  // the stop is asked in step 2's report
  struct Case {
    const char* mode;
    const char* stop;
  };
  for (Backend backend : {Backend::serial, Backend::actors}) {
    for (const Case k : {Case{"gpipe", "step"}, Case{"1f1b", "step"}, Case{"2bw", "step"},
                         Case{"pipedream", "run"}, Case{"xpipe", "run"}, Case{"pipedream", "step"},
                         Case{"xpipe", "step"}}) {
      const char* mode = k.mode;
      const std::string what = std::string(mode) + " train.stop = " + k.stop +
                               (backend == Backend::serial ? " serial" : "");
      CAPTURE(what);
      // 2bw ends after the step in flight too: its next run continues it exactly
      const bool sync =
          std::string(mode) == "gpipe" || std::string(mode) == "1f1b" || std::string(mode) == "2bw";
      // pipedream and xpipe under train.stop = "step": cut after the step in flight, drained
      const bool drains = !sync && std::string(k.stop) == "step";
      TempDir tmp;
      Config whole = tiny(mode, 2, kSteps);
      whole.checkpoint.dir = tmp.file("whole");
      whole.checkpoint.every = kEvery;
      auto a = make_trainer(whole, backend);
      train(*a);

      Config c = tiny(mode, 2, kSteps);
      c.checkpoint.dir = tmp.file("run");
      c.checkpoint.every = kEvery;
      c.train.metrics = tmp.file("run.jsonl");
      c.train.stop = k.stop;
      auto t = make_trainer(c, backend);
      Trainer* self = t.get();
      t->on_step([self](const StepMetrics& m) {
        if (m.step == kAt) self->request_stop(SIGTERM);
      });
      train(*t);
      REQUIRE(t->stopped());
      CHECK(t->stop_signal() == SIGTERM);
      const int64_t at = t->step_count();
      if (drains) {
        // stage 0 may have begun the next steps' microbatches (pipedream: one per step; the
        // pipeline holds about d of them): those steps are finished too
        CHECK(at >= kAt);
        CHECK(at < kEvery);
      } else if (!sync) {
        CHECK(at == kEvery);  // the end of the run the request came in
      } else if (backend == Backend::serial) {
        CHECK(at == kAt);
      } else {
        // the driver may have fed the next step already (2bw: the next two, its pipeline holds
        // two steps' microbatches): those are finished too
        CHECK(at >= kAt);
        CHECK(at <= kAt + (std::string(mode) == "2bw" ? 2 : 1));
      }
      const std::string ckpt = tmp.file("run/step-" + std::to_string(at));
      CHECK(t->last_checkpoint() == ckpt);
      CHECK(fs::exists(ckpt + "/manifest.json"));
      CHECK_FALSE(fs::exists(tmp.file("run/final")));
      auto lines = read_lines(tmp.file("run.jsonl"));
      REQUIRE(lines.size() == static_cast<size_t>(at) + 1);
      for (int64_t i = 0; i < at; ++i) CHECK(lines[static_cast<size_t>(i)].at("step") == i + 1);
      const auto stopped = lines.back().at("stopped");
      CHECK(stopped.at("step") == at);
      CHECK(stopped.at("signal") == "SIGTERM");
      CHECK(stopped.at("checkpoint") == ckpt);

      // the request stays: another train() returns at once, and the checkpoint is not
      // written again
      const auto written = fs::last_write_time(ckpt + "/manifest.json");
      train(*t);
      CHECK(t->stopped());
      CHECK(t->step_count() == at);
      CHECK(fs::last_write_time(ckpt + "/manifest.json") == written);

      // a fresh trainer resumes from the directory and ends where the whole training did
      t.reset();
      Config next = c;
      next.checkpoint.resume = tmp.file("run");
      next.checkpoint.overwrite = false;
      auto b = make_trainer(next, backend);
      train(*b);
      CHECK_FALSE(b->stopped());
      CHECK(b->step_count() == kSteps);
      if (drains) {
        // not the uninterrupted training: the one whose first run ended at step `at`, which
        // the trainer's own runs make (the resumed run still ends at the multiple of kEvery)
        CHECK_FALSE(same_weights(*a, *b));
        auto ref = make_trainer(tiny(mode, 2, kSteps), backend);
        for (int64_t n : {at, kEvery - at, int64_t{kSteps - kEvery}}) {
          if (n == 0) continue;
          auto m = ref->run(static_cast<int>(n));
          REQUIRE_MESSAGE(m.ok(), (m.ok() ? "" : m.error().message));
        }
        CHECK(same_weights(*ref, *b));
      } else {
        CHECK(same_weights(*a, *b));
      }
      // every step once in the metrics: the stop's and the resume's lines between them
      std::vector<int64_t> steps;
      for (const auto& l : read_lines(tmp.file("run.jsonl")))
        if (l.contains("step")) steps.push_back(l.at("step").get<int64_t>());
      std::vector<int64_t> expected;
      for (int64_t i = 1; i <= kSteps; ++i) expected.push_back(i);
      CHECK(steps == expected);
    }
  }
}

TEST_CASE(
    "train.max_restarts: a fault at 20 random points (an exception in a stage's forward or "
    "backward or in a shard's update, a poisoned activation) is restarted from the latest "
    "checkpoint and the training ends with the uninterrupted bits") {
  constexpr int kSteps = 8;
  const std::vector<std::string> modes = {"gpipe", "1f1b", "2bw", "pipedream", "xpipe"};
  auto config = [](const std::string& mode, const std::string& dir) {
    Config c = tiny(mode, 2, kSteps);
    c.checkpoint.dir = dir;
    c.checkpoint.every = 2;
    return c;
  };
  TempDir tmp;
  std::map<std::string, std::unique_ptr<Trainer>> whole;
  for (const std::string& mode : modes) {
    whole[mode] = make_trainer(config(mode, tmp.file("whole-" + mode)));
    train(*whole[mode]);
  }
  std::mt19937 rng(20261126);
  for (int point = 0; point < 20; ++point) {
    const std::string mode = modes[rng() % modes.size()];
    const int kind = static_cast<int>(rng() % 4);  // forward, backward, poison, shard
    const int stage = static_cast<int>(rng() % 2);
    const int mbs_per_step = mode == "pipedream" ? 1 : 4;
    const int64_t mb = static_cast<int64_t>(rng() % (kSteps * mbs_per_step));
    const long version = 1 + static_cast<long>(rng() % kSteps);
    const std::string what =
        fmt::format("{}: {} at stage {}, {} {}", mode,
                    std::array{"throw in forward", "throw in backward", "poisoned output",
                               "throw in the shard's update"}[kind],
                    stage, kind == 3 ? "version" : "microbatch", kind == 3 ? version : mb);
    CAPTURE(what);
    const std::string dir = tmp.file("run-" + std::to_string(point));
    Config c = config(mode, dir);
    c.train.max_restarts = 1;
    c.train.restart_backoff = 0.0;
    c.train.metrics = dir + ".jsonl";
    TrainerOptions o;
    if (kind < 3) {
      o.fault.kind = std::array{FaultInjection::Kind::throw_in_forward,
                                FaultInjection::Kind::throw_in_backward,
                                FaultInjection::Kind::poison_output}[kind];
      o.fault.stage = stage;
      o.fault.microbatch = mb;
    } else {
      o.before_update = [stage, version](int s, long v) {
        if (s == stage && v == version) throw std::runtime_error("injected fault in the update");
      };
    }
    auto created = Trainer::create(c, o);
    REQUIRE_MESSAGE(created.ok(), created.error().message);
    Trainer& t = **created;
    std::vector<TrainerRestart> restarts;
    t.on_restart([&](const TrainerRestart& r) { restarts.push_back(r); });
    train(t);
    CHECK(t.step_count() == kSteps);
    CHECK(t.restarts() == 1);
    REQUIRE(restarts.size() == 1);
    CHECK(restarts[0].restart == 1);
    CHECK(restarts[0].error.find(kind == 2 ? "non-finite" : "injected fault") != std::string::npos);
    CHECK(restarts[0].step % 2 == 0);
    CHECK(restarts[0].resumed_from == (restarts[0].step == 0
                                           ? std::string()
                                           : dir + "/step-" + std::to_string(restarts[0].step)));
    CHECK(same_weights(*whole[mode], t));
    // the metrics: each step once, the restart's line where the replay begins
    std::vector<int64_t> steps;
    int restart_lines = 0;
    for (const auto& l : read_lines(c.train.metrics)) {
      if (l.contains("step")) steps.push_back(l.at("step").get<int64_t>());
      if (l.contains("restart")) {
        ++restart_lines;
        CHECK(l.at("restart").at("step") == restarts[0].step);
        CHECK(static_cast<int64_t>(steps.size()) == restarts[0].step);
      }
    }
    CHECK(restart_lines == 1);
    std::vector<int64_t> expected;
    for (int64_t i = 1; i <= kSteps; ++i) expected.push_back(i);
    CHECK(steps == expected);
  }
}

TEST_CASE(
    "train.max_restarts: a failure that repeats ends it after one restart, past the limit the "
    "last failure is the error, the keys are checked") {
  TempDir tmp;
  Config c = tiny("1f1b", 2, 4);
  c.checkpoint.dir = tmp.file("ckpt");
  c.checkpoint.every = 1;
  c.train.max_restarts = 2;
  c.train.restart_backoff = 0.0;
  c.optimizer.lr = 1e30f;  // every attempt turns non-finite at the same step
  c.optimizer.grad_clip = 0.0f;
  auto t = make_trainer(c);
  Status done = t->train();
  REQUIRE_FALSE(done.ok());
  CHECK(done.error().message.find("non-finite loss") != std::string::npos);
  CHECK(done.error().message.find(
            "(after 1 restart); not restarted again: the same failure at step 1 as before "
            "restart 1") != std::string::npos);
  CHECK(t->restarts() == 1);

  Config no_dir = tiny("1f1b", 2, 4);
  no_dir.train.max_restarts = 1;
  auto refused = Trainer::create(no_dir);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message ==
        "train.max_restarts = 1: restarts resume from checkpoint.dir, which is empty");
}

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

bool same_weights_as(const Trainer& t, const std::vector<NamedTensor>& w) {
  const auto now = t.weights();
  if (now.size() != w.size()) return false;
  for (size_t i = 0; i < w.size(); ++i)
    if (!same_bits(now[i].f32, w[i].f32)) return false;
  return true;
}

// Same losses bit for bit, counting every NaN as equal to every NaN.
bool same_losses(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) return false;
    if (!std::isnan(a[i]) && !same_bits(std::vector<double>{a[i]}, std::vector<double>{b[i]}))
      return false;
  }
  return true;
}

}  // namespace

TEST_CASE(
    "train.nonfinite = skip: a step with a non-finite loss is dropped on every stage, "
    "counted, and both backends agree") {
  for (const char* mode : {"gpipe", "1f1b"}) {
    const std::string what = mode;
    CAPTURE(what);
    TempDir tmp;
    // lr 1e30: step 1's update leaves huge finite weights, every later loss is not finite
    Config c = tiny(mode, 2, 5);
    c.optimizer.lr = 1e30f;
    c.optimizer.grad_clip = 0.0f;
    c.train.nonfinite = "skip";
    std::map<Backend, std::vector<StepMetrics>> steps;
    std::map<Backend, std::unique_ptr<Trainer>> trainers;
    std::vector<NamedTensor> after_step_1;
    for (Backend backend : {Backend::serial, Backend::actors}) {
      Config cb = c;
      cb.train.metrics = tmp.file(backend == Backend::serial ? "serial.jsonl" : "actors.jsonl");
      auto t = make_trainer(cb, backend);
      t->on_step([&steps, backend](const StepMetrics& m) { steps[backend].push_back(m); });
      auto first = t->run(1);
      REQUIRE_MESSAGE(first.ok(), first.error().message);
      CHECK_FALSE(first->skipped);
      if (backend == Backend::serial) after_step_1 = t->weights();
      train(*t);
      CHECK(t->step_count() == 5);
      trainers[backend] = std::move(t);
    }
    for (Backend backend : {Backend::serial, Backend::actors}) {
      const auto& s = steps[backend];
      REQUIRE(s.size() == 5);
      for (size_t i = 1; i < s.size(); ++i) {
        CHECK(s[i].skipped);
        CHECK(std::isnan(s[i].loss));
        CHECK(s[i].skipped_steps == static_cast<int64_t>(i));
      }
      // the dropped steps changed nothing: the weights are step 1's
      CHECK(same_weights_as(*trainers[backend], after_step_1));
      const auto lines =
          read_lines(tmp.file(backend == Backend::serial ? "serial.jsonl" : "actors.jsonl"));
      REQUIRE(lines.size() == 5);
      CHECK_FALSE(lines[0].contains("skipped"));
      CHECK(lines[3].at("skipped") == true);
      CHECK(lines[3].at("loss").is_null());
    }
    std::vector<double> ls, la;
    for (const auto& m : steps[Backend::serial]) ls.push_back(m.loss);
    for (const auto& m : steps[Backend::actors]) la.push_back(m.loss);
    CHECK(same_losses(ls, la));
    CHECK(same_weights(*trainers[Backend::serial], *trainers[Backend::actors]));
  }
}

TEST_CASE(
    "train.nonfinite: a non-finite gradient with finite losses stops the run naming the "
    "step, stage and layer, or (skip) drops exactly that step") {
  // stage 0's B of microbatch 9 (step 3 of 4 microbatches per step) gets a NaN gradient
  FaultInjection poison;
  poison.kind = FaultInjection::Kind::poison_gradient;
  poison.stage = 0;
  poison.microbatch = 9;
  for (const char* mode : {"gpipe", "1f1b", "2bw", "pipedream"}) {
    const std::string what = mode;
    CAPTURE(what);
    Config c = tiny(mode, 2, 5);
    TrainerOptions o;
    o.fault = poison;
    // pipedream: each microbatch is a step (5 in all): microbatch 3 is step 4
    if (what == "pipedream") o.fault.microbatch = 3;
    auto t = Trainer::create(c, o);
    REQUIRE(t.ok());
    Status done = (*t)->train();
    REQUIRE_FALSE(done.ok());
    // sync modes: found by the driver ("stage 0: ..."); the others: by the stage's optimizer
    // shard at its update ("stage 0 (0OPT_STEP@3): optimizer: ...")
    const std::string step = what == "pipedream" ? "4" : "3";
    const std::string where = is_synchronous(*parse_mode(what))
                                  ? "stage 0: "
                                  : "stage 0 (0OPT_STEP@" + step + "): optimizer: ";
    CHECK(contains(done.error().message, where + "non-finite gradient in step " + step +
                                             " at layer 0 (gpt_embedding; sum of squares nan)"));
  }
  for (const char* mode : {"gpipe", "1f1b"}) {
    const std::string what = mode;
    CAPTURE(what);
    Config c = tiny(mode, 2, 5);
    c.train.nonfinite = "skip";
    TrainerOptions o;
    o.fault = poison;
    auto created = Trainer::create(c, o);
    REQUIRE(created.ok());
    Trainer& t = **created;
    REQUIRE(t.run(2).ok());
    const auto before = t.weights();
    auto third = t.run(1);
    REQUIRE_MESSAGE(third.ok(), third.error().message);
    CHECK(third->skipped);
    CHECK(std::isfinite(third->loss));  // the loss was finite; the gradients were not
    CHECK(same_weights_as(t, before));
    auto fourth = t.run(1);
    REQUIRE(fourth.ok());
    CHECK_FALSE(fourth->skipped);
    CHECK(fourth->skipped_steps == 1);
    CHECK_FALSE(same_weights_as(t, before));
  }
  // skip needs a mode whose steps do not overlap
  Config bad = tiny("2bw", 2, 5);
  bad.train.nonfinite = "skip";
  auto refused = Trainer::create(bad);
  REQUIRE_FALSE(refused.ok());
  CHECK(contains(refused.error().message,
                 "train.nonfinite = \"skip\": pipeline.mode = \"2bw\" overlaps its steps"));
}

TEST_CASE(
    "eval.every: held-out losses after every N steps and the last, equal on both backends, "
    "in the metrics, the trace and on_eval, gpipe/1f1b/2bw training bits unchanged") {
  TempDir tmp;
  for (const char* mode : {"gpipe", "1f1b", "2bw", "pipedream", "xpipe"}) {
    const std::string what = mode;
    CAPTURE(what);
    Config c = tiny(mode, 2, 5);
    c.eval.every = 2;
    c.eval.microbatches = 3;
    c.train.metrics = tmp.file(what + ".jsonl");
    c.train.trace = tmp.file(what + ".trace.json");
    auto actors = make_trainer(c, Backend::actors);
    std::vector<EvalMetrics> seen;
    actors->on_eval([&](const EvalMetrics& m) { seen.push_back(m); });
    train(*actors);
    Config cs = c;
    cs.train.metrics = cs.train.trace = "";
    auto serial = make_trainer(cs, Backend::serial);
    std::vector<EvalMetrics> seen_serial;
    serial->on_eval([&](const EvalMetrics& m) { seen_serial.push_back(m); });
    train(*serial);
    REQUIRE(seen.size() == 3);  // after steps 2, 4 and the last, 5
    REQUIRE(seen_serial.size() == 3);
    for (size_t i = 0; i < 3; ++i) {
      CHECK(seen[i].step == std::array<int64_t, 3>{2, 4, 5}[i]);
      CHECK(same_bits(seen[i].loss, seen_serial[i].loss));
      CHECK(seen[i].microbatches == 3);
      CHECK(seen[i].tokens == 3 * kB * kT);
      CHECK(std::isfinite(seen[i].loss));
    }
    CHECK(actors->last_eval()->step == 5);
    CHECK(same_weights(*actors, *serial));
    // evaluate() again gives the same loss: the same held-out microbatches, nothing changed
    auto again = actors->evaluate();
    REQUIRE(again.ok());
    CHECK(same_bits(again->loss, seen.back().loss));
    // the metrics: step lines and eval lines in order
    std::vector<int64_t> eval_steps;
    for (const auto& j : read_lines(c.train.metrics)) {
      if (!j.contains("eval")) continue;
      eval_steps.push_back(j.at("eval").at("step").get<int64_t>());
      CHECK(j.at("eval").at("microbatches") == 3);
    }
    CHECK(eval_steps == std::vector<int64_t>{2, 4, 5, 5});
    const std::string trace = slurp(c.train.trace);
    CHECK(trace.find("\"cat\":\"eval\"") != std::string::npos);
    CHECK(trace.find("\"name\":\"eval 1F0\"") != std::string::npos);
    CHECK(trace.find("eval after step 2: loss") != std::string::npos);
    // in the modes whose runs may be cut anywhere, evaluating changes no training bit
    if (what == "gpipe" || what == "1f1b" || what == "2bw") {
      Config plain = cs;
      plain.eval.every = 0;
      auto p = make_trainer(plain, Backend::actors);
      train(*p);
      CHECK(same_weights(*actors, *p));
    }
  }
}

TEST_CASE("held-out data: errors name what is missing, a resumed run keeps the eval lines") {
  TempDir tmp;
  Config c = tiny("1f1b", 2, 4);
  c.eval.every = 2;
  c.data.kind = "text";
  c.data.path = tmp.file("corpus.txt");
  dump(c.data.path, std::string(4000, 'a'));
  c.model.vocab_size = 256;
  // validate() refuses a file without a held-out part
  auto t = Trainer::create(c);
  REQUIRE(!t.ok());
  CHECK(t.error().message.find("set data.holdout (a fraction of the file kept out of training) "
                               "or eval.path") != std::string::npos);
  c.data.holdout = 0.1;
  c.train.metrics = tmp.file("m.jsonl");
  c.checkpoint.dir = tmp.file("ckpt");
  c.checkpoint.every = 2;
  auto whole = make_trainer(c);
  train(*whole);
  Config resumed = c;
  resumed.checkpoint.resume = c.checkpoint.dir + "/step-2";
  resumed.checkpoint.dir = tmp.file("ckpt2");
  auto r = make_trainer(resumed);
  train(*r);
  CHECK(same_weights(*whole, *r));
  int evals = 0;
  for (const auto& j : read_lines(c.train.metrics)) evals += j.contains("eval") ? 1 : 0;
  CHECK(evals == 2);  // step 2 kept across the resume, step 4 written again
  // own training data needs own held-out data
  Config own = tiny("1f1b", 2, 2);
  own.eval.every = 1;
  TrainerOptions o;
  o.data = open_data_source(own.data, own.model.arch, own.model.vocab_size, kB, kT).value();
  auto refused = Trainer::create(own, o);
  REQUIRE(!refused.ok());
  CHECK(refused.error().message.find("set TrainerOptions::eval_data") != std::string::npos);
  o.eval_data =
      open_heldout_source(own.data, "", own.model.arch, own.model.vocab_size, kB, kT).value();
  auto accepted = Trainer::create(own, o);
  REQUIRE(accepted.ok());
  auto built_in = make_trainer(own);  // the same data through [data]: the same bits
  train(**accepted);
  train(*built_in);
  CHECK(same_weights(**accepted, *built_in));
  CHECK(same_bits((*accepted)->last_eval()->loss, built_in->last_eval()->loss));
}

TEST_CASE("TrainerOptions::model and ::data: errors name the key that does not describe them") {
  Config c = tiny("1f1b", 2, 2);
  TrainerOptions o;
  o.model = std::make_shared<const Model>(build_model(c.model));
  Config wide = c;
  wide.model.width = 16;
  wide.model.heads = 2;
  auto t = Trainer::create(wide, o);
  REQUIRE(!t.ok());
  CHECK(t.error().message == "TrainerOptions::model: model.width = 16, but the model given has 8");
  // "auto" profiles the model given (never cached) and plans its partition
  TempDir cache;
  setenv("ACTORPIPE_CACHE_DIR", cache.str().c_str(), 1);
  Config auto_part = c;
  auto_part.pipeline.partition.automatic = true;
  auto_part.pipeline.recompute.kind = RecomputeSpec::Kind::automatic;
  t = Trainer::create(auto_part, o);
  REQUIRE_MESSAGE(t.ok(), (t.ok() ? "" : t.error().message));
  const auto counts = (*t)->partition();
  CHECK(counts.size() == 2);
  CHECK(counts[0] + counts[1] == 4);
  CHECK(!(*t)->config().pipeline.partition.automatic);
  train(**t);
  CHECK(fs::is_empty(cache.path));
  unsetenv("ACTORPIPE_CACHE_DIR");
  // the same model given: the same bits as the built-in path
  auto given = Trainer::create(c, o);
  REQUIRE(given.ok());
  auto built_in = make_trainer(c);
  train(**given);
  train(*built_in);
  CHECK(same_weights(**given, *built_in));

  TrainerOptions d;
  d.data = open_data_source(c.data, c.model.arch, c.model.vocab_size, kB + 1, kT).value();
  t = Trainer::create(c, d);
  REQUIRE(!t.ok());
  CHECK(t.error().message.find("makes microbatches of 3 sequences, but "
                               "pipeline.microbatch_size = 2") != std::string::npos);
  d.data = open_data_source(c.data, c.model.arch, 200, kB, kT).value();
  t = Trainer::create(c, d);
  REQUIRE(!t.ok());
  CHECK(t.error().message.find("has vocabulary 200, expected 1 .. model.vocab_size = 24") !=
        std::string::npos);
}

TEST_CASE("a data source of one's own that makes a bad microbatch fails the run naming it") {
  class Bad final : public DataSource {
   public:
    explicit Bad(std::shared_ptr<const DataSource> inner) : inner_(std::move(inner)) {}
    Microbatch microbatch(uint64_t n) const override {
      Microbatch mb = inner_->microbatch(n);
      if (n == 5) mb.tokens[3] = 99;
      return mb;
    }
    int vocab_size() const override { return inner_->vocab_size(); }
    int batch_size() const override { return inner_->batch_size(); }
    int seq_len() const override { return inner_->seq_len(); }
    std::string describe() const override { return "bad"; }

   private:
    std::shared_ptr<const DataSource> inner_;
  };
  const Config c = tiny("1f1b", 2, 3);
  for (Backend b : {Backend::actors, Backend::serial}) {
    TrainerOptions o;
    o.backend = b;
    o.data = std::make_shared<Bad>(
        open_data_source(c.data, c.model.arch, c.model.vocab_size, kB, kT).value());
    auto t = Trainer::create(c, o);
    REQUIRE(t.ok());
    Status ok = (*t)->train();
    REQUIRE(!ok.ok());
    CAPTURE(ok.error().message);
    CHECK(ok.error().message.find("data: microbatch 5: tokens[3] = 99: outside [0, "
                                  "vocab_size = 24)") != std::string::npos);
  }
}

namespace {

// Microbatch 5 fails while `armed` is set.
class FlakySource final : public DataSource {
 public:
  FlakySource(std::shared_ptr<const DataSource> inner, std::shared_ptr<std::atomic<bool>> armed)
      : inner_(std::move(inner)), armed_(std::move(armed)) {}
  Microbatch microbatch(uint64_t n) const override {
    // each failure in other words: the same error at the same step again would be taken for a
    // repeat and not restarted (Supervisor::run)
    if (n == 5 && armed_->exchange(false))
      throw std::runtime_error(throws_++ == 0 ? "flaky read" : "flaky read, another time");
    return inner_->microbatch(n);
  }
  int vocab_size() const override { return inner_->vocab_size(); }
  int batch_size() const override { return inner_->batch_size(); }
  int seq_len() const override { return inner_->seq_len(); }
  std::string describe() const override { return "flaky"; }

 private:
  std::shared_ptr<const DataSource> inner_;
  std::shared_ptr<std::atomic<bool>> armed_;
  mutable std::atomic<int> throws_{0};
};

}  // namespace

TEST_CASE(
    "restarts before the first checkpoint start over and keep every restart's line in "
    "train.metrics (in this process, and a relaunch)") {
  auto restart_lines = [](const std::vector<nlohmann::json>& lines) {
    std::vector<int> out;
    for (const auto& l : lines)
      if (l.contains("restart")) out.push_back(l.at("restart").at("restart").get<int>());
    return out;
  };
  auto step_lines = [](const std::vector<nlohmann::json>& lines) {
    std::vector<int64_t> out;
    for (const auto& l : lines)
      if (l.contains("step")) out.push_back(l.at("step").get<int64_t>());
    return out;
  };
  TempDir tmp;
  Config c = tiny("1f1b", 2, 3);
  c.checkpoint.dir = tmp.file("ckpt");
  c.checkpoint.every = 10;  // none before the end
  c.train.max_restarts = 3;
  c.train.restart_backoff = 0.0;
  c.train.metrics = tmp.file("m.jsonl");
  {
    // microbatch 5 (step 2) fails at the start and again after the first restart
    TrainerOptions o;
    auto armed = std::make_shared<std::atomic<bool>>(true);
    auto source = open_data_source(c.data, c.model.arch, c.model.vocab_size, kB, kT);
    REQUIRE(source.ok());
    o.data = std::make_shared<FlakySource>(*source, armed);
    auto t = Trainer::create(c, o);
    REQUIRE(t.ok());
    (*t)->on_restart([armed](const TrainerRestart& r) {
      if (r.restart == 1) *armed = true;
    });
    train(**t);
    CHECK((*t)->restarts() == 2);
    const auto lines = read_lines(c.train.metrics);
    CHECK(restart_lines(lines) == std::vector<int>{1, 2});
    CHECK(step_lines(lines) == std::vector<int64_t>{1, 2, 3});
  }
  // a relaunch by actorpipe-launch that finds no checkpoint: the file of the failed attempts
  // (a restart line, a step, a line cut short) keeps the restart and drops the rest
  Config r = c;
  r.checkpoint.dir = tmp.file("ckpt2");
  {
    std::ofstream f(r.train.metrics);
    f << restart_json(0, 1, 3, "", "rank 1 killed") << '\n'
      << R"({"step":1,"loss":1.0,"tokens":1,"time":1.000000,"busy":[],"idle":[]})" << '\n'
      << R"({"step":2,"lo)";
  }
  TrainerOptions o;
  o.relaunched = TrainerRestart{2, 3, "rank 0 killed", 0.0, "", 0};
  auto t = Trainer::create(r, o);
  REQUIRE(t.ok());
  train(**t);
  const auto lines = read_lines(r.train.metrics);
  CHECK(restart_lines(lines) == std::vector<int>{1, 2});
  CHECK(step_lines(lines) == std::vector<int64_t>{1, 2, 3});
}

namespace {

// A GPT of depth 3 built from its layers, with its embedding tied to the head and the first
// block's MLP input matrix tied to the third block's (a model of one's own).
Model tied_blocks(const ModelOptions& o) {
  auto m = Model::from_layers(
      o,
      {internal::make_gpt_embedding(o, 0), internal::make_block(o, 1, true),
       internal::make_block(o, 2, true), internal::make_block(o, 3, true),
       internal::make_gpt_head(o, 4)},
      {{0, "wte", 4, "lm_head.weight"}, {1, "mlp.fc.weight", 3, "mlp.fc.weight"}});
  REQUIRE_MESSAGE(m.ok(), (m.ok() ? "" : m.error().message));
  return std::move(m).value();
}

}  // namespace

TEST_CASE(
    "a model of one's own with a tie between two hidden layers trains in every mode, both "
    "backends equal, the tied copies equal, xpipe refuses a copy off the last stage") {
  for (const char* mode : {"gpipe", "1f1b", "2bw", "pipedream", "xpipe"}) {
    for (int stages : {2, 3, 4}) {
      const std::string what = fmt::format("{} d={}", mode, stages);
      CAPTURE(what);
      Config c = tiny(mode, stages, 4);
      c.model.depth = 3;
      const Model m = tied_blocks(c.model);
      // even partitions of 5 layers: layer 3 is on the last stage of 2, not of 3 or 4
      const bool refused = what == "xpipe d=3" || what == "xpipe d=4";
      std::vector<std::vector<NamedTensor>> w;
      for (Backend b : {Backend::actors, Backend::serial}) {
        TrainerOptions to;
        to.backend = b;
        to.model = std::make_shared<const Model>(m);
        auto t = Trainer::create(c, to);
        if (refused) {
          REQUIRE(!t.ok());
          CHECK(t.error().message.find("xpipe: the tied copy layers.3.mlp.fc.weight is on stage") ==
                0);
          continue;
        }
        REQUIRE_MESSAGE(t.ok(), (t.ok() ? "" : t.error().message));
        train(**t);
        w.push_back((*t)->weights());
      }
      if (refused) continue;
      REQUIRE(w[0].size() == w[1].size());
      for (size_t i = 0; i < w[0].size(); ++i) CHECK(same_bits(w[0][i].f32, w[1][i].f32));
      const NamedTensor *a = nullptr, *b = nullptr;
      for (const NamedTensor& t : w[0]) {
        if (t.name == "layers.1.mlp.fc.weight") a = &t;
        if (t.name == "layers.3.mlp.fc.weight") b = &t;
      }
      REQUIRE((a != nullptr && b != nullptr));
      CHECK(same_bits(a->f32, b->f32));
    }
  }
}

TEST_CASE("a model of one's own moves between stages (forced migration) to the same bits") {
  Config c = tiny("1f1b", 2, 6);
  c.model.depth = 3;
  const Model m = tied_blocks(c.model);
  TrainerOptions to;
  to.model = std::make_shared<const Model>(m);
  Config moved = c;
  moved.migration.moves = "2: 2, 3; 4: 4, 1";
  moved.eval.every = 3;
  auto a = Trainer::create(moved, to);
  auto b = Trainer::create(c, to);
  REQUIRE_MESSAGE(a.ok(), (a.ok() ? "" : a.error().message));
  REQUIRE(b.ok());
  train(**a);
  train(**b);
  CHECK((*a)->partition() == std::vector<int>{4, 1});
  CHECK(same_weights(**a, **b));
  REQUIRE((*a)->last_eval().has_value());
  CHECK((*a)->last_eval()->step == 6);
  // the automatic rule profiles the model given
  Config automatic = c;
  automatic.migration.enabled = true;
  automatic.migration.check_every = 2;
  auto r = Trainer::create(automatic, to);
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
  int checks = 0;
  (*r)->on_migration([&](const MigrationEvent&) { ++checks; });
  train(**r);
  CHECK(checks >= 2);
}
