// Profile cache: a measured layer profile kept as a small JSON file per model and machine, keyed
// by what the times depend on; a file for another key, or one that does not read back, is ignored.
#include "engine/profiler/profile_cache.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/internal/file_io.hpp"
#include "kernels/blas_core.hpp"

namespace actorpipe {

namespace {

using json = nlohmann::ordered_json;

constexpr const char* kFormat = "actorpipe-layer-profile";
constexpr int kVersion = 1;

json key_json(const ProfileKey& k) {
  const ModelOptions& m = k.model;
  json j{{"arch", m.arch == Arch::gpt ? "gpt" : "bert"},
         {"vocab_size", m.vocab_size},
         {"context", m.context},
         {"width", m.width},
         {"depth", m.depth},
         {"heads", m.heads},
         {"segments", m.segments},
         {"tied", m.tied},
         {"optimizer", k.optimizer},
         {"B", k.B},
         {"T", k.T},
         {"threads", k.threads},
         {"cpu", k.cpu},
         {"cores", k.cores}};
  // fp32 profiles keep the key (and file name) they had before precisions existed, with the
  // OpenBLAS kernels added (2026-12-01: the trainers may switch them at their start, and a
  // profile measured on other kernels is another machine's)
  if (k.precision != "fp32") j["precision"] = k.precision;
  if (!k.blas.empty()) j["blas"] = k.blas;
  return j;
}

// FNV-1a, 64 bits: a stable file name for a key (a collision only costs a re-profile: the file
// holds the whole key and is compared by it).
std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

// The profile in `j`, checked: every field present and of its type, one layer per model layer,
// every time finite and >= 0.
Expected<LayerProfile> profile_from_json(const json& j, int num_layers) {
  LayerProfile p;
  try {
    p.threads = j.at("threads").get<int>();
    p.B = j.at("B").get<int>();
    p.T = j.at("T").get<int>();
    p.reps = j.at("reps").get<int>();
    p.load_threads = j.at("load_threads").get<int>();
    p.tied = j.at("tied").get<bool>();
    const json& layers = j.at("layers");
    if (!layers.is_array() || static_cast<int>(layers.size()) != num_layers)
      return make_error("{} layers, the model has {}", layers.is_array() ? layers.size() : 0,
                        num_layers);
    for (const json& l : layers) {
      LayerTiming t;
      t.name = l.at("name").get<std::string>();
      t.forward = l.at("forward").get<double>();
      t.backward = l.at("backward").get<double>();
      t.backward_weight = l.at("backward_weight").get<double>();
      t.update = l.at("update").get<double>();
      t.copy = l.at("copy").get<double>();
      t.predict = l.at("predict").get<double>();
      for (double x : {t.forward, t.backward, t.backward_weight, t.update, t.copy, t.predict}) {
        if (!std::isfinite(x) || x < 0)
          return make_error("layer \"{}\" has a time of {} s (expected finite and >= 0)", t.name,
                            x);
      }
      p.layers.push_back(std::move(t));
    }
  } catch (const json::exception& e) {
    return make_error("malformed: {}", e.what());
  }
  return p;
}

}  // namespace

std::string ProfileKey::text() const {
  return key_json(*this).dump();
}

std::string ProfileKey::file_name() const {
  return fmt::format("layer-profile-{:016x}.json", fnv1a(text()));
}

ProfileKey profile_key(const Config& config) {
  ProfileKey k;
  k.model = config.model;
  k.optimizer = config.optimizer.kind;
  k.B = config.pipeline.microbatch_size;
  k.T = config.pipeline.seq_len > 0 ? config.pipeline.seq_len : config.model.context;
  k.threads = config.pipeline.threads_per_stage;
  k.precision = config.pipeline.precision;
  k.cpu = cpu_model();
  if (k.precision == "fp32") k.blas = blas_core().name;
  k.cores = static_cast<int>(std::thread::hardware_concurrency());
  return k;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto b = line.find_first_not_of(" \t", colon + 1);
    if (b == std::string::npos) continue;
    return line.substr(b);
  }
  return "unknown";
}

std::string default_profile_cache_dir() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v != nullptr ? std::string(v) : std::string();
  };
  if (std::string d = env("ACTORPIPE_CACHE_DIR"); !d.empty()) return d;
  if (std::string d = env("XDG_CACHE_HOME"); !d.empty()) return join_path(d, "actorpipe");
  if (std::string d = env("HOME"); !d.empty()) return join_path(d, ".cache/actorpipe");
  return {};
}

CachedProfile read_cached_profile(const std::string& dir, const ProfileKey& key, int num_layers) {
  CachedProfile out;
  out.path = join_path(dir, key.file_name());
  std::error_code ec;
  if (dir.empty() || !std::filesystem::exists(out.path, ec)) {
    out.note = "no cached profile";
    return out;
  }
  auto text = internal::read_file(out.path);
  if (!text) {
    out.note = "ignored: " + text.error().message;
    return out;
  }
  const json j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    out.note = "ignored: not a JSON object";
    return out;
  }
  const auto format = j.find("format");
  const auto version = j.find("version");
  if (format == j.end() || *format != kFormat || version == j.end() || *version != kVersion) {
    out.note = fmt::format("ignored: not a {} file of version {}", kFormat, kVersion);
    return out;
  }
  if (!j.contains("key") || j["key"] != key_json(key)) {
    out.note = fmt::format("ignored: it was measured for {}, this run is {}",
                           j.contains("key") ? j["key"].dump() : "no key", key.text());
    return out;
  }
  auto p = profile_from_json(j, num_layers);
  if (!p) {
    out.note = "ignored: " + p.error().message;
    return out;
  }
  if (p->B != key.B || p->T != key.T || p->threads != key.threads) {
    out.note = fmt::format("ignored: its profile is of B = {}, T = {}, threads = {}", p->B, p->T,
                           p->threads);
    return out;
  }
  out.profile = std::move(*p);
  return out;
}

Expected<std::string> write_cached_profile(const std::string& dir, const ProfileKey& key,
                                           const LayerProfile& p) {
  if (dir.empty()) return make_error("profile cache: no directory");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error("profile cache {}: cannot create: {}", dir, ec.message());
  json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["key"] = key_json(key);
  j["threads"] = p.threads;
  j["B"] = p.B;
  j["T"] = p.T;
  j["reps"] = p.reps;
  j["load_threads"] = p.load_threads;
  j["tied"] = p.tied;
  json layers = json::array();
  for (const LayerTiming& t : p.layers)
    layers.push_back({{"name", t.name},
                      {"forward", t.forward},
                      {"backward", t.backward},
                      {"backward_weight", t.backward_weight},
                      {"update", t.update},
                      {"copy", t.copy},
                      {"predict", t.predict}});
  j["layers"] = std::move(layers);
  const std::string path = join_path(dir, key.file_name());
  if (Status ok = internal::write_file_atomic(path, j.dump(1) + "\n"); !ok)
    return make_error("profile cache: {}", ok.error().message);
  return path;
}

}  // namespace actorpipe
