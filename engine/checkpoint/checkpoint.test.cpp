// Checkpoint tests: bitwise round trip, the manifest and its checksums, resolving the latest
// complete checkpoint past simulated crashes, and refusal of every kind of damaged checkpoint.
#include "engine/checkpoint/checkpoint.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/internal/file_io.hpp"
#include "tests/support/bits.hpp"
#include "tests/support/files.hpp"
#include "tests/support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace actorpipe;
using namespace actorpipe::testing;
using json = nlohmann::json;

namespace {

// Copies checkpoint <dir>/step-<from> to <dir>/step-<to>, its manifest recording step `to`.
void copy_as_step(const fs::path& dir, int from, int to) {
  const fs::path target = dir / fmt::format("step-{}", to);
  fs::copy(dir / fmt::format("step-{}", from), target, fs::copy_options::recursive);
  std::string manifest = slurp(target / "manifest.json");
  const std::string was = fmt::format("\"step\": {}", from), now = fmt::format("\"step\": {}", to);
  manifest.replace(manifest.find(was), was.size(), now);
  dump(target / "manifest.json", manifest);
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// CRC-32 bit by bit, straight from the definition (reflected polynomial 0xEDB88320).
uint32_t crc32_reference(const std::string& bytes) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : bytes) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

// A small, fully populated checkpoint: step `step`, tensors whose values depend on the step.
struct Sample {
  std::vector<float> w, b, m, v, w7;
  std::vector<int32_t> counts;
  CheckpointInfo info;
  explicit Sample(int64_t step) {
    for (int i = 0; i < 12; ++i)
      w.push_back(0.1f * static_cast<float>(i) - static_cast<float>(step));
    b = {-0.0f, 1e-30f, 3.0f};
    m = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    v = std::vector<float>(12, 0.5f);
    w7 = w;
    w7[0] = 42.0f;
    counts = {static_cast<int32_t>(step), -7};
    info.step = step;
    info.data_position = 1000 + static_cast<uint64_t>(step);
    info.rng_state = {0xFFFFFFFFFFFFFFFFull, 1, 0x8000000000000000ull, 12345};
    info.mode = "2bw";
    info.stages = 2;
    info.partition = {3, 3};
    info.model.width = 64;
    info.model.heads = 8;
    info.model.init_seed = 77;
    info.optimizer.lr = 3e-4f;
    info.optimizer.beta2 = 0.999f;
    info.extra = {{"loss", "2.5"}, {"note", "quote \" and \\ and é"}};
  }
  CheckpointRefs refs() const {
    return CheckpointRefs{
        {{"layers.0.wte", {3, 4}, w.data()}, {"layers.5.ln_f.bias", {3}, b.data()}},
        {{"layers.0.wte.adam_m", {3, 4}, m.data()},
         {"layers.0.wte.adam_v", {3, 4}, v.data()},
         {.name = "layers.0.wte.count", .shape = {2}, .i32 = counts.data()}},
        {{"layers.0.wte@v7", {3, 4}, w7.data()}},
        {}};
  }
  Expected<std::string> save(const std::string& dir) const {
    return save_checkpoint(dir, info, refs());
  }
};

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string load_error(const std::string& path) {
  auto r = load_checkpoint(path);
  REQUIRE_MESSAGE(!r.ok(), "loaded " << path);
  return r.error().message;
}

}  // namespace

TEST_CASE("CRC-32 matches the standard check value and a bitwise reference") {
  CHECK(internal::crc32("123456789", 9) == 0xCBF43926u);
  std::string bytes;
  for (int i = 0; i < 3000; ++i) bytes.push_back(static_cast<char>((i * 7919) & 0xFF));
  CHECK(internal::crc32(bytes.data(), bytes.size()) == crc32_reference(bytes));
  // Incremental use equals one pass.
  uint32_t c = internal::crc32(bytes.data(), 1000);
  c = internal::crc32(bytes.data() + 1000, bytes.size() - 1000, c);
  CHECK(c == crc32_reference(bytes));
}

