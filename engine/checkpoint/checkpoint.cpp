// Checkpoint: a directory <dir>/step-<N>/ (or <dir>/final/) of three safetensors files and a
// checksummed JSON manifest, written under a temporary name and renamed into place whole.
#include "engine/checkpoint/checkpoint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "engine/config/option_table.hpp"
#include "engine/internal/file_io.hpp"

namespace actorpipe {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using internal::OptKind;
using internal::OptValue;

constexpr const char* kFormatName = "actorpipe-checkpoint";
const char* const kDataFiles[] = {kModelFile, kOptimizerFile, kVersionsFile};

std::string join_path(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  return a.back() == '/' ? a + b : a + "/" + b;
}

// ---- options <-> JSON, through the option table -------------------------------------------

json option_to_json(OptKind kind, const OptValue& v) {
  switch (kind) {
    case OptKind::integer:
      return std::get<int64_t>(v);
    case OptKind::uinteger:
      return static_cast<uint64_t>(std::get<int64_t>(v));
    case OptKind::real32: {
      // The shortest decimal of the float, so the manifest shows 0.001 rather than 0.0010000000474.
      const std::string text = fmt::format("{}", static_cast<float>(std::get<double>(v)));
      double d = 0;
      std::from_chars(text.data(), text.data() + text.size(), d);
      return d;
    }
    case OptKind::real64:
      return std::get<double>(v);
    case OptKind::boolean:
      return std::get<bool>(v);
    case OptKind::string:
    case OptKind::arch:
      return std::get<std::string>(v);
    case OptKind::int_list:
    case OptKind::layer_set:
      // partition = "auto"; recompute = "none" | "all" | "auto"
      if (const auto* s = std::get_if<std::string>(&v)) return *s;
      return std::get<std::vector<int64_t>>(v);
  }
  return nullptr;
}

json section_to_json(const Config& c, const std::string& section) {
  json out = json::object();
  for (const auto& spec : internal::option_table()) {
    if (spec.section == section) out[spec.key] = option_to_json(spec.kind, spec.get(c));
  }
  return out;
}

Expected<OptValue> option_from_json(const internal::OptionSpec& spec, const json& j) {
  auto wrong = [&](std::string_view expected) {
    return make_error("{} = {}: expected {}", spec.name(), j.dump(), expected);
  };
  switch (spec.kind) {
    case OptKind::integer:
      if (!j.is_number_integer()) return wrong("an integer");
      if (j.is_number_unsigned() ? j.get<uint64_t>() > INT32_MAX
                                 : (j.get<int64_t>() < INT32_MIN || j.get<int64_t>() > INT32_MAX)) {
        return wrong("a 32-bit integer");
      }
      return OptValue{j.get<int64_t>()};
    case OptKind::uinteger:
      if (!j.is_number_unsigned() || j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        return wrong("an integer in 0 .. 2^63-1");
      }
      return OptValue{static_cast<int64_t>(j.get<uint64_t>())};
    case OptKind::real32:
    case OptKind::real64:
      if (!j.is_number()) return wrong("a number");
      return OptValue{j.get<double>()};
    case OptKind::boolean:
      if (!j.is_boolean()) return wrong("true or false");
      return OptValue{j.get<bool>()};
    case OptKind::string:
      if (!j.is_string()) return wrong("a string");
      return OptValue{j.get<std::string>()};
    case OptKind::arch:
      if (!j.is_string() || (j.get<std::string>() != "gpt" && j.get<std::string>() != "bert")) {
        return wrong("\"gpt\" or \"bert\"");
      }
      return OptValue{j.get<std::string>()};
    case OptKind::layer_set:
      if (j.is_string()) {
        const std::string w = j.get<std::string>();
        if (w != "none" && w != "all" && w != "auto") {
          return wrong("\"none\", \"all\", \"auto\" or an array of integers");
        }
        return OptValue{w};
      }
      [[fallthrough]];
    case OptKind::int_list: {
      if (!j.is_array()) return wrong("an array of integers");
      std::vector<int64_t> xs;
      for (const auto& x : j) {
        if (!x.is_number_integer()) return wrong("an array of integers");
        xs.push_back(x.get<int64_t>());
      }
      return OptValue{std::move(xs)};
    }
  }
  return wrong("?");
}

// Reads section `section` of `j` into `c`; keys absent from the manifest keep their defaults.
Status section_from_json(Config& c, const std::string& section, const json& j) {
  if (!j.is_object()) return make_error("\"{}\" is not an object", section);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const auto* spec = internal::find_option(section, it.key());
    if (!spec) return make_error("unknown key {}.{}", section, it.key());
    auto v = option_from_json(*spec, it.value());
    if (!v) return v.error();
    spec->set(c, *v);
  }
  return {};
}

