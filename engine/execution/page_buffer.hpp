// PageBuffer: floats in pages of their own (an anonymous mapping), so that parts never written
// cost no memory and parts no longer needed can be given back to the kernel: the weight store's
// bf16 stash keeps a stashed version's product weights in bf16 and leaves their f32 pages empty.
#pragma once

#include <cstddef>

namespace actorpipe {

class PageBuffer {
 public:
  PageBuffer() = default;
  /// `floats` zeros, none of them resident until written. Throws std::bad_alloc when the
  /// mapping fails.
  explicit PageBuffer(size_t floats);
  PageBuffer(PageBuffer&& other) noexcept;
  PageBuffer& operator=(PageBuffer&& other) noexcept;
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;
  ~PageBuffer();

  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return size_; }

  /// Gives the whole pages inside floats [offset, offset + n) back to the kernel: they read as
  /// zero afterwards and are resident again only once written. The partial pages at either end
  /// keep their contents.
  void release(size_t offset, size_t n);
  /// Bytes of the buffer now resident in memory (mincore): what it costs, measured.
  size_t resident_bytes() const;

 private:
  float* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;  // bytes mapped (a whole number of pages; 0 for an empty buffer)
};

}  // namespace actorpipe
