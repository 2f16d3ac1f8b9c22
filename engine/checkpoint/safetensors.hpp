// Safetensors: the Hugging Face tensor file format (8-byte little-endian header length, a JSON
// header of name -> {dtype, shape, data_offsets} plus "__metadata__", then the raw data).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "engine/expected.hpp"

namespace actorpipe {

/// One tensor as read from a file. Exactly one of f32 / i32 holds the data, chosen by dtype.
struct NamedTensor {
  std::string name;
  std::string dtype;  // "F32" | "I32"
  std::vector<int64_t> shape;
  std::vector<float> f32;    // dtype == "F32": row-major data, product(shape) elements
  std::vector<int32_t> i32;  // dtype == "I32"
  /// Number of elements: the product of shape (1 for a scalar, shape {}).
  int64_t numel() const;
};

/// A tensor to write, viewing caller-owned memory. Set exactly one of data / i32:
/// TensorRef{"w", {2, 3}, ptr} writes F32; TensorRef{.name = "ids", .shape = {4}, .i32 = p}
/// writes I32. Both pointers may be null only for a tensor with zero elements (written as F32).
struct TensorRef {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;   // F32
  const int32_t* i32 = nullptr;  // I32
};

/// Reads every tensor of a safetensors file, in the order of their data offsets (for files
/// written by write_safetensors: the order they were given in). Validates the header length against
/// the file size, the JSON syntax, dtypes (F32 and I32 only), shapes against byte spans, that
/// offsets are in range, contiguous and cover the whole data section, and duplicate names.
/// Every error names the file and the problem.
Expected<std::vector<NamedTensor>> read_safetensors(const std::string& path);

/// Reads only the "__metadata__" string map of a safetensors file (empty if absent); the header
/// is validated as in read_safetensors, the data section is not read.
Expected<std::map<std::string, std::string>> read_safetensors_metadata(const std::string& path);

/// Writes tensors (in the given order, data contiguous) and string metadata. The file is written
/// to a temporary name in the same directory, fsynced, renamed over `path`, and the directory is
/// fsynced: a crash leaves either the old file or the complete new one. Refuses duplicate or
/// empty names, negative dimensions, a tensor with both or neither data pointer, and names
/// starting with "__".
Status write_safetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

/// Where every tensor of a safetensors file goes: the file's first bytes (the 8-byte header
/// length and the padded JSON header), then each tensor's data at data_start + offsets[i].
struct SafetensorsLayout {
  std::string head;               ///< header length and header, exactly as written
  std::vector<uint64_t> offsets;  ///< per tensor, from the start of the data section
  std::vector<uint64_t> bytes;    ///< per tensor
  uint64_t data_start = 0;        ///< head.size()
  uint64_t file_size = 0;
};

/// The layout write_safetensors gives `tensors` (only names, shapes and which pointer is set
/// matter; the data is not read) with `metadata`. Errors as write_safetensors's, naming `path`.
Expected<SafetensorsLayout> safetensors_layout(const std::string& path,
                                               const std::vector<TensorRef>& tensors,
                                               const std::map<std::string, std::string>& metadata);

/// The bytes of a safetensors file held in memory (what crosses processes when layers move).
struct SafetensorsBuffer {
  std::vector<NamedTensor> tensors;  ///< in the order of their data offsets
  std::map<std::string, std::string> metadata;
};

/// Exactly the bytes write_safetensors would write for `tensors` and `metadata`, in memory.
/// Errors as write_safetensors's, naming `what`.
Expected<std::vector<std::byte>> encode_safetensors(
    const std::vector<TensorRef>& tensors, const std::map<std::string, std::string>& metadata,
    const std::string& what);

/// Reads safetensors bytes from memory, validated exactly as read_safetensors validates a file
/// (header length and JSON, dtypes, shapes against spans, contiguous offsets covering the data);
/// errors name `what` (say, the peer the bytes came from).
Expected<SafetensorsBuffer> decode_safetensors(std::span<const std::byte> bytes,
                                               const std::string& what);

/// Returns the tensor called `name` in `tensors`, or nullptr.
const NamedTensor* find_tensor(const std::vector<NamedTensor>& tensors, const std::string& name);

}  // namespace actorpipe
