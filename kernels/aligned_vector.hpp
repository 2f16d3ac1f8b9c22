// AlignedVector: a std::vector whose elements start on a 64-byte boundary (a cache line). The
// products' operands and outputs live in such buffers: oneDNN's bf16 kernels load and store
// whole rows of tiles, and a row that starts mid-line touches one line more each time (a 16-byte
// offset made GPT-small's products 1.1-1.7x slower on a Xeon with AMX; docs/benchmarks.md).
#pragma once

#include <cstddef>
#include <vector>

namespace actorpipe {

inline constexpr size_t kCacheLine = 64;
inline constexpr size_t kHugePage = size_t{2} << 20;

/// Host memory for kernels' buffers: `bytes` bytes, 64-byte aligned; from kHugePage bytes on, a
/// whole number of 2 MiB pages, 2 MiB aligned and advised as transparent huge pages
/// (MADV_HUGEPAGE; the kernel honours it where /sys/kernel/mm/transparent_hugepage/enabled
/// allows madvise): far fewer page-table entries for the products' operands. Throws
/// std::bad_alloc when out of memory. Released by free_host.
void* allocate_host(size_t bytes);
void free_host(void* p) noexcept;

/// std::allocator through allocate_host.
template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}  // NOLINT: rebinding
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{kCacheLine}));
  }
  void deallocate(T* p, size_t) noexcept { ::operator delete (p, std::align_val_t{kCacheLine}); }
  template <class U>
  friend bool operator==(const CacheLineAllocator&, const CacheLineAllocator<U>&) {
    return true;
  }
};

template <class T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace actorpipe
