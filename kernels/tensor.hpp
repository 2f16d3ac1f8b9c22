// Tensor: a shape, a dtype, a device and a view into shared storage.
// Views never copy; `contiguous` storage is the only layout (strides are implied by shape).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/aligned_vector.hpp"

namespace actorpipe {

enum class DType : uint8_t { f32, i32 };
enum class Device : uint8_t { cpu, cuda };

/// Bytes per element of `t`.
size_t dtype_size(DType t);
std::string to_string(DType t);
std::string to_string(Device d);

class BackendMemory;  // kernels/backend_memory.hpp

/// Owned memory shared by the tensors that view it: host memory, or a BackendMemory's (a
/// device's, for tensors that stay on the device between stages).
class Storage {
 public:
  static constexpr size_t kHugePage = actorpipe::kHugePage;
  /// Host memory: a buffer of `bytes` bytes from allocate_host (kernels/aligned_vector.hpp):
  /// 64-byte aligned; from kHugePage bytes on, a whole number of 2 MiB pages, 2 MiB aligned and
  /// advised as transparent huge pages. `device` must be cpu.
  Storage(size_t bytes, Device device);
  /// `bytes` (rounded up to whole floats) of `memory`, zero-filled, released there when the
  /// storage goes: `memory` must outlive it (a lasting_memory()).
  Storage(BackendMemory& memory, size_t bytes);
  /// `bytes` at `data`, lent by another owner (memory a process on this host shares, say):
  /// host memory that host code reads and writes in place; `give_back(data)` runs when the
  /// storage goes, instead of a free. `give_back` must not throw.
  Storage(void* data, size_t bytes, std::function<void(void*)> give_back);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  /// The BackendMemory the bytes are in; nullptr for plain host memory.
  BackendMemory* memory() const { return memory_; }
  /// Whether host code may read and write the bytes directly.
  bool host_readable() const;

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::cpu;
  BackendMemory* memory_ = nullptr;
  std::function<void(void*)> give_back_;  // lent memory: handed back, not freed
};

/// Up to 4 dimensions, row-major, contiguous.
class Tensor {
 public:
  static constexpr int kMaxDims = 4;
  Tensor() = default;
  /// Allocates zero-filled storage for `shape`.
  static Tensor zeros(std::vector<int64_t> shape, DType dtype = DType::f32,
                      Device device = Device::cpu);
  /// Zero-filled storage for `shape` in `memory` (which must outlive it).
  static Tensor zeros(std::vector<int64_t> shape, DType dtype, BackendMemory& memory);
  /// A view of `numel(shape)` elements at element offset `offset` of `storage`.
  Tensor(std::shared_ptr<Storage> storage, size_t offset, std::vector<int64_t> shape, DType dtype);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu; }
  /// The BackendMemory holding the elements; nullptr for plain host memory (and undefined).
  BackendMemory* memory() const { return storage_ ? storage_->memory() : nullptr; }
  /// Whether host code may read the elements (f32() then points to them): true for host memory
  /// and an undefined tensor, false for a device's. Use host_copy() to read the others.
  int dim() const { return ndim_; }
  int64_t size(int i) const { return shape_[static_cast<size_t>(i)]; }
  std::vector<int64_t> shape() const { return {shape_.begin(), shape_.begin() + ndim_}; }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  size_t offset() const { return offset_; }

  float* f32();
  const float* f32() const;
  int32_t* i32();
  const int32_t* i32() const;
  std::span<float> span_f32() { return {f32(), static_cast<size_t>(numel())}; }
  std::span<const float> span_f32() const { return {f32(), static_cast<size_t>(numel())}; }

  /// A view of `count` elements starting at element `start`, reshaped to `shape`.
  Tensor view(size_t start, std::vector<int64_t> shape) const;
  /// Same storage, new shape with the same number of elements.
  Tensor reshape(std::vector<int64_t> shape) const;
  bool host_readable() const { return !storage_ || storage_->host_readable(); }
  /// Deep copy (explicit; nothing copies implicitly), in host memory. AP_CHECK on a tensor that
  /// is not host_readable().
  Tensor clone() const;
  std::string describe() const;  // "f32[4, 128, 64] cpu"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // elements
  std::array<int64_t, kMaxDims> shape_{};
  int ndim_ = 0;
  DType dtype_ = DType::f32;
};

int64_t numel(const std::vector<int64_t>& shape);

/// `t` itself when host_readable(), else a copy of its elements in host memory (through its
/// memory's to_host; the writer must have synchronised).
Tensor host_copy(const Tensor& t);

}  // namespace actorpipe
