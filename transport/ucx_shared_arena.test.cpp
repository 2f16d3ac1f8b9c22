// UCX shared arena tests: blocks in memory a peer worker maps, zero-filled, reused after
// release (coalesced), a second chunk when the first is full, the arena outliving its owner
// while blocks are out, and the refusal when the peer cannot map this process's memory.
#include "transport/ucx_shared_arena.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/tensor.hpp"
#include "transport/tools/ucx_test_job.hpp"

using namespace actorpipe;
using actorpipe::test::why;

namespace {

constexpr size_t kChunk = size_t{2} << 20;

/// Worker a with an endpoint to worker b (and b to a), both built with `options`.
struct Two {
  std::shared_ptr<UcxWorker> a, b;
  UcxEndpoint a_to_b, b_to_a;
};

Two two_workers(UcxWorkerOptions options = {}) {
  test::UcxTestJob job = test::connected_workers(2, std::move(options));
  return Two{job.workers[0], job.workers[1], job.peers[0].at(1), job.peers[1].at(0)};
}

}  // namespace

TEST_CASE("blocks lie in a chunk the peer maps: what one side writes, the other reads in place") {
  Two t = two_workers();
  auto arena = UcxSharedArena::create(t.a, t.a_to_b, "test arena", kChunk);
  REQUIRE_MESSAGE(arena.ok(), why(arena));
  CHECK((*arena)->chunks() == 1);
  CHECK((*arena)->device() == Device::cpu);
  CHECK((*arena)->host_memory());
  CHECK(&(*arena)->lasting_memory() == arena->get());

  Tensor x = Tensor::zeros({1000}, DType::f32, **arena);
  CHECK(x.memory() == arena->get());
  for (float v : x.span_f32()) CHECK(v == 0.0f);
  for (int i = 0; i < 1000; ++i) x.f32()[i] = static_cast<float>(i) * 0.5f;
  auto place = (*arena)->locate(x.f32(), x.nbytes());
  REQUIRE(place.has_value());
  CHECK(place->chunk == 0);
  CHECK(place->offset % 64 == 0);
  CHECK_FALSE((*arena)->locate(x.f32(), kChunk + 1).has_value());  // runs past the chunk
  std::vector<float> elsewhere(4);
  CHECK_FALSE((*arena)->locate(elsewhere.data(), 16).has_value());

  // worker b maps the chunk through its key, as a receiving process does
  const UcxSharedRegion chunk = (*arena)->chunk(0);
  CHECK(chunk.length >= kChunk);
  CHECK_FALSE(chunk.key.empty());
  auto mapped = t.b->attach_shared(t.b_to_a, chunk.key, reinterpret_cast<uint64_t>(chunk.address));
  REQUIRE_MESSAGE(mapped.ok(), why(mapped));
  const auto* seen = reinterpret_cast<const float*>(mapped->address + place->offset);
  CHECK(seen[0] == 0.0f);
  CHECK(seen[999] == 499.5f);
  x.f32()[7] = -3.0f;  // in place: the other mapping sees the write
  CHECK(seen[7] == -3.0f);
  t.b->detach_shared(mapped->id);
}

TEST_CASE("released blocks are reused and coalesced, a full chunk makes room in a new one") {
  Two t = two_workers();
  auto made = UcxSharedArena::create(t.a, t.a_to_b, "test arena", kChunk);
  REQUIRE_MESSAGE(made.ok(), why(made));
  std::shared_ptr<UcxSharedArena> arena = *made;
  const size_t quarter = kChunk / 4 / sizeof(float);
  std::vector<Tensor> held;
  for (int i = 0; i < 4; ++i)
    held.push_back(Tensor::zeros({static_cast<int64_t>(quarter)}, DType::f32, *arena));
  CHECK(arena->chunks() == 1);
  CHECK(arena->blocks() == 4);
  // the middle two go: one block of half a chunk fits where they were, zero-filled again
  held[1].f32()[0] = 1.0f;
  held[2].f32()[5] = 2.0f;
  const float* middle = held[1].f32();
  held[1] = Tensor();
  held[2] = Tensor();
  CHECK(arena->blocks() == 2);
  Tensor half = Tensor::zeros({static_cast<int64_t>(2 * quarter)}, DType::f32, *arena);
  CHECK(half.f32() == middle);
  CHECK(half.f32()[0] == 0.0f);
  CHECK(half.f32()[quarter + 5] == 0.0f);
  CHECK(arena->chunks() == 1);
  // the chunk is full: the next block maps a second one (larger when the block needs it)
  Tensor more = Tensor::zeros({static_cast<int64_t>(quarter)}, DType::f32, *arena);
  CHECK(arena->chunks() == 2);
  auto place = arena->locate(more.f32(), more.nbytes());
  REQUIRE(place.has_value());
  CHECK(place->chunk == 1);
  Tensor big =
      Tensor::zeros({static_cast<int64_t>(3 * kChunk / sizeof(float))}, DType::f32, *arena);
  CHECK(arena->chunks() == 3);
  CHECK(arena->chunk(2).length >= 3 * kChunk);
  CHECK(arena->heap_blocks() == 0);
  CHECK(t.a->shared_regions() == 3);
}

TEST_CASE("the arena outlives its owner while blocks are out, and unmaps its chunks after") {
  Two t = two_workers();
  Tensor kept;
  {
    auto arena = UcxSharedArena::create(t.a, t.a_to_b, "test arena", kChunk);
    REQUIRE_MESSAGE(arena.ok(), why(arena));
    kept = Tensor::zeros({256}, DType::f32, **arena);
    kept.f32()[255] = 9.0f;
  }  // the owner's reference goes; the block keeps the arena
  CHECK(t.a->shared_regions() == 1);
  CHECK(kept.f32()[255] == 9.0f);
  kept = Tensor();  // the last block: the arena goes and gives its chunk back to UCX
  // unmapping may wait for the progress thread: bounded
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (t.a->shared_regions() != 0 && std::chrono::steady_clock::now() < limit)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(t.a->shared_regions() == 0);
}

TEST_CASE("a peer that cannot map this process's memory (UCX_TLS=tcp) is refused by name") {
  UcxWorkerOptions tcp;
  tcp.config.emplace_back("TLS", "tcp");
  Two t = two_workers(tcp);
  auto arena = UcxSharedArena::create(t.a, t.a_to_b, "arena of UCX channel 0 (0 -> 1)", kChunk);
  REQUIRE_FALSE(arena.ok());
  CHECK(arena.error().message.find("arena of UCX channel 0 (0 -> 1)") != std::string::npos);
  CHECK(arena.error().message.find("cannot be shared") != std::string::npos);
  CHECK(t.a->shared_regions() == 0);  // the probe's chunk went back
}
