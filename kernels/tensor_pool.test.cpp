// Tensor pool: a tensor comes back once every other holder dropped it, and the pool grows only
// while more are held than ever before.
#include "kernels/tensor_pool.hpp"

#include <doctest/doctest.h>

namespace actorpipe {

TEST_CASE("tensor pool: reuses a dropped tensor, grows only while all are held") {
  TensorPool pool({2, 3}, /*preallocate=*/1);
  CHECK(pool.size() == 1);
  Tensor a = pool.acquire();
  CHECK(a.shape() == std::vector<int64_t>{2, 3});
  CHECK(a.dtype() == DType::f32);
  Tensor held = a;  // another holder
  a = Tensor();
  Tensor b = pool.acquire();  // the first is still held: a new one
  CHECK(pool.size() == 2);
  CHECK(b.storage() != held.storage());
  const auto* first = held.storage().get();
  held = Tensor();
  b = Tensor();
  Tensor c = pool.acquire();  // both free again: the first comes back, nothing allocated
  CHECK(c.storage().get() == first);
  CHECK(pool.size() == 2);
  TensorPool ints({4}, 0, DType::i32);
  CHECK(ints.acquire().dtype() == DType::i32);
}

}  // namespace actorpipe
