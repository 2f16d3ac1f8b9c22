// Context tests: the static partition, tasks taken as threads become free, persistent workers,
// nesting, exceptions, and an arena that stops growing after the first step.
#include "kernels/context.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/check.hpp"
#include "kernels/compute_backend.hpp"
#include "kernels/cpu_backend.hpp"

using namespace actorpipe;

TEST_CASE("parallel_for covers 0..n with the documented chunks") {
  for (int t : {1, 2, 3}) {
    Context ctx(t);
    for (int64_t n : {0, 1, 2, 5, 100, 1001}) {
      std::vector<int> hits(static_cast<size_t>(n), 0);
      std::vector<std::pair<int64_t, int64_t>> ranges(static_cast<size_t>(t), {-1, -1});
      ctx.parallel_for(n, [&](int c, int64_t b, int64_t e) {
        ranges[static_cast<size_t>(c)] = {b, e};
        for (int64_t i = b; i < e; ++i) ++hits[static_cast<size_t>(i)];
      });
      for (int h : hits) CHECK(h == 1);
      if (n > 0) {
        for (int c = 0; c < t; ++c) {
          CHECK(ranges[static_cast<size_t>(c)].first == c * n / t);
          CHECK(ranges[static_cast<size_t>(c)].second == (c + 1) * n / t);
        }
      }
    }
  }
}

TEST_CASE("parallel_for_aligned puts boundaries on multiples of align") {
  Context ctx(3);
  const int64_t n = 1000, align = 16;
  std::vector<std::pair<int64_t, int64_t>> ranges(3);
  ctx.parallel_for_aligned(n, align, [&](int c, int64_t b, int64_t e) {
    ranges[static_cast<size_t>(c)] = {b, e};
  });
  CHECK(ranges[0].first == 0);
  CHECK(ranges[2].second == n);
  for (int c = 0; c < 3; ++c) {
    if (c > 0)
      CHECK(ranges[static_cast<size_t>(c)].first == ranges[static_cast<size_t>(c - 1)].second);
    CHECK(ranges[static_cast<size_t>(c)].first % align == 0);
  }
  const int64_t units = (n + align - 1) / align;
  CHECK(ranges[1].first == units * 1 / 3 * align);
}

TEST_CASE("chunk 0 runs on the caller and the workers persist between calls") {
  Context ctx(2);
  std::thread::id first_worker;
  for (int call = 0; call < 50; ++call) {
    std::thread::id ids[2];
    ctx.parallel_for(2, [&](int c, int64_t, int64_t) { ids[c] = std::this_thread::get_id(); });
    CHECK(ids[0] == std::this_thread::get_id());
    CHECK(ids[1] != ids[0]);
    if (call == 0) first_worker = ids[1];
    CHECK(ids[1] == first_worker);
  }
}

TEST_CASE("a nested parallel_for runs its chunks in order on the calling thread") {
  Context ctx(2);
  std::vector<std::vector<int>> order(2);
  std::vector<std::thread::id> tid(2);
  ctx.parallel_for(2, [&](int c, int64_t, int64_t) {
    tid[static_cast<size_t>(c)] = std::this_thread::get_id();
    ctx.parallel_for(10, [&](int c2, int64_t b, int64_t e) {
      CHECK(std::this_thread::get_id() == tid[static_cast<size_t>(c)]);
      CHECK(b == c2 * 10 / 2);
      CHECK(e == (c2 + 1) * 10 / 2);
      order[static_cast<size_t>(c)].push_back(c2);
    });
  });
  CHECK(order[0] == std::vector<int>{0, 1});
  CHECK(order[1] == std::vector<int>{0, 1});
}

TEST_CASE("an exception in any chunk reaches the caller and the pool keeps working") {
  Context ctx(2);
  for (int bad = 0; bad < 2; ++bad) {
    std::atomic<int> done{0};
    CHECK_THROWS_AS(ctx.parallel_for(2,
                                     [&](int c, int64_t, int64_t) {
                                       ++done;
                                       if (c == bad) AP_CHECK(false, "chunk {}", c);
                                     }),
                    CheckFailure);
    CHECK(done == 2);
  }
  int64_t sum = 0;
  std::atomic<int64_t> total{0};
  ctx.parallel_for(100, [&](int, int64_t b, int64_t e) {
    int64_t s = 0;
    for (int64_t i = b; i < e; ++i) s += i;
    total += s;
  });
  for (int64_t i = 0; i < 100; ++i) sum += i;
  CHECK(total == sum);
}

TEST_CASE("parallel_tasks runs every task once, on a thread a chunk index names") {
  for (int t : {1, 2, 3}) {
    Context ctx(t);
    for (int64_t tasks : {0, 1, 2, 7, 100}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(tasks));
      std::vector<std::thread::id> thread_of(static_cast<size_t>(t));
      std::atomic<bool> chunk_ok{true};
      ctx.parallel_tasks(tasks, [&](int c, int64_t i) {
        if (c < 0 || c >= t) {
          chunk_ok = false;
          return;
        }
        ++hits[static_cast<size_t>(i)];
        // a chunk index is one thread's for the whole call (per-thread scratch)
        if (thread_of[static_cast<size_t>(c)] == std::thread::id{})
          thread_of[static_cast<size_t>(c)] = std::this_thread::get_id();
        else if (thread_of[static_cast<size_t>(c)] != std::this_thread::get_id())
          chunk_ok = false;
      });
      CHECK(chunk_ok);
      for (const auto& h : hits) CHECK(h == 1);
    }
  }
}