TEST_CASE("save then load gives back every tensor bitwise and every manifest field") {
  TempDir dir;
  Sample s(5);
  auto p = s.save(dir.str());
  REQUIRE_MESSAGE(p.ok(), p.error().message);
  CHECK(*p == (dir.path / "step-5").string());
  // Only the checkpoint, no temporaries; four files in it.
  CHECK(entries(dir.path) == std::vector<std::string>{"step-5"});
  CHECK(entries(*p) == std::vector<std::string>{"manifest.json", "model.safetensors",
                                                "optimizer.safetensors", "versions.safetensors"});

  auto c = load_checkpoint(*p);
  REQUIRE_MESSAGE(c.ok(), c.error().message);
  CHECK(c->path == *p);
  REQUIRE(c->model.size() == 2);
  CHECK(c->model[0].name == "layers.0.wte");
  CHECK(c->model[0].shape == std::vector<int64_t>{3, 4});
  CHECK(same_bits(c->model[0].f32, s.w));
  CHECK(same_bits(c->model[1].f32, s.b));
  REQUIRE(c->optimizer.size() == 3);
  CHECK(same_bits(find_tensor(c->optimizer, "layers.0.wte.adam_m")->f32, s.m));
  CHECK(same_bits(find_tensor(c->optimizer, "layers.0.wte.adam_v")->f32, s.v));
  CHECK(find_tensor(c->optimizer, "layers.0.wte.count")->i32 == s.counts);
  REQUIRE(c->versions.size() == 1);
  CHECK(c->versions[0].name == "layers.0.wte@v7");
  CHECK(same_bits(c->versions[0].f32, s.w7));

  const CheckpointInfo& i = c->info;
  CHECK(i.format_version == kCheckpointFormatVersion);
  CHECK_FALSE(i.final);
  CHECK(i.step == 5);
  CHECK(i.data_position == 1005);
  CHECK(i.rng_state == s.info.rng_state);
  CHECK(i.mode == "2bw");
  CHECK(i.stages == 2);
  CHECK(i.partition == std::vector<int>{3, 3});
  CHECK(i.model.width == 64);
  CHECK(i.model.heads == 8);
  CHECK(i.model.init_seed == 77);
  CHECK(i.model.arch == Arch::gpt);
  CHECK(i.optimizer.lr == 3e-4f);
  CHECK(i.optimizer.beta2 == 0.999f);
  CHECK(i.optimizer.kind == "adamw");
  CHECK(i.extra == s.info.extra);

  // The manifest is plain JSON; its checksums are those of the files (computed independently).
  json m = json::parse(slurp(fs::path(*p) / "manifest.json"));
  CHECK(m["format"] == "actorpipe-checkpoint");
  CHECK(m["format_version"] == 1);
  CHECK(m["kind"] == "periodic");
  CHECK(m["step"] == 5);
  CHECK(m["optimizer"]["lr"].get<double>() == 0.0003);  // shortest decimal of the float
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "versions.safetensors"}) {
    const std::string bytes = slurp(fs::path(*p) / f);
    CHECK(m["files"][f]["bytes"] == bytes.size());
    CHECK(m["files"][f]["crc32"] == fmt::format("{:08x}", crc32_reference(bytes)));
  }
  // The tensor files are ordinary safetensors with a little metadata.
  auto meta = read_safetensors_metadata((fs::path(*p) / "model.safetensors").string());
  REQUIRE(meta.ok());
  CHECK(meta->at("step") == "5");

  // read_checkpoint_info reads the manifest alone; re-saving loaded contents gives equal files.
  auto info = read_checkpoint_info(*p);
  REQUIRE(info.ok());
  CHECK(info->step == 5);
  // ... as checkpoint_info_from_string does with its text
  auto text = checkpoint_info_from_string(slurp(fs::path(*p) / "manifest.json"));
  REQUIRE_MESSAGE(text.ok(), text.error().message);
  CHECK(text->step == 5);
  CHECK(text->data_position == 1005);
  CHECK(text->rng_state == s.info.rng_state);
  CHECK(text->partition == std::vector<int>{3, 3});
  CHECK(text->optimizer.lr == 3e-4f);
  CHECK(text->extra == s.info.extra);
  auto cut = checkpoint_info_from_string("{\"format\": ", "sent.json");
  REQUIRE_FALSE(cut.ok());
  CHECK(contains(cut.error().message, "sent.json: not valid JSON"));
  TempDir other;
  auto again = save_checkpoint(other.str(), *c);
  REQUIRE(again.ok());
  for (const char* f :
       {"model.safetensors", "optimizer.safetensors", "versions.safetensors", "manifest.json"}) {
    CHECK_MESSAGE(slurp(fs::path(*again) / f) == slurp(fs::path(*p) / f), f);
  }
}