// ---- the manifest ------------------------------------------------------------------------

struct FileRecord {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

std::string manifest_text(const CheckpointInfo& info,
                          const std::map<std::string, FileRecord>& files) {
  Config c;
  c.model = info.model;
  c.optimizer = info.optimizer;
  json j = json::object();
  j["format"] = kFormatName;
  j["format_version"] = info.format_version;
  j["kind"] = info.final ? "final" : "periodic";
  j["step"] = info.step;
  j["data_position"] = info.data_position;
  j["rng_state"] = info.rng_state;
  j["mode"] = info.mode;
  j["stages"] = info.stages;
  j["partition"] = info.partition;
  j["model"] = section_to_json(c, "model");
  j["optimizer"] = section_to_json(c, "optimizer");
  json f = json::object();
  for (const auto& [name, rec] : files) {
    f[name] = {{"bytes", rec.bytes}, {"crc32", fmt::format("{:08x}", rec.crc32)}};
  }
  j["files"] = std::move(f);
  j["extra"] = info.extra;
  return j.dump(2) + "\n";
}

struct Manifest {
  CheckpointInfo info;
  std::map<std::string, FileRecord> files;
};

// The manifest's text; errors start with `path`.
Expected<Manifest> parse_manifest_text(std::string_view text, const std::string& path) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    std::string why = "invalid JSON";
    try {
      [[maybe_unused]] json again = json::parse(text);
    } catch (const json::exception& e) {  // parse_error, or out_of_range: a number too large
      why = e.what();
    }
    return make_error("{}: not valid JSON (truncated or corrupt manifest?): {}", path, why);
  }
  auto bad = [&](std::string_view what) { return make_error("{}: {}", path, what); };
  if (!j.is_object()) return bad("not a JSON object");
  if (!j.contains("format") || j["format"] != kFormatName) {
    return make_error("{}: \"format\" is {}, expected \"{}\"", path,
                      j.contains("format") ? j["format"].dump() : "missing", kFormatName);
  }
  if (!j.contains("format_version") || !j["format_version"].is_number_integer()) {
    return bad("\"format_version\" is missing or not an integer");
  }
  Manifest m;
  m.info.format_version = j["format_version"].get<int>();
  if (m.info.format_version != kCheckpointFormatVersion) {
    return make_error("{}: format_version {} is not supported (this build reads version {})", path,
                      m.info.format_version, kCheckpointFormatVersion);
  }
  for (const char* key : {"kind", "step", "data_position", "rng_state", "mode", "stages",
                          "partition", "model", "optimizer", "files", "extra"}) {
    if (!j.contains(key)) return make_error("{}: field \"{}\" is missing", path, key);
  }
  try {
    const std::string kind = j["kind"].get<std::string>();
    if (kind != "final" && kind != "periodic") {
      return make_error("{}: \"kind\" is \"{}\" (allowed: periodic, final)", path, kind);
    }
    m.info.final = kind == "final";
    if (!j["step"].is_number_integer() || j["step"].get<int64_t>() < 0) {
      return make_error("{}: \"step\" is {}, expected an integer >= 0", path, j["step"].dump());
    }
    m.info.step = j["step"].get<int64_t>();
    if (!j["data_position"].is_number_unsigned()) {
      return make_error("{}: \"data_position\" is {}, expected an integer >= 0", path,
                        j["data_position"].dump());
    }
    m.info.data_position = j["data_position"].get<uint64_t>();
    for (const auto& w : j["rng_state"]) {
      if (!w.is_number_unsigned()) {
        return make_error("{}: \"rng_state\" holds {}, expected integers >= 0", path, w.dump());
      }
    }
    m.info.rng_state = j["rng_state"].get<std::vector<uint64_t>>();
    m.info.mode = j["mode"].get<std::string>();
    m.info.stages = j["stages"].get<int>();
    m.info.partition = j["partition"].get<std::vector<int>>();
    m.info.extra = j["extra"].get<std::map<std::string, std::string>>();
  } catch (const json::exception& e) {
    return make_error("{}: a field has the wrong type: {}", path, e.what());
  }
  Config c;
  for (const char* section : {"model", "optimizer"}) {
    if (auto s = section_from_json(c, section, j[section]); !s) {
      return make_error("{}: {}", path, s.error().message);
    }
  }
  m.info.model = c.model;
  m.info.optimizer = c.optimizer;
  const json& files = j["files"];
  if (!files.is_object()) return bad("\"files\" is not an object");
  for (const char* name : kDataFiles) {
    if (!files.contains(name)) return make_error("{}: \"files\" does not list {}", path, name);
  }
  for (auto it = files.begin(); it != files.end(); ++it) {
    const json& r = it.value();
    if (!r.is_object() || !r.contains("bytes") || !r["bytes"].is_number_unsigned() ||
        !r.contains("crc32") || !r["crc32"].is_string()) {
      return make_error(
          "{}: files.\"{}\" is {}, expected {{\"bytes\": n, \"crc32\": \"8 hex "
          "digits\"}}",
          path, it.key(), r.dump());
    }
    const std::string hex = r["crc32"].get<std::string>();
    char* end = nullptr;
    const unsigned long crc = std::strtoul(hex.c_str(), &end, 16);
    if (hex.size() != 8 || end != hex.c_str() + hex.size()) {
      return make_error("{}: files.\"{}\".crc32 is \"{}\", expected 8 hex digits", path, it.key(),
                        hex);
    }
    if (it.key().find('/') != std::string::npos || it.key() == "." || it.key() == "..") {
      return make_error("{}: files lists \"{}\", which is not a plain file name", path, it.key());
    }
    m.files[it.key()] = FileRecord{r["bytes"].get<uint64_t>(), static_cast<uint32_t>(crc)};
  }
  return m;
}