TEST_CASE("parallel_tasks: a thread that is free takes the tasks a busy one has not") {
  Context ctx(2);
  // task 0 holds its thread until every other task has run: the other thread runs them all
  std::atomic<int> others{0};
  std::atomic<int> chunk_of_others{-1};
  std::atomic<bool> mixed{false};
  const int64_t tasks = 12;
  ctx.parallel_tasks(tasks, [&](int c, int64_t i) {
    if (i == 0) {
      const auto t0 = std::chrono::steady_clock::now();
      while (others.load() < tasks - 1 &&
             std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
        std::this_thread::yield();
      return;
    }
    int expected = -1;
    if (!chunk_of_others.compare_exchange_strong(expected, c) && expected != c) mixed = true;
    ++others;
  });
  CHECK(others == tasks - 1);
  CHECK_FALSE(mixed);
}

TEST_CASE("parallel_tasks nested in a chunk runs its tasks in order on that thread") {
  Context ctx(2);
  std::vector<std::vector<int64_t>> order(2);
  ctx.parallel_for(2, [&](int c, int64_t, int64_t) {
    const auto me = std::this_thread::get_id();
    ctx.parallel_tasks(5, [&](int c2, int64_t i) {
      CHECK(c2 == 0);
      CHECK(std::this_thread::get_id() == me);
      order[static_cast<size_t>(c)].push_back(i);
    });
  });
  CHECK(order[0] == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(order[1] == std::vector<int64_t>{0, 1, 2, 3, 4});
}

TEST_CASE("an exception in a task reaches the caller and the pool keeps working") {
  Context ctx(2);
  std::atomic<int> done{0};
  CHECK_THROWS_AS(ctx.parallel_tasks(6,
                                     [&](int, int64_t i) {
                                       ++done;
                                       if (i == 3) AP_CHECK(false, "task {}", i);
                                     }),
                  CheckFailure);
  CHECK(done >= 4);
  std::atomic<int> again{0};
  ctx.parallel_tasks(4, [&](int, int64_t) { ++again; });
  CHECK(again == 4);
}

TEST_CASE("two Contexts used from two threads at once") {
  Context a(2), b(2);
  std::atomic<int64_t> sa{0}, sb{0};
  auto work = [](Context& ctx, std::atomic<int64_t>& s) {
    for (int rep = 0; rep < 200; ++rep)
      ctx.parallel_for(64, [&](int, int64_t b0, int64_t e0) { s += e0 - b0; });
  };
  std::thread ta([&] { work(a, sa); });
  std::thread tb([&] { work(b, sb); });
  ta.join();
  tb.join();
  CHECK(sa == 200 * 64);
  CHECK(sb == 200 * 64);
}

TEST_CASE("arena: aligned, disjoint, and no growth after the first step's reset") {
  Arena arena;
  CHECK(arena.capacity_bytes() == 0);
  auto step = [&](std::vector<float*>& ptrs) {
    ptrs.clear();
    // Mixed sizes, including ones larger than the first block.
    for (size_t n :
         {size_t{10}, size_t{1} << 18, size_t{3}, size_t{1} << 20, size_t{777}, size_t{5} << 19}) {
      float* p = arena.alloc_f32(n);
      CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
      for (size_t i = 0; i < n; ++i) p[i] = static_cast<float>(ptrs.size());
      ptrs.push_back(p);
    }
  };
  std::vector<float*> ptrs;
  step(ptrs);
  // Disjoint: every buffer still holds its own index.
  CHECK(ptrs[0][9] == 0.0f);
  CHECK(ptrs[1][(1 << 18) - 1] == 1.0f);
  CHECK(ptrs[3][0] == 3.0f);
  const size_t after_first = arena.capacity_bytes();
  CHECK(after_first >= (size_t{1} << 18 | size_t{1} << 20 | size_t{5} << 19) * 4);
  arena.reset();
  const size_t cap = arena.capacity_bytes();
  CHECK(cap == after_first);  // merging keeps the total
  for (int s = 0; s < 5; ++s) {
    step(ptrs);
    CHECK(arena.capacity_bytes() == cap);
    arena.reset();
    CHECK(arena.capacity_bytes() == cap);
  }
  // After the merge, one step's buffers are contiguous in one block: the same addresses
  // come back every step.
  std::vector<float*> again;
  step(again);
  arena.reset();
  step(ptrs);
  CHECK(ptrs == again);
}

TEST_CASE("Context rejects a bad thread count") {
  CHECK_THROWS_AS(Context(0), CheckFailure);
  Context c(1);
  CHECK(c.threads() == 1);
  double* r = c.reduction_buffer(10);
  CHECK(r == c.reduction_buffer(5));  // grow-only: no reallocation for a smaller request
}

TEST_CASE("a Context passes its precision to the backend it runs on") {
  Context ctx(1);
  Context other(1);
  auto cpu = make_cpu_backend(other);
  ctx.set_precision(Precision::bf16);
  ctx.set_backend(cpu.get());
  CHECK(cpu->precision() == Precision::bf16);
  CHECK(other.precision() == Precision::bf16);
  CHECK(ctx.host_backend());  // another Context's CPU backend: host memory still
  ctx.set_precision(Precision::fp32);
  CHECK(cpu->precision() == Precision::fp32);
  // a CPU backend made over the Context itself: no loop between the two
  auto own = make_cpu_backend(ctx);
  ctx.set_backend(own.get());
  ctx.set_precision(Precision::bf16);
  CHECK(own->precision() == Precision::bf16);
  CHECK(ctx.bf16_activations());  // host memory: a layer may keep bf16 activations
  ctx.set_backend(nullptr);
  CHECK(&ctx.backend() != own.get());
}
