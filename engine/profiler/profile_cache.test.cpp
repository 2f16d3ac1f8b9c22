// Tests of the profile cache: a profile written and read back is the same profile, bit for bit;
// a file of another key (model, B, T, threads, optimizer, CPU), format or layer count, a
// malformed file and a bad time are ignored with the reason; the key names its file.
#include "engine/profiler/profile_cache.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/blas_core.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;

namespace {

Config tiny_gpt() {
  return testing::tiny_config("1f1b", 2, 2, testing::tiny_model(Arch::gpt, true, 1));
}

// A profile with times that print with many digits.
LayerProfile fake_profile(const ProfileKey& k, int layers) {
  LayerProfile p;
  p.threads = k.threads;
  p.B = k.B;
  p.T = k.T;
  p.reps = 3;
  p.tied = true;
  for (int i = 0; i < layers; ++i) {
    LayerTiming t;
    t.name = "layer " + std::to_string(i);
    t.forward = 1e-3 / 3.0 * (i + 1);
    t.backward = 2e-3 / 7.0 * (i + 1);
    t.backward_weight = 1e-4 / 9.0;
    t.update = 3.14159e-5;
    t.copy = 1e-6;
    t.predict = 2.5e-6;
    p.layers.push_back(t);
  }
  return p;
}

bool same(const LayerProfile& a, const LayerProfile& b) {
  if (a.threads != b.threads || a.B != b.B || a.T != b.T || a.reps != b.reps ||
      a.load_threads != b.load_threads || a.tied != b.tied || a.layers.size() != b.layers.size())
    return false;
  for (size_t i = 0; i < a.layers.size(); ++i) {
    const LayerTiming &x = a.layers[i], &y = b.layers[i];
    if (x.name != y.name || x.forward != y.forward || x.backward != y.backward ||
        x.backward_weight != y.backward_weight || x.update != y.update || x.copy != y.copy ||
        x.predict != y.predict)
      return false;
  }
  return true;
}

void overwrite(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("a cached profile reads back bit for bit under its key") {
  testing::TempDir dir;
  const ProfileKey key = profile_key(tiny_gpt());
  CHECK(key.B == testing::kB);
  CHECK(key.T == testing::kT);
  CHECK(key.threads == 1);
  CHECK(key.cpu == cpu_model());
  CHECK(key.file_name().rfind("layer-profile-", 0) == 0);
  const LayerProfile p = fake_profile(key, 4);

  auto none = read_cached_profile(dir.path.string(), key, 4);
  CHECK_FALSE(none.profile.has_value());
  CHECK(none.note == "no cached profile");

  auto written = write_cached_profile((dir.path / "sub").string(), key, p);
  REQUIRE_MESSAGE(written.ok(), (written.ok() ? "" : written.error().message));
  CHECK(*written == (dir.path / "sub" / key.file_name()).string());
  auto back = read_cached_profile((dir.path / "sub").string(), key, 4);
  REQUIRE_MESSAGE(back.profile.has_value(), back.note);
  CHECK(same(*back.profile, p));
  CHECK(back.path == *written);
}

TEST_CASE("a cached profile of another key, format or shape is ignored, with the reason") {
  testing::TempDir dir;
  const std::string d = dir.path.string();
  const ProfileKey key = profile_key(tiny_gpt());
  auto written = write_cached_profile(d, key, fake_profile(key, 4));
  REQUIRE(written.ok());
  const std::string good = slurp(*written);

  // every part of the key names another file; this key's file copied under another key's name
  // (a hash collision, a hand copy) is ignored
  auto other = [&](const char* what, auto change) {
    CAPTURE(what);
    ProfileKey k = key;
    change(k);
    CHECK(k.file_name() != key.file_name());
    CHECK(read_cached_profile(d, k, 4).note == "no cached profile");
    overwrite(d + "/" + k.file_name(), good);
    auto r = read_cached_profile(d, k, 4);
    CHECK_FALSE(r.profile.has_value());
    CHECK_MESSAGE(r.note.rfind("ignored: it was measured for {", 0) == 0, r.note);
  };
  other("width", [](ProfileKey& k) { k.model.width = 16; });
  other("arch", [](ProfileKey& k) { k.model.arch = Arch::bert; });
  other("B", [](ProfileKey& k) { k.B = 3; });
  other("T", [](ProfileKey& k) { k.T = 5; });
  other("threads", [](ProfileKey& k) { k.threads = 2; });
  other("optimizer", [](ProfileKey& k) { k.optimizer = "sgd"; });
  other("cpu", [](ProfileKey& k) { k.cpu = "another CPU"; });
  other("cores", [](ProfileKey& k) { k.cores += 1; });
  other("precision", [](ProfileKey& k) { k.precision = "bf16"; });
  other("blas", [](ProfileKey& k) { k.blas = k.blas == "Prescott" ? "SkylakeX" : "Prescott"; });
  // an fp32 key names no precision, and the OpenBLAS kernels its products ran on
  CHECK(key.text().find("precision") == std::string::npos);
  CHECK(key.blas == blas_core().name);
  CHECK(key.text().find("\"blas\":\"" + key.blas + "\"") != std::string::npos);
  // a bf16 key names no OpenBLAS kernels: none of its products runs on them
  Config bf16 = tiny_gpt();
  bf16.pipeline.precision = "bf16";
  CHECK(profile_key(bf16).blas.empty());
  CHECK(profile_key(bf16).text().find("blas") == std::string::npos);
  // the seed changes no time: same key
  ProfileKey seeded = key;
  seeded.model.init_seed = 99;
  CHECK(seeded.file_name() == key.file_name());

  // another layer count, a bad time, another format, malformed JSON: ignored
  auto ignored = [&](const std::string& text, int layers, const std::string& why) {
    overwrite(*written, text);
    auto r = read_cached_profile(d, key, layers);
    CHECK_FALSE(r.profile.has_value());
    CHECK_MESSAGE(r.note.find(why) != std::string::npos, r.note);
  };
  ignored(good, 5, "ignored: 4 layers, the model has 5");
  std::string negative = good;
  negative.replace(negative.find("\"update\":"), 10, "\"update\":-");
  ignored(negative, 4, "has a time of -3.14159e-05 s (expected finite and >= 0)");
  std::string other_version = good;
  other_version.replace(other_version.find("\"version\": 1"), 12, "\"version\": 2");
  ignored(other_version, 4, "ignored: not a actorpipe-layer-profile file of version 1");
  ignored(good.substr(0, good.size() / 2), 4, "ignored: not a JSON object");
  std::string no_layers = good;
  no_layers.replace(no_layers.find("\"layers\""), 8, "\"levels\"");
  ignored(no_layers, 4, "ignored: malformed");
  // and read back again once the good file is back
  overwrite(*written, good);
  CHECK(read_cached_profile(d, key, 4).profile.has_value());
}

TEST_CASE("the cache directory comes from ACTORPIPE_CACHE_DIR, XDG_CACHE_HOME or HOME") {
  // the variables as they were, put back at the end
  std::vector<std::pair<const char*, std::optional<std::string>>> saved;
  for (const char* name : {"ACTORPIPE_CACHE_DIR", "XDG_CACHE_HOME", "HOME"}) {
    const char* v = std::getenv(name);
    saved.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
    ::unsetenv(name);
  }
  ::setenv("ACTORPIPE_CACHE_DIR", "/a/b", 1);
  CHECK(default_profile_cache_dir() == "/a/b");
  ::unsetenv("ACTORPIPE_CACHE_DIR");
  ::setenv("XDG_CACHE_HOME", "/x/", 1);
  CHECK(default_profile_cache_dir() == "/x/actorpipe");
  ::unsetenv("XDG_CACHE_HOME");
  ::setenv("HOME", "/home/u", 1);
  CHECK(default_profile_cache_dir() == "/home/u/.cache/actorpipe");
  ::unsetenv("HOME");
  CHECK(default_profile_cache_dir().empty());
  for (const auto& [name, value] : saved)
    if (value) ::setenv(name, value->c_str(), 1);
}