TEST_CASE("final checkpoints and resolving the latest complete one") {
  TempDir dir;
  for (int64_t step : {1, 3, 2}) REQUIRE(Sample(step).save(dir.str()).ok());
  auto r = resolve_checkpoint(dir.str());
  REQUIRE(r.ok());
  CHECK(*r == (dir.path / "step-3").string());
  // A step-10 checkpoint is picked by number, not by name order ("step-10" < "step-3").
  REQUIRE(Sample(10).save(dir.str()).ok());
  CHECK(*resolve_checkpoint(dir.str()) == (dir.path / "step-10").string());

  // Simulated crashes: a temporary directory (any content), a checkpoint without its manifest,
  // one with a truncated file, one whose manifest is cut short. All are skipped.
  fs::create_directories(dir.path / "step-99.tmp-123-0");
  fs::copy(dir.path / "step-10", dir.path / "step-99.tmp-123-0", fs::copy_options::recursive);
  fs::create_directories(dir.path / "step-50");
  fs::copy(dir.path / "step-10" / "model.safetensors", dir.path / "step-50");
  copy_as_step(dir.path, 10, 60);
  fs::resize_file(dir.path / "step-60" / "optimizer.safetensors", 20);
  fs::copy(dir.path / "step-10", dir.path / "step-70", fs::copy_options::recursive);
  {
    const std::string manifest = slurp(dir.path / "step-70" / "manifest.json");
    dump(dir.path / "step-70" / "manifest.json", manifest.substr(0, manifest.size() / 2));
  }
  dump(dir.path / "notes.txt", "not a checkpoint");
  CHECK(*resolve_checkpoint(dir.str()) == (dir.path / "step-10").string());
  // load_checkpoint(<dir>) loads the same one.
  auto c = load_checkpoint(dir.str());
  REQUIRE(c.ok());
  CHECK(c->info.step == 10);
  // ... and names each newer one it passed over, newest first, with the reason
  REQUIRE(c->skipped.size() == 3);
  CHECK(contains(c->skipped[0], "step-70/manifest.json: not valid JSON"));
  CHECK(contains(c->skipped[1], "step-60/optimizer.safetensors: size is 20 bytes"));
  CHECK(contains(c->skipped[2], "step-50: manifest.json is missing"));
  // a newer checkpoint whose sizes look right but whose bytes do not (a checksum mismatch)
  // is passed over too, where resolve_checkpoint (sizes only) would take it
  copy_as_step(dir.path, 10, 80);
  {
    std::string model = slurp(dir.path / "step-80" / "model.safetensors");
    model[model.size() - 2] ^= 0x01;
    dump(dir.path / "step-80" / "model.safetensors", model);
  }
  CHECK(*resolve_checkpoint(dir.str()) == (dir.path / "step-80").string());
  auto past_crc = load_checkpoint(dir.str());
  REQUIRE(past_crc.ok());
  CHECK(past_crc->info.step == 10);
  REQUIRE(past_crc->skipped.size() == 4);
  CHECK(contains(past_crc->skipped[0], "step-80/model.safetensors: checksum mismatch"));
  fs::remove_all(dir.path / "step-80");
  // a checkpoint named directly is never replaced by another
  CHECK(load_checkpoint((dir.path / "step-10").string())->skipped.empty());

  // The final checkpoint wins over a periodic one of the same step.
  Sample fin(10);
  fin.info.final = true;
  auto f = fin.save(dir.str());
  REQUIRE(f.ok());
  CHECK(*f == (dir.path / "final").string());
  CHECK(*resolve_checkpoint(dir.str()) == *f);
  auto fc = load_checkpoint((dir.path / "final").string());
  REQUIRE(fc.ok());
  CHECK(fc->info.final);
  // ... but a later periodic checkpoint (a resumed run that went on) wins over it.
  REQUIRE(Sample(11).save(dir.str()).ok());
  CHECK(*resolve_checkpoint(dir.str()) == (dir.path / "step-11").string());

  // Naming a damaged checkpoint directly is an error naming the problem.
  CHECK(contains(load_error((dir.path / "step-50").string()),
                 "step-50: manifest.json is missing (an incomplete checkpoint)"));
  CHECK(contains(load_error((dir.path / "step-60").string()),
                 "step-60/optimizer.safetensors: size is 20 bytes but manifest.json records"));
  CHECK(contains(load_error((dir.path / "step-70").string()),
                 "step-70/manifest.json: not valid JSON"));
  CHECK(contains(load_error((dir.path / "nothing").string()), "nothing: does not exist"));
}