Expected<Manifest> parse_manifest(const std::string& path) {
  auto text = internal::read_file(path);
  if (!text) return text.error();
  return parse_manifest_text(*text, path);
}

// Existence and size of every listed file (cheap); with `checksums`, their CRC-32 too.
Status check_files(const std::string& dir, const Manifest& m, bool checksums) {
  for (const auto& [name, rec] : m.files) {
    const std::string p = join_path(dir, name);
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) {
      return make_error("{}: listed in {} but {}", p, kManifestFile, internal::errno_text());
    }
    if (static_cast<uint64_t>(st.st_size) != rec.bytes) {
      return make_error("{}: size is {} bytes but {} records {} (truncated or replaced file)", p,
                        st.st_size, kManifestFile, rec.bytes);
    }
    if (checksums) {
      auto crc = internal::crc32_file(p);
      if (!crc) return crc.error();
      if (*crc != rec.crc32) {
        return make_error(
            "{}: checksum mismatch: CRC-32 is {:08x} but {} records {:08x} "
            "(corrupt file)",
            p, *crc, kManifestFile, rec.crc32);
      }
    }
  }
  return {};
}

bool parse_step_name(const std::string& name, int64_t& step) {
  if (name.rfind("step-", 0) != 0 || name.size() == 5 || name.size() > 5 + 18) return false;
  int64_t v = 0;
  for (std::size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    v = v * 10 + (name[i] - '0');
  }
  step = v;
  return true;
}

