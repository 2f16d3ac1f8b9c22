// Activation stash: the per-microbatch slots a stage keeps between a forward and its backward
// (input, hidden outputs, the saved activations of the layers not recomputed, the loss),
// preallocated up front.
#pragma once

#include <vector>

#include "engine/execution/scratch_pool.hpp"
#include "engine/mode.hpp"
#include "engine/model/layer.hpp"
#include "kernels/backend_memory.hpp"
#include "kernels/tensor.hpp"

namespace actorpipe {

/// The stash slots a stage needs by default: the peak number of microbatches its schedule keeps
/// between F and B at stage r of d (one step for the synchronous modes, the steady state of an
/// asynchronous schedule).
int default_stash_slots(Mode mode, int d, int r, int m);

/// A fixed number of slots, each sized for one microbatch of the stage. A slot is taken by a
/// forward (acquire) and given back by its backward (release); misuse (a microbatch twice, a
/// backward without its forward, more in flight than slots) is an AP_CHECK naming the stage.
class ActivationStash {
 public:
  struct Slot {
    int microbatch = -1;   ///< schedule index; -1 = free
    int version = 0;       ///< absolute version of its F
    Tensor input;          ///< the previous stage's output, held until the B
    BackendBuffer hidden;  ///< outputs of the stage's layers but the last, (B,T,C) each
    BackendBuffer saved;   ///< saved activations of the layers not recomputed
    /// xpipe: the weights the forward computed with of the recomputed layers (a prediction, or
    /// a version updated in place before the backward); empty in the other modes
    BackendBuffer weights;
    /// off the host: the input's floats copied into the stage's memory (its forward's and its
    /// backward's first layer read them there); empty on the host, where `input` is read
    BackendBuffer input_copy;
    LossStats loss;
  };

  ActivationStash() = default;
  /// `slots` slots of `hidden_floats`, `saved_floats`, `weight_floats` and `input_floats`
  /// each, for stage `stage` (messages), in `memory` (which must outlive the stash and any pool
  /// its buffers go to); the buffers from `pool` where it has them. A buffer may hold more floats
  /// than asked (one from the pool): its first ones are the slot's.
  ActivationStash(int stage, int slots, size_t hidden_floats, size_t saved_floats,
                  size_t weight_floats = 0, ScratchPool* pool = nullptr,
                  BackendMemory& memory = host_backend_memory(), size_t input_floats = 0);

  /// No slot in flight: every slot's buffers go to `pool`; the stash holds none (and takes no
  /// forward) until take_buffers().
  void give_buffers(ScratchPool& pool);
  /// Every slot's buffers sized again, zeroed, from `pool` where it has them.
  void take_buffers(ScratchPool* pool);
  /// The slots hold their buffers (not given away).
  bool has_buffers() const { return has_buffers_; }

  /// The free slot that microbatch `microbatch`'s forward fills.
  Slot& acquire(int microbatch);
  /// The slot microbatch `microbatch`'s forward filled.
  Slot& find(int microbatch);
  /// Frees `slot` (its backward is done).
  static void release(Slot& slot);
  /// Slots taken: microbatches whose F ran and B has not.
  int in_flight() const;
  int size() const { return static_cast<int>(slots_.size()); }
  /// Bytes the slots' buffers hold (what was allocated), inputs not counted (they are the
  /// previous stage's output tensors).
  size_t bytes() const;

 private:
  BackendMemory* memory_ = nullptr;
  int stage_ = 0;
  size_t hidden_floats_ = 0, saved_floats_ = 0, weight_floats_ = 0, input_floats_ = 0;
  bool has_buffers_ = true;
  std::vector<Slot> slots_;
};

}  // namespace actorpipe
