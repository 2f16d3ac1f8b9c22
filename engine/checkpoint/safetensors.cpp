// Safetensors: the Hugging Face tensor file format (8-byte little-endian header length, a JSON
// header of name -> {dtype, shape, data_offsets} plus "__metadata__", then the raw data).
#include "engine/checkpoint/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/internal/file_io.hpp"

namespace actorpipe {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swapping");

namespace {

using internal::Fd;
using header_json = nlohmann::json;  // a header as read; ordered_json writes one
using ordered_json = nlohmann::ordered_json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the limit of the Python implementation
constexpr const char* kMetadataKey = "__metadata__";

struct Entry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
  int64_t numel = 0;
};

struct Header {
  std::vector<Entry> entries;  // sorted by data offset
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + header length
  uint64_t data_size = 0;   // bytes after the header
};

std::size_t dtype_size(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32") return 4;
  return 0;
}

bool is_known_safetensors_dtype(const std::string& d) {
  static const std::set<std::string> known = {"BOOL", "U8",  "I8",  "F8_E5M2", "F8_E4M3",
                                              "I16",  "U16", "F16", "BF16",    "I32",
                                              "U32",  "F32", "F64", "I64",     "U64"};
  return known.count(d) != 0;
}

// Parses an array of non-negative integers; on failure returns false and leaves why in `why`.
bool parse_uint_array(const header_json& j, std::vector<uint64_t>& out, std::string& why) {
  if (!j.is_array()) {
    why = fmt::format("is {} instead of an array of non-negative integers", j.dump());
    return false;
  }
  for (const auto& x : j) {
    if (!x.is_number_unsigned()) {
      why = fmt::format("{} contains {}, not a non-negative integer", j.dump(), x.dump());
      return false;
    }
    out.push_back(x.get<uint64_t>());
  }
  return true;
}

// The header length in the first 8 bytes of a file or buffer of `total` bytes, checked
// against the limit and what follows it.
Expected<uint64_t> header_length(const unsigned char* len_bytes, uint64_t total,
                                 const std::string& path) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n == 0) return make_error("{}: header length is 0; a header needs at least \"{{}}\"", path);
  if (n > kMaxHeaderBytes) {
    return make_error("{}: header length {} exceeds the limit of {} bytes", path, n,
                      kMaxHeaderBytes);
  }
  if (n > total - 8) {
    return make_error(
        "{}: header length {} exceeds the {} bytes after the length field "
        "(truncated file?)",
        path, n, total - 8);
  }
  return n;
}

// Parses and validates the JSON header `text` of a file or buffer of `file_size` bytes.
Expected<Header> parse_header(const std::string& text, uint64_t file_size, const std::string& path);

Expected<Header> read_header(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return make_error("{}: cannot stat: {}", path, internal::errno_text());
  if (!S_ISREG(st.st_mode)) return make_error("{}: not a regular file", path);
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    return make_error("{}: file is {} bytes, too short for the 8-byte header length", path,
                      file_size);
  }
  unsigned char len_bytes[8];
  if (auto s = internal::read_exact(fd, len_bytes, 8, 0, path); !s) return s.error();
  auto n = header_length(len_bytes, file_size, path);
  if (!n) return n.error();
  std::string text(static_cast<std::size_t>(*n), '\0');
  if (auto s = internal::read_exact(fd, text.data(), text.size(), 8, path); !s) return s.error();
  return parse_header(text, file_size, path);
}

