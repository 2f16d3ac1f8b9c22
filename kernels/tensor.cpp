// Tensor: shape, dtype and views into shared 64-byte aligned storage; nothing copies
// implicitly (clone is the one explicit deep copy).
#include "kernels/tensor.hpp"

#include <fmt/format.h>

#include <cstring>
#include <new>

#include "kernels/aligned_vector.hpp"
#include "kernels/backend_memory.hpp"
#include "kernels/check.hpp"

namespace actorpipe {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::i32:
      return 4;
  }
  AP_CHECK(false, "unknown dtype {}", static_cast<int>(t));
}

std::string to_string(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::i32:
      return "i32";
  }
  return "dtype(" + std::to_string(static_cast<int>(t)) + ")";
}

std::string to_string(Device d) {
  switch (d) {
    case Device::cpu:
      return "cpu";
    case Device::cuda:
      return "cuda";
  }
  return "device(" + std::to_string(static_cast<int>(d)) + ")";
}

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  AP_CHECK(device == Device::cpu, "Storage on {} is not available in this build",
           to_string(device));
  // whole huge pages from 2 MiB on: far fewer page-table entries for the kernels and for a
  // transfer that pins the pages (UCX's CMA copies between processes)
  try {
    data_ = allocate_host(bytes);
  } catch (const std::bad_alloc&) {
    data_ = nullptr;
  }
  AP_CHECK(data_ != nullptr, "out of memory allocating {} bytes", bytes);
}

Storage::Storage(BackendMemory& memory, size_t bytes)
    : bytes_(bytes), device_(memory.device()), memory_(&memory) {
  data_ = memory.allocate((bytes + sizeof(float) - 1) / sizeof(float));  // zero-filled
}

Storage::Storage(void* data, size_t bytes, std::function<void(void*)> give_back)
    : data_(data), bytes_(bytes), give_back_(std::move(give_back)) {
  AP_CHECK(data != nullptr && give_back_, "lent storage of {} bytes without memory or owner",
           bytes);
}

Storage::~Storage() {
  if (give_back_) {
    give_back_(data_);
  } else if (memory_ != nullptr) {
    memory_->release(static_cast<float*>(data_));
  } else {
    free_host(data_);
  }
}

bool Storage::host_readable() const {
  return memory_ == nullptr || memory_->host_memory();
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    AP_CHECK(s >= 0, "negative dimension {}", s);
    n *= s;
  }
  return n;
}

static std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

Tensor Tensor::zeros(std::vector<int64_t> shape, DType dtype, Device device) {
  const size_t bytes = static_cast<size_t>(actorpipe::numel(shape)) * dtype_size(dtype);
  auto storage = std::make_shared<Storage>(bytes, device);
  std::memset(storage->data(), 0, bytes);
  return Tensor(std::move(storage), 0, std::move(shape), dtype);
}

Tensor Tensor::zeros(std::vector<int64_t> shape, DType dtype, BackendMemory& memory) {
  const size_t bytes = static_cast<size_t>(actorpipe::numel(shape)) * dtype_size(dtype);
  return Tensor(std::make_shared<Storage>(memory, bytes), 0, std::move(shape), dtype);
}

Tensor::Tensor(std::shared_ptr<Storage> storage, size_t offset, std::vector<int64_t> shape,
               DType dtype)
    : storage_(std::move(storage)), offset_(offset), dtype_(dtype) {
  AP_CHECK(storage_ != nullptr, "a tensor view needs storage");
  AP_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), "shape {} has more than {} dims",
           shape_str(shape), kMaxDims);
  const auto n = static_cast<size_t>(actorpipe::numel(shape));
  const size_t esz = dtype_size(dtype);
  AP_CHECK((offset_ + n) * esz <= storage_->bytes(),
           "view of {} elements at offset {} exceeds storage of {} bytes", n, offset_,
           storage_->bytes());
  ndim_ = static_cast<int>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) shape_[i] = shape[i];
}

int64_t Tensor::numel() const {
  if (!storage_) return 0;
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= shape_[static_cast<size_t>(i)];
  return n;
}

float* Tensor::f32() {
  AP_CHECK(defined() && dtype_ == DType::f32, "f32() on {}", describe());
  return static_cast<float*>(storage_->data()) + offset_;
}
const float* Tensor::f32() const {
  AP_CHECK(defined() && dtype_ == DType::f32, "f32() on {}", describe());
  return static_cast<const float*>(storage_->data()) + offset_;
}
int32_t* Tensor::i32() {
  AP_CHECK(defined() && dtype_ == DType::i32, "i32() on {}", describe());
  return static_cast<int32_t*>(storage_->data()) + offset_;
}
const int32_t* Tensor::i32() const {
  AP_CHECK(defined() && dtype_ == DType::i32, "i32() on {}", describe());
  return static_cast<const int32_t*>(storage_->data()) + offset_;
}

Tensor Tensor::view(size_t start, std::vector<int64_t> shape) const {
  AP_CHECK(defined(), "view of an undefined tensor");
  const auto n = static_cast<size_t>(actorpipe::numel(shape));
  AP_CHECK(start + n <= static_cast<size_t>(numel()),
           "view of {} elements at {} exceeds {} ({} elements)", n, start, describe(), numel());
  return Tensor(storage_, offset_ + start, std::move(shape), dtype_);
}

Tensor Tensor::reshape(std::vector<int64_t> shape) const {
  AP_CHECK(defined(), "reshape of an undefined tensor");
  AP_CHECK(actorpipe::numel(shape) == numel(), "cannot reshape {} to {}", describe(),
           shape_str(shape));
  return Tensor(storage_, offset_, std::move(shape), dtype_);
}

Tensor Tensor::clone() const {
  if (!defined()) return {};
  AP_CHECK(host_readable(), "clone of {}, which is not in host memory (host_copy() reads it)",
           describe());
  Tensor t = zeros(shape(), dtype_);
  std::memcpy(t.storage_->data(),
              static_cast<const char*>(storage_->data()) + offset_ * dtype_size(dtype_), nbytes());
  return t;
}

Tensor host_copy(const Tensor& t) {
  if (t.host_readable()) return t;
  Tensor h = Tensor::zeros(t.shape(), t.dtype());
  const size_t floats = t.nbytes() / sizeof(float);  // f32 and i32: 4 bytes each
  const auto* src = static_cast<const float*>(t.storage()->data()) + t.offset();
  t.memory()->to_host(static_cast<float*>(h.storage()->data()), src, floats);
  return h;
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined";
  const BackendMemory* m = memory();
  return fmt::format("{}{} {}", to_string(dtype_), shape_str(shape()),
                     m != nullptr && !m->host_memory() ? m->name() : to_string(device()));
}

}  // namespace actorpipe