TEST_CASE("a directory without a complete checkpoint is refused, listing what was skipped") {
  TempDir dir;
  auto e = resolve_checkpoint(dir.str());
  REQUIRE_FALSE(e.ok());
  CHECK(contains(e.error().message, "no complete checkpoint"));
  REQUIRE(Sample(4).save(dir.str()).ok());
  fs::remove(dir.path / "step-4" / "versions.safetensors");
  auto r = resolve_checkpoint(dir.str());
  REQUIRE_FALSE(r.ok());
  CHECK(contains(r.error().message, "skipped"));
  CHECK(contains(r.error().message, "step-4/versions.safetensors: listed in manifest.json but"));
}

TEST_CASE("damaged checkpoints are refused naming the file and the mismatch") {
  TempDir dir;
  auto p = Sample(7).save(dir.str());
  REQUIRE(p.ok());
  const fs::path ck(*p);
  const std::string good_manifest = slurp(ck / "manifest.json");
  const std::string good_model = slurp(ck / "model.safetensors");

  SUBCASE("one flipped bit in a tensor: checksum mismatch") {
    std::string bad = good_model;
    bad[bad.size() - 3] ^= 0x10;
    dump(ck / "model.safetensors", bad);
    const std::string m = load_error(*p);
    CHECK(contains(m, (ck / "model.safetensors").string() + ": checksum mismatch: CRC-32 is " +
                          fmt::format("{:08x}", crc32_reference(bad))));
    CHECK(contains(m, fmt::format("manifest.json records {:08x}", crc32_reference(good_model))));
  }
  SUBCASE("truncated tensor file") {
    fs::resize_file(ck / "versions.safetensors", 10);
    CHECK(contains(load_error(*p), "versions.safetensors: size is 10 bytes"));
  }
  SUBCASE("missing tensor file") {
    fs::remove(ck / "optimizer.safetensors");
    CHECK(contains(load_error(*p),
                   "optimizer.safetensors: listed in manifest.json but No such file"));
  }
  SUBCASE("manifest does not parse") {
    dump(ck / "manifest.json", "{\"format\": ");
    CHECK(contains(load_error(*p), "manifest.json: not valid JSON"));
  }
  SUBCASE("manifest with a number beyond a double (it used to abort the reader)") {
    std::string bad = good_manifest;
    const std::string step = "\"step\": 7";
    REQUIRE(bad.find(step) != std::string::npos);
    bad.replace(bad.find(step), step.size(), "\"step\": 1e400");
    dump(ck / "manifest.json", bad);
    const std::string m = load_error(*p);
    CHECK(contains(m, "manifest.json: not valid JSON"));
    CHECK(contains(m, "number overflow parsing '1e400'"));
  }
  SUBCASE("manifest of another format version") {
    json m = json::parse(good_manifest);
    m["format_version"] = 2;
    dump(ck / "manifest.json", m.dump());
    CHECK(contains(load_error(*p),
                   "manifest.json: format_version 2 is not supported (this build "
                   "reads version 1)"));
  }
  SUBCASE("manifest of something else") {
    json m = json::parse(good_manifest);
    m["format"] = "other";
    dump(ck / "manifest.json", m.dump());
    CHECK(contains(load_error(*p), "manifest.json: \"format\" is \"other\""));
  }
  SUBCASE("manifest without a field") {
    json m = json::parse(good_manifest);
    m.erase("data_position");
    dump(ck / "manifest.json", m.dump());
    CHECK(contains(load_error(*p), "manifest.json: field \"data_position\" is missing"));
  }
  SUBCASE("manifest that no longer lists a file") {
    json m = json::parse(good_manifest);
    m["files"].erase("versions.safetensors");
    dump(ck / "manifest.json", m.dump());
    CHECK(contains(load_error(*p), "\"files\" does not list versions.safetensors"));
  }
  SUBCASE("manifest with a bad model option") {
    json m = json::parse(good_manifest);
    m["model"]["width"] = "wide";
    dump(ck / "manifest.json", m.dump());
    CHECK(contains(load_error(*p), "model.width = \"wide\": expected an integer"));
    m["model"].erase("width");
    m["model"]["widht"] = 3;
    dump(ck / "manifest.json", m.dump());
    CHECK(contains(load_error(*p), "unknown key model.widht"));
  }
  SUBCASE("a tensor file replaced by another valid one of the same size") {
    // Same size, valid safetensors, different values: only the checksum catches it.
    Sample other(7);
    other.w[3] = 99.0f;
    TempDir d2;
    auto q = other.save(d2.str());
    REQUIRE(q.ok());
    fs::copy_file(fs::path(*q) / "model.safetensors", ck / "model.safetensors",
                  fs::copy_options::overwrite_existing);
    CHECK(contains(load_error(*p), "model.safetensors: checksum mismatch"));
  }
}

