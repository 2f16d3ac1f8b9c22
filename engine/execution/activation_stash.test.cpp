// Activation stash: slots taken by forwards and given back by backwards, misuse refused, and
// the default number of slots each mode's schedule needs.
#include "engine/execution/activation_stash.hpp"

#include <doctest/doctest.h>

#include <algorithm>

#include "kernels/check.hpp"
#include "kernels/checked_backend.hpp"
#include "kernels/context.hpp"

namespace actorpipe {

TEST_CASE("activation stash: a forward takes a free slot, its backward finds and frees it") {
  ActivationStash stash(/*stage=*/1, /*slots=*/2, /*hidden_floats=*/6, /*saved_floats=*/10);
  CHECK(stash.size() == 2);
  CHECK(stash.in_flight() == 0);
  ActivationStash::Slot& a = stash.acquire(3);
  CHECK(a.microbatch == 3);
  CHECK(a.hidden.size() == 6);
  CHECK(a.saved.size() == 10);
  ActivationStash::Slot& b = stash.acquire(4);
  CHECK(&a != &b);
  CHECK(stash.in_flight() == 2);
  CHECK(&stash.find(3) == &a);
  a.input = Tensor::zeros({2});
  ActivationStash::release(a);
  CHECK(a.microbatch == -1);
  CHECK_FALSE(a.input.defined());
  CHECK(stash.in_flight() == 1);
  CHECK(&stash.acquire(5) == &a);  // the freed slot is reused
}

TEST_CASE("activation stash: its buffers live in the memory it is given, zeroed, through a pool") {
  Context ctx(1);
  CheckedBackend dev(ctx);  // every access outside its operations faults
  ScratchPool pool;
  ActivationStash stash(0, 2, 6, 10, 3, nullptr, dev);
  size_t floats = 0;
  for (int mb = 0; mb < 2; ++mb) {
    ActivationStash::Slot& s = stash.acquire(mb);
    for (const BackendBuffer* b : {&s.hidden, &s.saved, &s.weights}) {
      CHECK(dev.owns(b->data()));
      floats += b->size();
    }
    const std::vector<float> ones(10, 1.0f);
    dev.to_backend(s.saved.data(), ones.data(), 10);
  }
  CHECK(floats == 2 * (6 + 10 + 3));
  CHECK(stash.bytes() == floats * sizeof(float));
  CHECK_THROWS_WITH_AS(stash.give_buffers(pool), doctest::Contains("2 in flight"), CheckFailure);
  for (int mb = 0; mb < 2; ++mb) ActivationStash::release(stash.find(mb));
  const size_t regions = dev.regions();
  stash.give_buffers(pool);
  CHECK_FALSE(stash.has_buffers());
  CHECK(pool.bytes_kept() == floats * sizeof(float));
  CHECK(stash.bytes() == 0);
  stash.take_buffers(&pool);  // the same buffers again, zeroed
  CHECK(pool.bytes_kept() == 0);
  CHECK(dev.regions() == regions);
  std::vector<float> back(10, 1.0f);
  dev.to_host(back.data(), stash.acquire(7).saved.data(), 10);
  CHECK(back == std::vector<float>(10, 0.0f));
}

TEST_CASE("activation stash: misuse names the stage and the microbatch") {
  ActivationStash stash(2, 1, 1, 1);
  stash.acquire(0);
  CHECK_THROWS_WITH_AS(stash.acquire(0), doctest::Contains("microbatch 0 twice"), CheckFailure);
  CHECK_THROWS_WITH_AS(stash.acquire(1), doctest::Contains("stage 2: F of microbatch 1"),
                       CheckFailure);
  CHECK_THROWS_WITH_AS(stash.find(7), doctest::Contains("stage 2: B of microbatch 7"),
                       CheckFailure);
  CHECK(ActivationStash(0, 0, 1, 1).size() == 1);  // at least one slot
}

TEST_CASE("activation stash: default slots are the schedule's peak (1f1b min(d-r, m), gpipe m)") {
  for (int d = 1; d <= 4; ++d) {
    for (int m = 1; m <= 6; ++m) {
      for (int r = 0; r < d; ++r) {
        CHECK(default_stash_slots(Mode::onef1b, d, r, m) == std::min(d - r, m));
        CHECK(default_stash_slots(Mode::gpipe, d, r, m) == m);
      }
    }
  }
}

}  // namespace actorpipe