std::string base_name(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  auto slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

std::vector<std::string> checkpoints_in(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int64_t step = 0;
    if ((name == "final" || parse_step_name(name, step)) && it->is_directory(ec))
      out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

uint64_t tensor_bytes(const CheckpointRefs& refs) {
  uint64_t total = 0;
  for (const auto* list : {&refs.model, &refs.optimizer, &refs.versions}) {
    for (const TensorRef& t : *list) {
      uint64_t n = 4;  // F32 and I32
      for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
      total += n;
    }
  }
  return total;
}

std::string checkpoint_name(const CheckpointInfo& info) {
  return info.final ? "final" : fmt::format("step-{}", info.step);
}

std::vector<TensorRef> tensor_refs(const std::vector<NamedTensor>& tensors) {
  std::vector<TensorRef> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) {
    TensorRef r{t.name, t.shape};
    if (t.dtype == "I32") {
      r.i32 = t.i32.data();
    } else {
      r.data = t.f32.data();
    }
    out.push_back(std::move(r));
  }
  return out;
}

namespace {

// The safetensors metadata of every file of a checkpoint.
std::map<std::string, std::string> file_metadata(const CheckpointInfo& info) {
  return {{"format", "pt"}, {"step", std::to_string(info.step)}};
}

// The first part of a save: checks `info`, creates `dir` and an empty temporary sibling of the
// checkpoint's directory; returns {target, tmp}.
Expected<std::pair<std::string, std::string>> prepare_checkpoint(const std::string& dir,
                                                                 const CheckpointInfo& info) {
  if (dir.empty()) return make_error("checkpoint directory is empty");
  if (info.step < 0) return make_error("checkpoint step {} is negative", info.step);
  if (info.format_version != kCheckpointFormatVersion) {
    return make_error("checkpoint format_version {} cannot be written (this build writes {})",
                      info.format_version, kCheckpointFormatVersion);
  }
  {
    Config c;
    c.model = info.model;
    c.optimizer = info.optimizer;
    for (const auto& spec : internal::option_table()) {
      if ((spec.section == "model" || spec.section == "optimizer") &&
          (spec.kind == OptKind::real32 || spec.kind == OptKind::real64) &&
          !std::isfinite(std::get<double>(spec.get(c)))) {
        return make_error("checkpoint {}: {} = {} is not finite; JSON cannot hold it", dir,
                          spec.name(), std::get<double>(spec.get(c)));
      }
    }
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return make_error("{}: cannot create checkpoint directory: {}", dir, ec.message());
  // what a writer killed mid-save left behind (never a complete checkpoint: those have no
  // temporary name)
  internal::remove_stale_temporaries(dir);
  std::string target = join_path(dir, checkpoint_name(info));
  std::string tmp = internal::temp_sibling(target);
  if (::mkdir(tmp.c_str(), 0755) != 0) {
    return make_error("{}: cannot create: {}", tmp, internal::errno_text());
  }
  return std::pair{std::move(target), std::move(tmp)};
}

// The last part of a save: the three files are in `tmp`; checksums them, writes the manifest
// (last: a directory with a manifest has all its files) and renames `tmp` to `target`.
Expected<std::string> commit_checkpoint(const std::string& dir, const CheckpointInfo& info,
                                        const std::string& tmp, const std::string& target) {
  auto fail = [&](Error e) -> Expected<std::string> {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    return e;
  };
  std::map<std::string, FileRecord> files;
  for (int i = 0; i < 3; ++i) {
    const std::string p = join_path(tmp, kDataFiles[i]);
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) {
      return fail(make_error("{}: cannot stat: {}", p, internal::errno_text()));
    }
    auto crc = internal::crc32_file(p);
    if (!crc) return fail(crc.error());
    files[kDataFiles[i]] = FileRecord{static_cast<uint64_t>(st.st_size), *crc};
  }
  if (auto s =
          internal::write_file_atomic(join_path(tmp, kManifestFile), manifest_text(info, files));
      !s) {
    return fail(s.error());
  }
  if (exists(target)) {
    // Swap atomically, then remove the old one (now under the temporary name).
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0) {
      return fail(make_error("{}: cannot swap in the new checkpoint {}: {}", target, tmp,
                             internal::errno_text()));
    }
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
  } else if (::rename(tmp.c_str(), target.c_str()) != 0) {
    return fail(
        make_error("{}: cannot rename {} into place: {}", target, tmp, internal::errno_text()));
  }
  if (auto s = internal::fsync_dir(dir); !s) return s.error();
  return target;
}

Status pwrite_all(int fd, const void* data, size_t n, uint64_t offset, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return make_error("{}: write failed at offset {}: {}", path, offset, internal::errno_text());
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return {};
}

// A text that stands for an error in the gathers of save_checkpoint_shared.
constexpr char kFailed = '!';

// The first error among the gathered texts ("rank r: ..."), if any.
std::optional<Error> first_failure(const std::vector<std::string>& texts) {
  for (size_t r = 0; r < texts.size(); ++r) {
    if (!texts[r].empty() && texts[r][0] == kFailed)
      return make_error("rank {}: {}", r, texts[r].substr(1));
  }
  return std::nullopt;
}

}  // namespace