Expected<Header> parse_header(const std::string& text, uint64_t file_size,
                              const std::string& path) {
  const uint64_t n = text.size();
  if (auto nul = text.find('\0'); nul != std::string::npos) {
    return make_error("{}: header contains a NUL byte at offset {} (padding must be spaces)", path,
                      nul);
  }
  if (text[0] != '{') {
    return make_error("{}: header does not start with '{{' (first byte {:#04x})", path,
                      static_cast<unsigned char>(text[0]));
  }

  // Parse, refusing duplicate keys in any object (nlohmann would keep the last one silently).
  std::vector<std::set<std::string>> seen;
  std::string duplicate;
  header_json::parser_callback_t cb = [&](int /*depth*/, header_json::parse_event_t ev,
                                          header_json& parsed) {
    if (ev == header_json::parse_event_t::object_start) {
      seen.emplace_back();
    } else if (ev == header_json::parse_event_t::object_end) {
      seen.pop_back();
    } else if (ev == header_json::parse_event_t::key && duplicate.empty()) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!seen.back().insert(k).second) duplicate = k;
    }
    return true;
  };
  header_json h = header_json::parse(text, cb, /*allow_exceptions=*/false);
  if (h.is_discarded()) {
    // Re-parse with exceptions to get the position of the syntax error.
    std::string why = "invalid JSON";
    try {
      [[maybe_unused]] header_json again = header_json::parse(text);
    } catch (const header_json::exception& e) {  // parse_error, or out_of_range: a number too large
      why = e.what();
    }
    return make_error("{}: header is not valid JSON: {}", path, why);
  }
  if (!duplicate.empty()) return make_error("{}: header has duplicate key \"{}\"", path, duplicate);
  if (!h.is_object()) return make_error("{}: header is not a JSON object", path);

  Header out;
  out.data_start = 8 + n;
  out.data_size = file_size - out.data_start;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const header_json& v = it.value();
    if (name == kMetadataKey) {
      if (!v.is_object()) {
        return make_error("{}: \"{}\" is {}, not an object of strings", path, kMetadataKey,
                          v.type_name());
      }
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m->is_string()) {
          return make_error("{}: metadata key \"{}\" has value {}, only strings are allowed", path,
                            m.key(), m->dump());
        }
        out.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) {
      return make_error(
          "{}: tensor \"{}\": entry is {}, not an object with dtype, shape and "
          "data_offsets",
          path, name, v.type_name());
    }
    for (auto f = v.begin(); f != v.end(); ++f) {
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets") {
        return make_error(
            "{}: tensor \"{}\": unknown field \"{}\" (allowed: dtype, shape, "
            "data_offsets)",
            path, name, f.key());
      }
    }
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      if (!v.contains(field)) {
        return make_error("{}: tensor \"{}\": missing field \"{}\"", path, name, field);
      }
    }
    Entry e;
    e.name = name;
    if (!v["dtype"].is_string()) {
      return make_error("{}: tensor \"{}\": dtype is {}, not a string", path, name,
                        v["dtype"].dump());
    }
    e.dtype = v["dtype"].get<std::string>();
    if (dtype_size(e.dtype) == 0) {
      return make_error(
          "{}: tensor \"{}\": dtype \"{}\" is {} (allowed: F32, I32)", path, name, e.dtype,
          is_known_safetensors_dtype(e.dtype) ? "not supported" : "not a safetensors dtype");
    }
    std::vector<uint64_t> dims;
    std::string why;
    if (!parse_uint_array(v["shape"], dims, why)) {
      return make_error("{}: tensor \"{}\": shape {}", path, name, why);
    }
    // Multiply with an overflow guard; the span check below then bounds numel by the file size.
    constexpr uint64_t kMaxElems = uint64_t{1} << 60;
    const bool has_zero = std::find(dims.begin(), dims.end(), 0) != dims.end();
    uint64_t numel = has_zero ? 0 : 1;
    for (uint64_t d : dims) {
      if (d > kMaxElems || (!has_zero && numel > kMaxElems / d)) {
        return make_error("{}: tensor \"{}\": shape {} has more than 2^60 elements", path, name,
                          v["shape"].dump());
      }
      if (!has_zero) numel *= d;
      e.shape.push_back(static_cast<int64_t>(d));
    }
    e.numel = static_cast<int64_t>(numel);
    std::vector<uint64_t> offs;
    if (!parse_uint_array(v["data_offsets"], offs, why)) {
      return make_error("{}: tensor \"{}\": data_offsets {}", path, name, why);
    }
    if (offs.size() != 2) {
      return make_error("{}: tensor \"{}\": data_offsets {} must have 2 entries [begin, end]", path,
                        name, v["data_offsets"].dump());
    }
    e.begin = offs[0];
    e.end = offs[1];
    if (e.begin > e.end) {
      return make_error("{}: tensor \"{}\": data_offsets [{}, {}] has begin > end", path, name,
                        e.begin, e.end);
    }
    if (e.end > out.data_size) {
      return make_error(
          "{}: tensor \"{}\": data_offsets [{}, {}] end beyond the {} data bytes "
          "(truncated file?)",
          path, name, e.begin, e.end, out.data_size);
    }
    const uint64_t want = numel * dtype_size(e.dtype);
    if (e.end - e.begin != want) {
      return make_error(
          "{}: tensor \"{}\": shape {} of {} needs {} bytes but data_offsets "
          "[{}, {}] span {}",
          path, name, v["shape"].dump(), e.dtype, want, e.begin, e.end, e.end - e.begin);
    }
    out.entries.push_back(std::move(e));
  }
  std::sort(out.entries.begin(), out.entries.end(), [](const Entry& a, const Entry& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
  uint64_t pos = 0;
  for (const auto& e : out.entries) {
    if (e.begin != pos) {
      return make_error(
          "{}: tensor \"{}\": data_offsets [{}, {}] {} at byte {}; tensor data "
          "must be contiguous",
          path, e.name, e.begin, e.end,
          e.begin < pos ? "overlaps the previous tensor" : "leaves a gap", pos);
    }
    pos = e.end;
  }
  if (pos != out.data_size) {
    return make_error(
        "{}: tensors cover {} data bytes but the file has {} after the header "
        "(trailing garbage?)",
        path, pos, out.data_size);
  }
  return out;
}

// The header's tensors in data order, each one's bytes filled by read(dst, bytes, offset from
// the start of the file or buffer): a read from a file, or a copy out of memory.
template <class Read>
Expected<std::vector<NamedTensor>> tensors_of(Header& header, Read&& read) {
  std::vector<NamedTensor> out;
  out.reserve(header.entries.size());
  for (auto& e : header.entries) {
    NamedTensor t;
    t.name = std::move(e.name);
    t.dtype = std::move(e.dtype);
    t.shape = std::move(e.shape);
    void* dst = nullptr;
    if (t.dtype == "F32") {
      t.f32.resize(static_cast<std::size_t>(e.numel));
      dst = t.f32.data();
    } else {
      t.i32.resize(static_cast<std::size_t>(e.numel));
      dst = t.i32.data();
    }
    if (e.end > e.begin) {
      if (Status ok = read(dst, e.end - e.begin, header.data_start + e.begin); !ok)
        return ok.error();
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

int64_t NamedTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const NamedTensor* find_tensor(const std::vector<NamedTensor>& tensors, const std::string& name) {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Expected<std::vector<NamedTensor>> read_safetensors(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return make_error("{}: cannot open: {}", path, internal::errno_text());
  auto header = read_header(fd.get(), path);
  if (!header) return header.error();
  return tensors_of(*header, [&](void* dst, uint64_t bytes, uint64_t offset) -> Status {
    return internal::read_exact(fd.get(), dst, bytes, offset, path);
  });
}

Expected<SafetensorsBuffer> decode_safetensors(std::span<const std::byte> bytes,
                                               const std::string& what) {
  const auto total = static_cast<uint64_t>(bytes.size());
  if (total < 8) {
    return make_error("{}: {} bytes, too short for the 8-byte header length", what, total);
  }
  auto n = header_length(reinterpret_cast<const unsigned char*>(bytes.data()), total, what);
  if (!n) return n.error();
  const std::string text(reinterpret_cast<const char*>(bytes.data()) + 8,
                         static_cast<std::size_t>(*n));
  auto header = parse_header(text, total, what);
  if (!header) return header.error();
  auto tensors = tensors_of(*header, [&](void* dst, uint64_t count, uint64_t offset) -> Status {
    std::memcpy(dst, bytes.data() + offset, count);
    return {};
  });
  if (!tensors) return tensors.error();
  SafetensorsBuffer out;
  out.metadata = std::move(header->metadata);
  out.tensors = std::move(*tensors);
  return out;
}

Expected<std::vector<std::byte>> encode_safetensors(
    const std::vector<TensorRef>& tensors, const std::map<std::string, std::string>& metadata,
    const std::string& what) {
  auto layout = safetensors_layout(what, tensors, metadata);
  if (!layout) return layout.error();
  std::vector<std::byte> out(static_cast<std::size_t>(layout->file_size));
  std::memcpy(out.data(), layout->head.data(), layout->head.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const void* src = tensors[i].i32 ? static_cast<const void*>(tensors[i].i32)
                                     : static_cast<const void*>(tensors[i].data);
    if (layout->bytes[i] == 0) continue;
    std::memcpy(out.data() + layout->data_start + layout->offsets[i], src, layout->bytes[i]);
  }
  return out;
}

Expected<std::map<std::string, std::string>> read_safetensors_metadata(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return make_error("{}: cannot open: {}", path, internal::errno_text());
  auto header = read_header(fd.get(), path);
  if (!header) return header.error();
  return std::move(header->metadata);
}

Expected<SafetensorsLayout> safetensors_layout(const std::string& path,
                                               const std::vector<TensorRef>& tensors,
                                               const std::map<std::string, std::string>& metadata) {
  ordered_json h = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json m = ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h[kMetadataKey] = std::move(m);
  }
  std::set<std::string> names;
  SafetensorsLayout out;
  out.bytes.resize(tensors.size());
  uint64_t offset = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef& t = tensors[i];
    if (t.name.empty()) return make_error("{}: tensor #{} has an empty name", path, i);
    if (t.name.rfind("__", 0) == 0) {
      return make_error("{}: tensor name \"{}\" starts with \"__\", which is reserved", path,
                        t.name);
    }
    if (!names.insert(t.name).second) {
      return make_error("{}: duplicate tensor name \"{}\"", path, t.name);
    }
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) {
        return make_error("{}: tensor \"{}\" has negative dimension {} in its shape", path, t.name,
                          d);
      }
      numel *= static_cast<uint64_t>(d);
    }
    if (t.data && t.i32) {
      return make_error("{}: tensor \"{}\" sets both data (F32) and i32; set exactly one", path,
                        t.name);
    }
    if (!t.data && !t.i32 && numel != 0) {
      return make_error("{}: tensor \"{}\" has {} elements but no data pointer", path, t.name,
                        numel);
    }
    out.bytes[i] = numel * 4;
    out.offsets.push_back(offset);
    ordered_json e = ordered_json::object();
    e["dtype"] = t.i32 ? "I32" : "F32";
    e["shape"] = t.shape;
    e["data_offsets"] = {offset, offset + out.bytes[i]};
    h[t.name] = std::move(e);
    offset += out.bytes[i];
  }
  std::string header;
  try {
    header = h.dump();
  } catch (const ordered_json::type_error& e) {
    return make_error("{}: a tensor name or metadata string is not valid UTF-8: {}", path,
                      e.what());
  }
  // Pad with spaces so the data section starts 8-byte aligned, as the Python writer does.
  header.append((8 - header.size() % 8) % 8, ' ');
  out.head.resize(8);
  for (int i = 0; i < 8; ++i)
    out.head[static_cast<size_t>(i)] = static_cast<char>(header.size() >> (8 * i));
  out.head += header;
  out.data_start = out.head.size();
  out.file_size = out.data_start + offset;
  return out;
}

Status write_safetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  auto layout = safetensors_layout(path, tensors, metadata);
  if (!layout) return layout.error();
  const std::vector<uint64_t>& bytes = layout->bytes;
  const std::string tmp = internal::temp_sibling(path);
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.valid()) return make_error("{}: cannot create: {}", tmp, internal::errno_text());
  auto fail = [&](Error e) -> Status {
    fd = Fd();
    ::unlink(tmp.c_str());
    return e;
  };
  if (auto s = internal::write_all(fd.get(), layout->head.data(), layout->head.size(), tmp); !s) {
    return fail(s.error());
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const void* src = tensors[i].i32 ? static_cast<const void*>(tensors[i].i32)
                                     : static_cast<const void*>(tensors[i].data);
    if (bytes[i] == 0) continue;
    if (auto s = internal::write_all(fd.get(), src, bytes[i], tmp); !s) return fail(s.error());
  }
  if (::fsync(fd.get()) != 0) {
    return fail(make_error("{}: fsync failed: {}", tmp, internal::errno_text()));
  }
  if (auto s = fd.close(tmp); !s) return fail(s.error());
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return fail(
        make_error("{}: cannot rename {} into place: {}", path, tmp, internal::errno_text()));
  }
  return internal::fsync_dir(internal::parent_dir(path));
}

}  // namespace actorpipe
