// Fuzzes the safetensors reader (read_safetensors, read_safetensors_metadata: the header length,
// the JSON header, dtypes, shapes, offsets, the data) with the input as a file's bytes. A file
// either reads or is an error naming it; what reads has as many elements as its shapes say,
// the same metadata from both readers, and the layout write_safetensors would give it spans
// exactly the data bytes of the input. The same bytes as a buffer from a peer (what a layer
// move across processes receives: decode_safetensors) read exactly as the file does, or fail
// alike naming the peer.
#include "engine/checkpoint/safetensors.hpp"

#include <cstring>
#include <numeric>
#include <span>

#include "tests/fuzz/fuzz_support.hpp"

using namespace actorpipe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile file;
  file.assign(data, size);
  auto tensors = read_safetensors(file.path());
  auto metadata = read_safetensors_metadata(file.path());
  auto buffer = decode_safetensors(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size), "<peer>");
  FUZZ_CHECK(buffer.ok() == tensors.ok(), "the file {} but the buffer {}",
             tensors.ok() ? "reads" : "does not read", buffer.ok() ? "reads" : "does not");
  if (!buffer) {
    FUZZ_CHECK(buffer.error().message.rfind("<peer>: ", 0) == 0,
               "the buffer's error does not name its source: {}", buffer.error().message);
  }
  if (!tensors) {
    FUZZ_CHECK(tensors.error().message.find(file.path()) != std::string::npos,
               "the error does not name the file: {}", tensors.error().message);
    return 0;
  }
  FUZZ_CHECK(metadata.ok(), "the tensors read but the metadata does not: {}",
             metadata.error().message);
  uint64_t bytes = 0;
  for (const NamedTensor& t : *tensors) {
    const size_t n = t.dtype == "F32" ? t.f32.size() : t.i32.size();
    FUZZ_CHECK(t.dtype == "F32" || t.dtype == "I32", "tensor {} has dtype {}", t.name, t.dtype);
    FUZZ_CHECK(static_cast<int64_t>(n) == t.numel(), "tensor {} holds {} elements for {}", t.name,
               n, t.numel());
    bytes += 4 * n;
  }
  FUZZ_CHECK(buffer->metadata == *metadata, "the buffer's metadata differs from the file's");
  FUZZ_CHECK(buffer->tensors.size() == tensors->size(), "the buffer holds {} tensors, the file {}",
             buffer->tensors.size(), tensors->size());
  for (size_t i = 0; i < tensors->size(); ++i) {
    const NamedTensor& a = (*tensors)[i];
    const NamedTensor& b = buffer->tensors[i];
    FUZZ_CHECK(
        a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.i32 == b.i32 &&
            a.f32.size() == b.f32.size() &&
            (a.f32.empty() || std::memcmp(a.f32.data(), b.f32.data(), 4 * a.f32.size()) == 0),
        "tensor {} differs between the file and the buffer", a.name);
  }
  std::vector<TensorRef> refs;
  for (const NamedTensor& t : *tensors) {
    refs.push_back(TensorRef{t.name, t.shape, t.dtype == "F32" ? t.f32.data() : nullptr,
                             t.dtype == "I32" ? t.i32.data() : nullptr});
  }
  auto layout = safetensors_layout("<fuzz>", refs, *metadata);
  if (layout) {
    FUZZ_CHECK(layout->file_size - layout->data_start == bytes,
               "the layout spans {} data bytes, the tensors hold {}",
               layout->file_size - layout->data_start, bytes);
  }
  return 0;
}