Expected<std::string> save_checkpoint(const std::string& dir, const CheckpointInfo& info,
                                      const CheckpointRefs& tensors) {
  auto where = prepare_checkpoint(dir, info);
  if (!where) return where.error();
  const auto& [target, tmp] = *where;
  const std::vector<TensorRef>* parts[] = {&tensors.model, &tensors.optimizer, &tensors.versions};
  for (int i = 0; i < 3; ++i) {
    const std::string p = join_path(tmp, kDataFiles[i]);
    if (auto s = write_safetensors(p, *parts[i], file_metadata(info)); !s) {
      std::error_code ignored;
      fs::remove_all(tmp, ignored);
      return s.error();
    }
  }
  return commit_checkpoint(dir, info, tmp, target);
}

Expected<std::string> save_checkpoint_shared(const std::string& dir, const CheckpointInfo& info,
                                             const std::vector<StageRefs>& mine, int rank,
                                             const GatherTexts& gather) {
  // 1. everyone's tensor names and shapes, per stage: the files' layout
  json parts = json::array();
  for (const StageRefs& sr : mine) {
    json files = json::array();
    for (const std::vector<TensorRef>* list :
         {&sr.refs.model, &sr.refs.optimizer, &sr.refs.versions}) {
      json l = json::array();
      for (const TensorRef& t : *list) l.push_back({t.name, t.shape, t.i32 != nullptr});
      files.push_back(std::move(l));
    }
    parts.push_back({{"stage", sr.stage}, {"files", std::move(files)}});
  }
  auto names = gather(parts.dump());
  if (!names) return names.error();
  static const float kSomeF32 = 0.0f;  // layouts read no data: any non-null pointer will do
  static const int32_t kSomeI32 = 0;
  std::map<int, std::array<std::vector<TensorRef>, 3>> stages;
  try {
    for (const std::string& text : *names) {
      for (const json& part : json::parse(text)) {
        const int stage = part.at("stage").get<int>();
        if (stages.count(stage) != 0)
          return make_error("checkpoint {}: stage {} offered by two processes", dir, stage);
        auto& files = stages[stage];
        for (int i = 0; i < 3; ++i) {
          for (const json& t : part.at("files").at(static_cast<size_t>(i))) {
            TensorRef ref;
            ref.name = t.at(0).get<std::string>();
            ref.shape = t.at(1).get<std::vector<int64_t>>();
            if (t.at(2).get<bool>()) {
              ref.i32 = &kSomeI32;
            } else {
              ref.data = &kSomeF32;
            }
            files[static_cast<size_t>(i)].push_back(std::move(ref));
          }
        }
      }
    }
  } catch (const json::exception& e) {
    return make_error("checkpoint {}: a process described its tensors unreadably: {}", dir,
                      e.what());
  }
  int expect = 0;
  for (const auto& [stage, files] : stages) {
    if (stage != expect++)
      return make_error("checkpoint {}: no process holds stage {}", dir, expect - 1);
  }
  std::array<std::vector<TensorRef>, 3> all;
  std::map<int, std::array<size_t, 3>> first;  // stage -> index of its first tensor per file
  for (const auto& [stage, files] : stages) {
    for (size_t i = 0; i < 3; ++i) {
      first[stage][i] = all[i].size();
      all[i].insert(all[i].end(), files[i].begin(), files[i].end());
    }
  }

  // 2. rank 0 makes the temporary directory
  std::string prepared;
  std::string target;
  if (rank == 0) {
    auto where = prepare_checkpoint(dir, info);
    prepared = where ? where->second : kFailed + where.error().message;
    if (where) target = where->first;
  }
  auto tmps = gather(prepared);
  if (!tmps) return tmps.error();
  if (auto f = first_failure(*tmps)) return *f;
  const std::string tmp = (*tmps)[0];

  // 3. every process writes its tensors (and the identical header) into the three files
  std::string written;
  for (size_t i = 0; i < 3 && written.empty(); ++i) {
    const std::string path = join_path(tmp, kDataFiles[i]);
    auto layout = safetensors_layout(path, all[i], file_metadata(info));
    if (!layout) {
      written = kFailed + layout.error().message;
      break;
    }
    internal::Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    auto step = [&]() -> Status {
      if (!fd.valid()) return make_error("{}: cannot open: {}", path, internal::errno_text());
      if (::ftruncate(fd.get(), static_cast<off_t>(layout->file_size)) != 0)
        return make_error("{}: cannot size to {} bytes: {}", path, layout->file_size,
                          internal::errno_text());
      if (auto s = pwrite_all(fd.get(), layout->head.data(), layout->head.size(), 0, path); !s)
        return s;
      for (const StageRefs& sr : mine) {
        const std::vector<TensorRef>* lists[] = {&sr.refs.model, &sr.refs.optimizer,
                                                 &sr.refs.versions};
        for (size_t k = 0; k < lists[i]->size(); ++k) {
          const size_t idx = first[sr.stage][i] + k;
          const TensorRef& t = (*lists[i])[k];
          const void* src = t.i32 ? static_cast<const void*>(t.i32) : t.data;
          if (layout->bytes[idx] == 0) continue;
          if (auto s = pwrite_all(fd.get(), src, layout->bytes[idx],
                                  layout->data_start + layout->offsets[idx], path);
              !s)
            return s;
        }
      }
      if (::fsync(fd.get()) != 0)
        return make_error("{}: fsync failed: {}", path, internal::errno_text());
      return fd.close(path);
    };
    if (Status s = step(); !s) written = kFailed + s.error().message;
  }
  auto done = gather(written);
  if (!done) return done.error();
  if (auto f = first_failure(*done)) {
    if (rank == 0) {
      std::error_code ignored;
      fs::remove_all(tmp, ignored);
    }
    return *f;
  }

  // 4. rank 0 checksums, writes the manifest and renames
  std::string committed;
  if (rank == 0) {
    auto path = commit_checkpoint(dir, info, tmp, target);
    committed = path ? *path : kFailed + path.error().message;
  }
  auto paths = gather(committed);
  if (!paths) return paths.error();
  if (auto f = first_failure(*paths)) return *f;
  return (*paths)[0];
}