TEST_CASE("re-saving a step replaces it whole, a failed save leaves nothing behind") {
  TempDir dir;
  REQUIRE(Sample(3).save(dir.str()).ok());
  Sample newer(3);
  newer.w[0] = -5.0f;
  newer.info.extra["run"] = "second";
  REQUIRE(newer.save(dir.str()).ok());
  CHECK(entries(dir.path) == std::vector<std::string>{"step-3"});
  auto c = load_checkpoint(dir.str());
  REQUIRE(c.ok());
  CHECK(c->model[0].f32[0] == -5.0f);
  CHECK(c->info.extra.at("run") == "second");

  Sample bad(4);
  CheckpointRefs refs = bad.refs();
  refs.model.push_back(refs.model[0]);  // duplicate name
  auto r = save_checkpoint(dir.str(), bad.info, refs);
  REQUIRE_FALSE(r.ok());
  CHECK(contains(r.error().message, "duplicate tensor name \"layers.0.wte\""));
  CHECK(entries(dir.path) == std::vector<std::string>{"step-3"});  // no step-4, no temporary

  Sample nan(5);
  nan.info.optimizer.lr = std::numeric_limits<float>::quiet_NaN();
  auto n = nan.save(dir.str());
  REQUIRE_FALSE(n.ok());
  CHECK(contains(n.error().message, "optimizer.lr = nan is not finite"));
  CHECK(entries(dir.path) == std::vector<std::string>{"step-3"});
}

