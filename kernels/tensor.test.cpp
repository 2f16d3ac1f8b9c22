// Tensor tests: zero-filled aligned storage, views and reshapes share storage, clone copies,
// bounds and dtype checks.
#include "kernels/tensor.hpp"

#include <doctest/doctest.h>

#include <cstdint>

#include "kernels/check.hpp"

using namespace actorpipe;

TEST_CASE("zeros allocates zero-filled 64-byte aligned storage") {
  Tensor t = Tensor::zeros({3, 5, 7});
  CHECK(t.defined());
  CHECK(t.dim() == 3);
  CHECK(t.numel() == 105);
  CHECK(t.nbytes() == 420);
  CHECK(t.shape() == std::vector<int64_t>{3, 5, 7});
  CHECK(reinterpret_cast<uintptr_t>(t.f32()) % 64 == 0);
  for (float x : t.span_f32()) CHECK(x == 0.0f);
  CHECK(t.describe() == "f32[3, 5, 7] cpu");
  Tensor i = Tensor::zeros({4}, DType::i32);
  CHECK(i.i32()[3] == 0);
  CHECK(to_string(DType::i32) == "i32");
}

TEST_CASE("views and reshapes share storage without copying") {
  Tensor base = Tensor::zeros({4, 6});
  Tensor row2 = base.view(12, {6});
  CHECK(row2.storage() == base.storage());
  CHECK(row2.offset() == 12);
  CHECK(row2.f32() == base.f32() + 12);
  row2.f32()[1] = 42.0f;
  CHECK(base.f32()[13] == 42.0f);
  Tensor sub = row2.view(2, {2, 2});  // view of a view: offsets add up
  CHECK(sub.offset() == 14);
  sub.f32()[0] = 7.0f;
  CHECK(base.f32()[14] == 7.0f);
  Tensor r = base.reshape({2, 3, 4});
  CHECK(r.storage() == base.storage());
  CHECK(r.f32()[13] == 42.0f);
  CHECK(base.storage().use_count() == 4);
}

TEST_CASE("lent storage is read in place and handed back, not freed, when the last view goes") {
  std::vector<float> owner(8, 2.5f);
  void* returned = nullptr;
  int calls = 0;
  {
    auto lent = std::make_shared<Storage>(owner.data(), owner.size() * sizeof(float), [&](void* p) {
      returned = p;
      ++calls;
    });
    CHECK(lent->host_readable());
    CHECK(lent->memory() == nullptr);
    Tensor t(lent, 2, {2, 3}, DType::f32);
    lent.reset();
    CHECK(t.f32() == owner.data() + 2);  // no copy
    t.f32()[0] = 7.0f;
    CHECK(owner[2] == 7.0f);
    CHECK(calls == 0);
  }
  CHECK(calls == 1);
  CHECK(returned == owner.data());
  CHECK_THROWS_AS(Storage(nullptr, 4, [](void*) {}), CheckFailure);
  CHECK_THROWS_AS(Storage(owner.data(), 4, nullptr), CheckFailure);
}

TEST_CASE("clone is a deep copy") {
  Tensor a = Tensor::zeros({8});
  a.f32()[3] = 1.5f;
  Tensor v = a.view(2, {4});
  Tensor c = v.clone();
  CHECK(c.storage() != a.storage());
  CHECK(c.shape() == std::vector<int64_t>{4});
  CHECK(c.f32()[1] == 1.5f);
  c.f32()[1] = 2.0f;
  CHECK(a.f32()[3] == 1.5f);
}

TEST_CASE("bounds, shape and dtype errors are CheckFailures") {
  Tensor a = Tensor::zeros({2, 3});
  CHECK_THROWS_AS(a.view(4, {3}), CheckFailure);
  CHECK_THROWS_AS(a.reshape({4, 2}), CheckFailure);
  CHECK_THROWS_AS(a.i32(), CheckFailure);
  CHECK_THROWS_AS(Tensor::zeros({1, 2, 3, 4, 5}), CheckFailure);
  CHECK_THROWS_AS(Tensor(a.storage(), 5, {2}, DType::f32), CheckFailure);
  CHECK_NOTHROW(Tensor(a.storage(), 4, {2}, DType::f32));
  Tensor u;
  CHECK(!u.defined());
  CHECK(u.numel() == 0);
}