Expected<std::string> save_checkpoint(const std::string& dir, const CheckpointContents& c) {
  return save_checkpoint(
      dir, c.info,
      CheckpointRefs{tensor_refs(c.model), tensor_refs(c.optimizer), tensor_refs(c.versions), {}});
}

Expected<CheckpointInfo> read_checkpoint_info(const std::string& checkpoint_dir) {
  auto m = parse_manifest(join_path(checkpoint_dir, kManifestFile));
  if (!m) return m.error();
  return std::move(m->info);
}

Expected<CheckpointInfo> checkpoint_info_from_string(std::string_view manifest,
                                                     const std::string& name) {
  auto m = parse_manifest_text(manifest, name);
  if (!m) return m.error();
  return std::move(m->info);
}

Expected<std::string> resolve_checkpoint(const std::string& path) {
  if (!exists(path)) return make_error("checkpoint {}: does not exist", path);
  if (!is_dir(path)) return make_error("checkpoint {}: not a directory", path);
  if (exists(join_path(path, kManifestFile))) return path;
  int64_t step = 0;
  const std::string base = base_name(path);
  if (base == "final" || parse_step_name(base, step)) {
    return make_error("checkpoint {}: {} is missing (an incomplete checkpoint)", path,
                      kManifestFile);
  }
  std::error_code ec;
  fs::directory_iterator it(path, ec);
  if (ec) return make_error("checkpoint {}: cannot list: {}", path, ec.message());
  std::string best;
  int64_t best_step = -1;
  bool best_final = false;
  std::vector<std::string> skipped;
  for (const auto& entry : it) {
    const std::string name = entry.path().filename().string();
    const bool is_final = name == "final";
    if (!is_final && !parse_step_name(name, step)) continue;  // temporaries and other files
    const std::string dir = entry.path().string();
    if (!is_dir(dir)) continue;
    auto m = parse_manifest(join_path(dir, kManifestFile));
    if (!m) {
      skipped.push_back(m.error().message);
      continue;
    }
    if (!is_final && m->info.step != step) {
      skipped.push_back(fmt::format("{}: manifest records step {}", dir, m->info.step));
      continue;
    }
    if (auto s = check_files(dir, *m, /*checksums=*/false); !s) {
      skipped.push_back(s.error().message);
      continue;
    }
    const int64_t s = m->info.step;
    if (s > best_step || (s == best_step && is_final && !best_final) ||
        (s == best_step && is_final == best_final && name < base_name(best))) {
      best = dir;
      best_step = s;
      best_final = is_final;
    }
  }
  if (best.empty()) {
    std::string msg =
        fmt::format("checkpoint {}: no complete checkpoint (step-<N> or final) in it", path);
    for (const auto& s : skipped) msg += "\n  skipped " + s;
    return Error{msg};
  }
  return best;
}

