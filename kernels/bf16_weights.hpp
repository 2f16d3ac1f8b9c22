// Bf16Weights: the bf16 copies of a stage's weight versions, made once per version instead of
// once per product. The owner of the weights (a stage worker) says which float ranges hold
// weights (cover) and when one of them may have changed (sync with that range's new change
// count); a product whose operand lies in a covered range takes the copy made since its range
// last changed, or makes it. The copies of the other ranges stay.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/aligned_vector.hpp"
#include "kernels/bf16.hpp"
#include "kernels/context.hpp"

namespace actorpipe {

class Bf16Weights {
 public:
  /// Floats [p, p + n) hold weights: operands inside are copied once per change of the range.
  /// Ranges do not overlap.
  void cover(const float* p, size_t n);
  void cover(std::span<const float> w) { cover(w.data(), w.size()); }
  /// The change counter of the covered range that starts at `range` (AP_CHECK: one does): a
  /// value other than the last one forgets the copies of that range's operands.
  void sync(const float* range, uint64_t generation);
  /// One change counter for every covered range (an owner that counts its changes as one).
  void sync(uint64_t generation);
  /// Where bf16 values of some weights exist already (a weight store's bf16 stash): copy() asks
  /// it first, and a non-null answer is the copy.
  using Source = std::function<const bf16*(const float* w, int64_t n)>;
  void set_source(Source source) { source_ = std::move(source); }
  /// The bf16 copy of w[0, n): the source's when it has one; the cached one when w lies in a
  /// covered range (made now, over ctx's threads, if none was made since the last change),
  /// otherwise a fresh copy in ctx's arena.
  const bf16* copy(Context& ctx, const float* w, int64_t n);

  /// The array that holds the copy of w[0, n) (w in a covered range), made if missing, for a
  /// writer that fills it with the bf16 rounding of the values w is about to hold (an optimizer
  /// update writing a new version in the same pass). copy() takes it only after mark_current.
  /// The array stays where it is for as long as this object lives.
  bf16* reserve(const float* w, int64_t n);
  /// The array reserve(w, ...) returned holds the bf16 rounding of w's values now, at the last
  /// sync of w's range: copy() returns it until that range changes.
  void mark_current(const float* w);
  /// Copies made so far (a test's count of conversions saved) and bytes held.
  uint64_t copies_made() const { return made_; }
  /// Copies a writer filled through reserve and mark_current.
  uint64_t copies_marked() const { return marked_; }
  size_t bytes() const;

 private:
  struct Range {
    const float* p = nullptr;
    size_t n = 0;
    bool synced = false;
    uint64_t generation = 0;  ///< the owner's change counter, as last synced
    uint64_t epoch = 0;       ///< this object's count of range changes when it was last synced
  };
  struct Entry {
    AlignedVector<bf16> data;  // on cache lines, as the products read it
    int64_t n = 0;
    int range = -1;
    uint64_t epoch = 0;  ///< its range's epoch when the copy was made; 0: none
  };
  // the covered range that holds w[0, n), or -1
  int range_of(const float* w, int64_t n) const;
  void sync_range(Range& r, uint64_t generation);
  Entry& entry(const float* w, int64_t n, int range);

  Source source_;
  std::vector<Range> ranges_;
  std::unordered_map<const float*, Entry> entries_;
  uint64_t epoch_ = 0;
  uint64_t made_ = 0;
  uint64_t marked_ = 0;
};

}  // namespace actorpipe
