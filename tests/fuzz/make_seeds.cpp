// Writes the binary and generated seeds of tests/fuzz/corpus/ from the project's own writers:
// the example configs and their keys as --set overrides, a small checkpoint (its safetensors
// files and manifest), token files of every layout, every action kind's text and the CSV of
// every mode's schedule, announcements as raw bytes, and every message type serialized by CAF.
// Built on request in the fuzz build (--target fuzz_make_seeds):
//   fuzz_make_seeds <source dir> <corpus dir>
#include <caf/all.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>

#include "actors/coordinator.hpp"
#include "actors/internal/messages.hpp"
#include "actors/process_group.hpp"
#include "engine/checkpoint/checkpoint.hpp"
#include "engine/config/config.hpp"
#include "engine/config/option_table.hpp"
#include "engine/data/token_file.hpp"
#include "engine/schedule/csv.hpp"
#include "engine/schedule/generators.hpp"
#include "engine/schedule/lowering.hpp"
#include "kernels/check.hpp"
#include "transport/wire.hpp"

namespace fs = std::filesystem;
using namespace actorpipe;
using namespace actorpipe::internal;

namespace {

fs::path corpus;

void seed(const std::string& harness, const std::string& name, std::string_view bytes) {
  fs::create_directories(corpus / harness);
  std::ofstream out(corpus / harness / name, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  AP_CHECK(out.good(), "writing {}/{}", harness, name);
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <class T>
T get(Expected<T> x) {
  AP_CHECK(x.ok(), "{}", x.error().message);
  return std::move(*x);
}

void configs(const fs::path& source) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(source / "examples/configs")) files.push_back(e);
  std::sort(files.begin(), files.end());
  const Config defaults;
  for (const fs::path& f : files) {
    const std::string name = f.stem().string();
    seed("config_toml", name, slurp(f));
    // what the example changes from the defaults, as a command line; both spellings of --set
    const Config c = get(load_config(f.string()));
    std::string args;
    bool joined = false;
    for (const OptionSpec& spec : option_table()) {
      if (spec.get(c) == spec.get(defaults)) continue;
      const std::string set = spec.name() + "=" + to_toml_text(spec.kind, spec.get(c));
      args += joined ? "--set=" + set + "\n" : "--set\n" + set + "\n";
      joined = !joined;
    }
    seed("config_set", name, args);
  }
  seed("config_toml", "defaults", to_toml(defaults));
  seed("config_set", "words",
       "--set\npipeline.partition=auto\n--set=pipeline.recompute=all\n--set\n"
       "data.kind=tokens\n--set\ndata.path=train.bin\n--set=model.arch=bert\n--set\n"
       "migration.moves=\"2:[1,2,1]\"\n");
}

void checkpoint(const fs::path& scratch) {
  std::vector<float> w(12), b = {-0.0f, 1e-30f, 3.0f}, m(12, 0.5f);
  for (int i = 0; i < 12; ++i) w[static_cast<size_t>(i)] = 0.25f * static_cast<float>(i) - 1;
  std::vector<int32_t> counts = {7, -7};
  CheckpointInfo info;
  info.step = 3;
  info.data_position = 1003;
  info.rng_state = {0xFFFFFFFFFFFFFFFFull, 1};
  info.mode = "2bw";
  info.stages = 2;
  info.partition = {2, 2};
  info.model.depth = 2;
  info.model.width = 16;
  info.model.heads = 2;
  info.extra = {{"updates", "3"},          {"data.kind", "synthetic"},
                {"data.seed", "1"},        {"pipeline.microbatch_size", "2"},
                {"pipeline.seq_len", "8"}, {"pipeline.microbatches", "4"}};
  CheckpointRefs refs;
  refs.model = {{"layers.0.w", {3, 4}, w.data()}, {"layers.1.b", {3}, b.data()}};
  refs.optimizer = {{"layers.0.w.adam_m", {3, 4}, m.data()},
                    {"layers.0.w.adam_v", {3, 4}, m.data()},
                    {.name = "counts", .shape = {2}, .i32 = counts.data()}};
  refs.versions = {{"layers.0.w@v2", {3, 4}, w.data()}, {"empty", {0, 3}, nullptr}};
  const std::string dir = get(save_checkpoint(scratch.string(), info, refs));
  for (const char* file : {kModelFile, kOptimizerFile, kVersionsFile}) {
    seed("safetensors", fs::path(file).stem().string(), slurp(fs::path(dir) / file));
  }
  seed("checkpoint_manifest", "periodic", slurp(fs::path(dir) / kManifestFile));
  info.final = true;
  info.partition = {};
  info.extra = {{"loss", "2.5"}, {"note", "quote \" and \\ and \xc3\xa9"}};
  info.optimizer.kind = "sgd";
  const std::string last = get(save_checkpoint(scratch.string(), info, refs));
  seed("checkpoint_manifest", "final", slurp(fs::path(last) / kManifestFile));
  // a scalar and metadata
  float one = 1.0f;
  const std::string scalar = (scratch / "scalar.safetensors").string();
  AP_CHECK(write_safetensors(scalar, {{"scale", {}, &one}}, {{"format_version", "1"}}).ok());
  seed("safetensors", "scalar_metadata", slurp(scalar));
}

void tokens(const fs::path& scratch) {
  std::vector<uint16_t> ids(40);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>((i * 1237) % 50257);
  for (auto [layout, name] :
       {std::pair{TokenFileLayout::raw, "raw"}, std::pair{TokenFileLayout::llmc, "llmc"}}) {
    const fs::path p = scratch / name;
    AP_CHECK(write_token_file(p.string(), ids, layout).ok());
    seed("token_file", name, slurp(p));
  }
  seed("token_file", "text",
       "Pipelines pass activations forward \xe2\x86\x92 and gradients back.\n");
}

void schedules() {
  std::set<std::string> actions;
  for (Mode mode : all_modes) {
    const int steps = mode == Mode::gpipe || mode == Mode::onef1b ? 1 : 2;
    const Schedule s = get(make_schedule(mode, 3, 4, steps));
    const std::string csv = get(export_csv(s));
    seed("schedule_csv", std::string(to_string(mode)), csv);
    for (const auto& list : get(lower(s)).per_stage) {
      for (const Action& a : list) actions.insert(to_string(a));
    }
  }
  const Schedule continued = get(make_2bw(2, 2, 2, true));
  seed("schedule_csv", "2bw_continued", get(export_csv(continued)));
  for (const auto& list : get(lower(continued)).per_stage) {
    for (const Action& a : list) actions.insert(to_string(a));
  }
  seed("schedule_csv", "lf_quotes_blanks", "0F0, \"0B0\",,\n 1F0 ,1B0\n");
  // one of each shape: kinds, versions, lookaheads
  std::set<std::string> shapes;
  for (const std::string& a : actions) {
    std::string shape;
    for (char ch : a) shape += (ch >= '0' && ch <= '9') ? '9' : ch == '-' ? 'm' : ch;
    if (shapes.insert(shape).second) seed("schedule_action", shape, a);
  }
}

Announcement announcement() {
  Announcement a;
  a.tag = 5;
  a.sequence = 12;
  a.microbatch = 7;
  a.version = 1;
  a.dtype = DType::f32;
  a.ndim = 3;
  a.dims = {4, 16, 32, 0};
  return a;
}

void announcements() {
  // the bytes UCX carries, padding zeroed so that the seeds do not depend on the stack
  Announcement a;
  std::memset(static_cast<void*>(&a), 0, sizeof(a));
  auto raw = [](const Announcement& x) {
    return std::string(reinterpret_cast<const char*>(&x), sizeof(x));
  };
  const Announcement filled = announcement();
  a.tag = filled.tag;
  a.sequence = filled.sequence;
  a.microbatch = filled.microbatch;
  a.version = filled.version;
  a.dtype = filled.dtype;
  a.ndim = filled.ndim;
  a.dims = filled.dims;
  seed("wire_announcement", "f32_3d", raw(a));
  a.dtype = DType::i32;
  a.ndim = 1;
  a.dims = {8, 0, 0, 0};
  seed("wire_announcement", "i32_1d", raw(a));
  a.ndim = 0;
  seed("wire_announcement", "scalar", raw(a));
}

template <class T>
void message(caf::actor_system& sys, const std::string& name, int type, T x) {
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  auto err = sink(x);
  AP_CHECK(!err, "{}", caf::to_string(err));
  std::string bytes(1, static_cast<char>(type));
  bytes.append(buf.begin(), buf.end());
  seed("caf_messages", name, bytes);
}

void messages() {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", 1);
  caf::actor_system sys{cfg};
  // the order of caf_messages.fuzz.cpp's readers
  const StageTimes times{1.25, 0.5, 42};
  const TiedAnnouncement tied{9, 2, 1, 3, announcement()};
  const Commit commit{1, 5, 12.75, times};
  const Failure failure{2, 99, "2B7", "non-finite loss nan over 12 targets"};
  const RunOutcome outcome{true, "", {2.5, 2.25}, 3, {times, times}};
  MigrationEvent event;
  event.step = 20;
  event.moved = true;
  event.from = {1, 7};
  event.to = {4, 4};
  event.reason = "imbalance 1.3 > 0.15";
  event.busy = {0.25, 1.75};
  event.speed = {1.0, 1.0};
  RankInfo info{1, "node-1", {'\x01', '\x02', '\x03'}, {}};
  JobTable table{2, {RankInfo{0, "node-0", {'\x07'}, {}}, info}, {}};
  RankPart part{1, {}, "{\"ok\": true}"};
  message(sys, "announcement", 0, announcement());
  message(sys, "stage_times", 1, times);
  message(sys, "update_ticket", 2, UpdateTicket{7, 3.5});
  message(sys, "tied_announcement", 3, tied);
  message(sys, "sumsq", 4, SumSq{4, 2, {1.0, 1e-300}});
  message(sys, "commit", 5, commit);
  message(sys, "failure", 6, failure);
  message(sys, "run_outcome", 7, outcome);
  message(sys, "migration_event", 8, event);
  message(sys, "stage_times_vector", 9, std::vector<StageTimes>{times, times});
  message(sys, "rank_info", 10, info);
  message(sys, "job_table", 11, table);
  message(sys, "rank_part", 12, part);
  message(sys, "rank_parts", 13, std::vector<RankPart>{part, part});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: fuzz_make_seeds <source dir> <corpus dir>\n";
    return 2;
  }
  corpus = argv[2];
  const fs::path scratch = fs::temp_directory_path() / fmt::format("fuzz-seeds-{}", ::getpid());
  fs::create_directories(scratch);
  configs(argv[1]);
  checkpoint(scratch);
  tokens(scratch);
  schedules();
  announcements();
  messages();
  fs::remove_all(scratch);
  std::cout << "seeds written to " << corpus.string() << "\n";
  return 0;
}
