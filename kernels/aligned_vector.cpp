#include "kernels/aligned_vector.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace actorpipe {

void* allocate_host(size_t bytes) {
  void* p = nullptr;
  if (bytes >= kHugePage) {
    const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    p = std::aligned_alloc(kHugePage, rounded);
    if (p != nullptr) ::madvise(p, rounded, MADV_HUGEPAGE);  // advice: failure is fine
  } else {
    const size_t rounded = (bytes + kCacheLine - 1) / kCacheLine * kCacheLine;
    p = std::aligned_alloc(kCacheLine, rounded == 0 ? kCacheLine : rounded);
  }
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void free_host(void* p) noexcept {
  std::free(p);
}

}  // namespace actorpipe