namespace {

// One checkpoint directory, every file verified.
Expected<CheckpointContents> load_one(const std::string& dir) {
  if (!exists(join_path(dir, kManifestFile))) {
    return make_error("checkpoint {}: {} is missing (an incomplete checkpoint)", dir,
                      kManifestFile);
  }
  auto m = parse_manifest(join_path(dir, kManifestFile));
  if (!m) return m.error();
  if (auto s = check_files(dir, *m, /*checksums=*/true); !s) return s.error();
  CheckpointContents c;
  c.info = std::move(m->info);
  c.path = dir;
  std::vector<NamedTensor>* parts[] = {&c.model, &c.optimizer, &c.versions};
  for (int i = 0; i < 3; ++i) {
    auto t = read_safetensors(join_path(dir, kDataFiles[i]));
    if (!t) return t.error();
    *parts[i] = std::move(*t);
  }
  return c;
}

// The checkpoints of a directory of checkpoints, newest first: by step (from the name; final's
// from its manifest, or newest of all when that is unreadable), final before step-<N> at a tie.
std::vector<std::string> checkpoints_newest_first(const std::string& path) {
  struct Candidate {
    std::string dir;
    int64_t step;
    bool final;
  };
  std::vector<Candidate> found;
  for (const std::string& name : checkpoints_in(path)) {
    const std::string dir = join_path(path, name);
    int64_t step = 0;
    if (name == "final") {
      auto m = parse_manifest(join_path(dir, kManifestFile));
      step = m ? m->info.step : std::numeric_limits<int64_t>::max();
    } else {
      parse_step_name(name, step);
    }
    found.push_back({dir, step, name == "final"});
  }
  std::sort(found.begin(), found.end(), [](const Candidate& a, const Candidate& b) {
    if (a.step != b.step) return a.step > b.step;
    return a.final && !b.final;
  });
  std::vector<std::string> out;
  for (auto& c : found) out.push_back(std::move(c.dir));
  return out;
}

}  // namespace

Expected<CheckpointContents> load_checkpoint(const std::string& path) {
  if (!exists(path)) return make_error("checkpoint {}: does not exist", path);
  if (!is_dir(path)) return make_error("checkpoint {}: not a directory", path);
  int64_t step = 0;
  const std::string base = base_name(path);
  if (exists(join_path(path, kManifestFile)) || base == "final" || parse_step_name(base, step)) {
    auto dir = resolve_checkpoint(path);  // one checkpoint, named: no other is tried
    if (!dir) return dir.error();
    return load_one(*dir);
  }
  // a directory of checkpoints: the newest that loads; the newer ones that do not are reported
  std::vector<std::string> skipped;
  for (const std::string& dir : checkpoints_newest_first(path)) {
    auto c = load_one(dir);
    if (c) {
      c->skipped = std::move(skipped);
      return c;
    }
    skipped.push_back(c.error().message);  // names the file
  }
  std::string msg =
      fmt::format("checkpoint {}: no complete checkpoint (step-<N> or final) in it", path);
  for (const auto& s : skipped) msg += "\n  skipped " + s;
  return Error{msg};
}

Status check_compatible(const CheckpointInfo& info, const ModelOptions& model) {
  Config a, b;
  a.model = info.model;
  b.model = model;
  std::string msg;
  for (const char* key :
       {"arch", "vocab_size", "context", "width", "depth", "heads", "segments", "tied"}) {
    const auto* spec = internal::find_option("model", key);
    const OptValue va = spec->get(a), vb = spec->get(b);
    if (va != vb) {
      msg += fmt::format("{}model.{}: the checkpoint has {}, the config has {}",
                         msg.empty() ? "" : "\n", key, internal::to_toml_text(spec->kind, va),
                         internal::to_toml_text(spec->kind, vb));
    }
  }
  if (msg.empty()) return {};
  return Error{"checkpoint does not match the model:\n" + msg};
}

}  // namespace actorpipe