TEST_CASE("a save removes the temporaries of writers that died, and only those") {
  TempDir dir;
  // a process that has exited and been reaped: its pid names no process any more
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  const std::string dead = fmt::format("step-7.tmp-{}-0", child);
  const std::string mine = fmt::format("step-8.tmp-{}-3", ::getpid());
  for (const std::string& name : {dead, mine, std::string("notes.tmp-x-1")}) {
    fs::create_directories(dir.path / name);
    std::ofstream(dir.path / name / "model.safetensors") << "partial";
  }
  REQUIRE(Sample(3).save(dir.str()).ok());
  // the dead writer's half checkpoint is gone; a live writer's (this process) and a name that
  // is not a temporary stay
  CHECK(entries(dir.path) == std::vector<std::string>{"notes.tmp-x-1", "step-3", mine});
  CHECK(internal::remove_stale_temporaries(dir.str()).empty());
  CHECK(load_checkpoint(dir.str()).ok());
}

TEST_CASE("check_compatible names every mismatched model key with both values") {
  CheckpointInfo info;
  info.model.width = 128;
  info.model.heads = 4;
  ModelOptions same = info.model;
  same.init_seed = 999;  // the seed does not change the parameters' shapes
  CHECK(check_compatible(info, same).ok());
  ModelOptions other = info.model;
  other.width = 256;
  other.arch = Arch::bert;
  other.tied = false;
  auto s = check_compatible(info, other);
  REQUIRE_FALSE(s.ok());
  CHECK(contains(s.error().message, "model.width: the checkpoint has 128, the config has 256"));
  CHECK(contains(s.error().message,
                 "model.arch: the checkpoint has \"gpt\", the config has \"bert\""));
  CHECK(contains(s.error().message, "model.tied: the checkpoint has true, the config has false"));
  CHECK_FALSE(contains(s.error().message, "heads"));
  for (auto mutate : std::vector<void (*)(ModelOptions&)>{
           [](ModelOptions& m) { m.vocab_size += 1; }, [](ModelOptions& m) { m.context += 1; },
           [](ModelOptions& m) { m.depth += 1; }, [](ModelOptions& m) { m.heads = 8; },
           [](ModelOptions& m) { m.segments += 1; }}) {
    ModelOptions m = info.model;
    mutate(m);
    CHECK_FALSE(check_compatible(info, m).ok());
  }
}

namespace {

// An all-gather among `n` threads standing for the processes of a job.
class ThreadGather {
 public:
  explicit ThreadGather(int n) : n_(n), texts_(static_cast<size_t>(n)) {}
  Expected<std::vector<std::string>> gather(int rank, std::string mine) {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t round = round_;
    texts_[static_cast<size_t>(rank)] = std::move(mine);
    if (++arrived_ == n_) {
      result_ = texts_;
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return round_ != round; });
    }
    return result_;
  }

 private:
  int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t round_ = 0;
  std::vector<std::string> texts_;
  std::vector<std::string> result_;
};

// Per stage: a model tensor, two optimizer tensors (one I32) and a version.
struct StageSample {
  std::vector<float> w, m;
  std::vector<int32_t> n;
  std::vector<float> old;
  explicit StageSample(int s) {
    for (int i = 0; i < 5 + s; ++i) w.push_back(0.25f * static_cast<float>(i + 10 * s));
    m = w;
    for (float& x : m) x *= -3.0f;
    n = {s, 7 * s + 1};
    old = w;
    old[0] = static_cast<float>(s) + 0.5f;
  }
  CheckpointRefs refs(int s) const {
    const std::string p = fmt::format("layers.{}.w", s);
    return CheckpointRefs{{{p, {static_cast<int64_t>(w.size())}, w.data()}},
                          {{p + ".adam_m", {static_cast<int64_t>(m.size())}, m.data()},
                           {.name = p + ".count", .shape = {2}, .i32 = n.data()}},
                          {{p + "@v3", {static_cast<int64_t>(old.size())}, old.data()}},
                          {}};
  }
};

}  // namespace

