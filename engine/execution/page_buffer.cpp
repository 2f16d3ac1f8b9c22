// PageBuffer: floats in an anonymous private mapping of their own (mmap), pages given back with
// madvise(MADV_DONTNEED), residency read with mincore.
#include "engine/execution/page_buffer.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <new>
#include <utility>
#include <vector>

#include "kernels/check.hpp"

namespace actorpipe {
namespace {

size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

}  // namespace

PageBuffer::PageBuffer(size_t floats) : size_(floats) {
  if (floats == 0) return;
  const size_t page = page_size();
  mapped_ = (floats * sizeof(float) + page - 1) / page * page;
  void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  data_ = static_cast<float*>(p);
}

PageBuffer::PageBuffer(PageBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)) {}

PageBuffer& PageBuffer::operator=(PageBuffer&& other) noexcept {
  if (this != &other) {
    PageBuffer gone(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
  }
  return *this;
}

PageBuffer::~PageBuffer() {
  if (data_ != nullptr) munmap(data_, mapped_);
}

void PageBuffer::release(size_t offset, size_t n) {
  AP_CHECK(offset <= size_ && n <= size_ - offset, "release of floats [{}, {}) of {}", offset,
           offset + n, size_);
  const size_t page = page_size();
  const size_t begin = (offset * sizeof(float) + page - 1) / page * page;
  const size_t end = (offset + n) * sizeof(float) / page * page;
  if (end <= begin) return;
  char* base = reinterpret_cast<char*>(data_);
  AP_CHECK(madvise(base + begin, end - begin, MADV_DONTNEED) == 0,
           "madvise(MADV_DONTNEED) of {} bytes failed", end - begin);
}

size_t PageBuffer::resident_bytes() const {
  if (mapped_ == 0) return 0;
  const size_t page = page_size();
  std::vector<unsigned char> in_core(mapped_ / page);
  AP_CHECK(mincore(data_, mapped_, in_core.data()) == 0, "mincore of {} bytes failed", mapped_);
  size_t pages = 0;
  for (unsigned char c : in_core) pages += (c & 1u) != 0 ? 1 : 0;
  return pages * page;
}

}  // namespace actorpipe
