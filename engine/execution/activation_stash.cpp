// Activation stash: the per-microbatch slots a stage keeps between a forward and its backward
// (input, hidden outputs, the saved activations of the layers not recomputed, the loss),
// preallocated up front.
#include "engine/execution/activation_stash.hpp"

#include <algorithm>
#include <utility>

#include "engine/schedule/generators.hpp"
#include "engine/schedule/simulator.hpp"
#include "kernels/check.hpp"

namespace actorpipe {

int default_stash_slots(Mode mode, int d, int r, int m) {
  // sync schedules cover one step; an async one reaches its steady state after d microbatches
  const int steps = is_synchronous(mode) ? 1 : d + 1;
  auto s = make_schedule(mode, d, m, steps);
  AP_CHECK(s.ok(), "{}", s.ok() ? "" : s.error().message);
  return peak_stash(*s)[static_cast<size_t>(r)];
}

ActivationStash::ActivationStash(int stage, int slots, size_t hidden_floats, size_t saved_floats,
                                 size_t weight_floats, ScratchPool* pool, BackendMemory& memory,
                                 size_t input_floats)
    : memory_(&memory),
      stage_(stage),
      hidden_floats_(hidden_floats),
      saved_floats_(saved_floats),
      weight_floats_(weight_floats),
      input_floats_(input_floats) {
  slots_.resize(static_cast<size_t>(std::max(slots, 1)));
  take_buffers(pool);
}

void ActivationStash::give_buffers(ScratchPool& pool) {
  AP_CHECK(in_flight() == 0, "stage {}: the stash's buffers given away with {} in flight", stage_,
           in_flight());
  for (Slot& s : slots_) {
    pool.give(std::exchange(s.hidden, {}));
    pool.give(std::exchange(s.saved, {}));
    pool.give(std::exchange(s.weights, {}));
    pool.give(std::exchange(s.input_copy, {}));
  }
  has_buffers_ = false;
}

void ActivationStash::take_buffers(ScratchPool* pool) {
  // the largest first: the pool's smallest fit then leaves its big buffers to the big needs
  for (Slot& s : slots_) assign_zeros(s.saved, *memory_, saved_floats_, pool);
  for (Slot& s : slots_) assign_zeros(s.hidden, *memory_, hidden_floats_, pool);
  for (Slot& s : slots_) assign_zeros(s.input_copy, *memory_, input_floats_, pool);
  for (Slot& s : slots_) assign_zeros(s.weights, *memory_, weight_floats_, pool);
  has_buffers_ = true;
}

size_t ActivationStash::bytes() const {
  size_t floats = 0;
  for (const Slot& s : slots_)
    floats += s.hidden.size() + s.saved.size() + s.weights.size() + s.input_copy.size();
  return floats * sizeof(float);
}

ActivationStash::Slot& ActivationStash::acquire(int microbatch) {
  Slot* free_slot = nullptr;
  for (Slot& s : slots_) {
    AP_CHECK(s.microbatch != microbatch, "F of microbatch {} twice without its B", microbatch);
    if (s.microbatch < 0 && !free_slot) free_slot = &s;
  }
  AP_CHECK(has_buffers_, "stage {}: F of microbatch {} while the stash's buffers are given away",
           stage_, microbatch);
  AP_CHECK(free_slot, "stage {}: F of microbatch {} but all {} stash slots are in flight", stage_,
           microbatch, slots_.size());
  free_slot->microbatch = microbatch;
  return *free_slot;
}

ActivationStash::Slot& ActivationStash::find(int microbatch) {
  for (Slot& s : slots_)
    if (s.microbatch == microbatch) return s;
  AP_CHECK(false, "stage {}: B of microbatch {} whose F has not run", stage_, microbatch);
  return slots_.front();
}

void ActivationStash::release(Slot& slot) {
  slot.microbatch = -1;
  slot.input = Tensor();
}

int ActivationStash::in_flight() const {
  int n = 0;
  for (const Slot& s : slots_) n += s.microbatch >= 0 ? 1 : 0;
  return n;
}

}  // namespace actorpipe