TEST_CASE(
    "a checkpoint written by several processes is the one-process checkpoint, byte for byte") {
  const std::vector<StageSample> stages = {StageSample(0), StageSample(1), StageSample(2),
                                           StageSample(3)};
  CheckpointRefs all;
  for (int s = 0; s < 4; ++s) {
    const CheckpointRefs r = stages[static_cast<size_t>(s)].refs(s);
    all.model.insert(all.model.end(), r.model.begin(), r.model.end());
    all.optimizer.insert(all.optimizer.end(), r.optimizer.begin(), r.optimizer.end());
    all.versions.insert(all.versions.end(), r.versions.begin(), r.versions.end());
  }
  Sample sample(4);
  TempDir one, shared;
  auto single = save_checkpoint(one.path.string(), sample.info, all);
  REQUIRE_MESSAGE(single.ok(), single.error().message);
  // 3 processes; rank 1 holds stages 0 and 2 (placement [1, 0, 1, 2])
  const std::vector<std::vector<int>> held = {{1}, {0, 2}, {3}};
  ThreadGather g(3);
  std::vector<Expected<std::string>> results(3, make_error("not run"));
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      std::vector<StageRefs> mine;
      for (int s : held[static_cast<size_t>(r)])
        mine.push_back({s, stages[static_cast<size_t>(s)].refs(s)});
      results[static_cast<size_t>(r)] =
          save_checkpoint_shared(shared.path.string(), sample.info, mine, r,
                                 [&, r](std::string text) { return g.gather(r, std::move(text)); });
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 3; ++r) {
    REQUIRE_MESSAGE(results[static_cast<size_t>(r)].ok(),
                    results[static_cast<size_t>(r)].error().message);
    CHECK(*results[static_cast<size_t>(r)] == (shared.path / "step-4").string());
  }
  for (const char* f : {kModelFile, kOptimizerFile, kVersionsFile, kManifestFile})
    CHECK_MESSAGE(slurp(one.path / "step-4" / f) == slurp(shared.path / "step-4" / f), f);
  CHECK(load_checkpoint((shared.path / "step-4").string()).ok());
  CHECK(entries(shared.path) == std::vector<std::string>{"step-4"});
}

TEST_CASE("a checkpoint of several processes fails everywhere when one process fails") {
  const StageSample s0(0), s1(1);
  Sample sample(2);
  ThreadGather g(2);
  std::vector<Expected<std::string>> results(2, make_error("not run"));
  std::vector<std::thread> ranks;
  TempDir dir;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      // rank 1 offers stage 0 too: no process holds stage 1
      std::vector<StageRefs> mine = {{0, (r == 0 ? s0 : s1).refs(0)}};
      results[static_cast<size_t>(r)] =
          save_checkpoint_shared(dir.path.string(), sample.info, mine, r,
                                 [&, r](std::string text) { return g.gather(r, std::move(text)); });
    });
  }
  for (auto& t : ranks) t.join();
  for (const auto& res : results) {
    REQUIRE_FALSE(res.ok());
    CHECK(contains(res.error().message, "stage 0 offered by two processes"));
  }
  // rank 0 cannot create the directory: every rank hears why, nothing is left behind
  ThreadGather g2(2);
  const std::string bad = (dir.path / "file").string();
  dump(bad, "not a directory");
  for (int r = 0; r < 2; ++r) {
    ranks[static_cast<size_t>(r)] = std::thread([&, r] {
      std::vector<StageRefs> mine = {{r, (r == 0 ? s0 : s1).refs(r)}};
      results[static_cast<size_t>(r)] = save_checkpoint_shared(
          bad + "/sub", sample.info, mine, r,
          [&, r](std::string text) { return g2.gather(r, std::move(text)); });
    });
  }
  for (auto& t : ranks) t.join();
  for (const auto& res : results) {
    REQUIRE_FALSE(res.ok());
    CHECK(contains(res.error().message, "rank 0: "));
    CHECK(contains(res.error().message, "cannot create checkpoint directory"));
  }
}
