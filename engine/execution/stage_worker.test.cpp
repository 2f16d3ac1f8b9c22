// StageWorker tests: the steady state allocates nothing in any mode, workers share no mutable
// state (concurrent workers compute what sequential ones do), updates applied on another thread
// while the worker computes equal updates applied at once, output tensors move without copies,
// the tied-parameter and gradient-norm hooks, and refusals of actions out of order; recompute
// computes the bits of no recompute in every mode with a smaller stash.
#include "engine/execution/stage_worker.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "engine/data/loader.hpp"
#include "engine/execution/optimizer_shard.hpp"
#include "engine/schedule/generators.hpp"
#include "kernels/check.hpp"
#include "kernels/checked_backend.hpp"
#include "tests/support/tiny_model.hpp"

// Every allocation through operator new in this test program is counted. (The replacement
// operators pair malloc with free, which GCC cannot see through the inlined allocators.)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
namespace {
std::atomic<long> g_allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t a) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  const size_t align = static_cast<size_t>(a);
  if (void* p = std::aligned_alloc(align, (n + align - 1) / align * align)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

ModelOptions tiny(Arch arch, bool tied) {
  return tiny_model(arch, tied, 17);
}

OptimizerOptions adamw() {
  OptimizerOptions o;
  o.lr = 2e-2f;
  o.weight_decay = 0.1f;
  return o;
}

std::vector<Microbatch> batches(Arch arch, int V, int n) {
  return tiny_batches(arch, V, n, 3);
}

// d stage workers and their optimizer shards.
struct Workers {
  std::vector<std::unique_ptr<StageWorker>> w;
  std::vector<std::unique_ptr<OptimizerShard>> o;
  StageWorker* operator[](size_t r) { return w[r].get(); }
  size_t size() const { return w.size(); }
};

Workers make_workers(const Model& model, int d, Mode mode, int m, int threads = 1,
                     const std::vector<bool>& recompute = {}) {
  const Partition p = *Partition::even(model.num_layers(), d);
  Workers ws;
  for (int r = 0; r < d; ++r) {
    StageWorkerOptions o;
    o.mode = mode;
    o.stage = r;
    o.microbatches = m;
    o.B = kB;
    o.T = kT;
    o.threads = threads;
    o.recompute = recompute;
    ws.w.push_back(std::make_unique<StageWorker>(model, p, adamw(), o));
    ws.o.push_back(std::make_unique<OptimizerShard>(model, p, r, adamw()));
    ws.w.back()->predict_from(*ws.o.back());
  }
  return ws;
}

// How drive() applies an update after begin_update.
enum class Apply {
  at_once,     // finish, run and commit right away (the serial executor's way)
  concurrent,  // finish and run on another thread with another Context while the worker goes on
               // with its next actions; commit when an action waits for it (or at the end)
};

// How drive() runs a B at stages r > 0.
enum class Backward {
  one_pass,  // exec_backward
  split,     // exec_backward_input, hand the gradient on, exec_backward_weights
};

// Drives the workers of an untied model through a compute-only schedule (updates unclipped, so
// no cross-stage step is needed) in a round-robin over the stages. Returns the allocations made
// inside the workers' calls.
// `overlapped` counts the F and B executed while their stage's update was open.
long drive(Workers& ws, const Schedule& s, const std::vector<Microbatch>& mbs, int64_t offset,
           Apply apply = Apply::at_once, int* overlapped = nullptr,
           Backward backward = Backward::one_pass) {
  for (auto& w : ws.w) REQUIRE(w->start_run(s, offset).ok());
  const int d = static_cast<int>(ws.size());
  const size_t n = static_cast<size_t>(s.total_microbatches());
  std::vector<std::vector<Tensor>> f_in(ws.size(), std::vector<Tensor>(n));
  std::vector<std::vector<Tensor>> b_in(ws.size(), std::vector<Tensor>(n));
  std::vector<std::vector<char>> has_f(ws.size(), std::vector<char>(n, 0));
  std::vector<std::vector<char>> has_b(ws.size(), std::vector<char>(n, 0));
  std::vector<size_t> pc(ws.size(), 0);
  std::vector<std::thread> updating(ws.size());
  std::vector<UpdateJob*> jobs(ws.size(), nullptr);
  std::vector<std::unique_ptr<Context>> shard_ctx;
  for (size_t r = 0; r < ws.size(); ++r) shard_ctx.push_back(std::make_unique<Context>(1));
  auto commit = [&](size_t r) {
    updating[r].join();
    ws[r]->commit_update(*jobs[r]);
    jobs[r] = nullptr;
  };
  long allocations = 0;
  for (bool done = false; !done;) {
    done = true;
    bool progress = false;
    for (int r = 0; r < d; ++r) {
      const size_t ru = static_cast<size_t>(r);
      const auto& list = s.per_stage[ru];
      if (pc[ru] == list.size()) {
        if (jobs[ru]) commit(ru);
        continue;
      }
      done = false;
      const Action& a = list[pc[ru]];
      const size_t j = static_cast<size_t>(std::max(a.microbatch, 0));
      StageWorker& w = *ws[ru];
      if (jobs[ru] && w.waits_for_update(a)) commit(ru);
      if (jobs[ru] && overlapped && is_compute(a.kind)) ++*overlapped;
      const long before = g_allocations.load();
      if (a.kind == ActionKind::F) {
        if (r > 0 && !has_f[ru][j]) continue;
        ForwardOutput out = w.exec_forward(a, mbs[static_cast<size_t>(offset) + j], f_in[ru][j]);
        f_in[ru][j] = Tensor();
        if (r + 1 < d) {
          f_in[ru + 1][j] = std::move(out.out);
          has_f[ru + 1][j] = 1;
        }
      } else if (a.kind == ActionKind::B) {
        if (r + 1 < d && !has_b[ru][j]) continue;
        const Microbatch& mb = mbs[static_cast<size_t>(offset) + j];
        const bool split = backward == Backward::split && r > 0;
        Tensor din =
            split ? w.exec_backward_input(a, mb, b_in[ru][j]) : w.exec_backward(a, mb, b_in[ru][j]);
        b_in[ru][j] = Tensor();
        if (r > 0) {
          b_in[ru - 1][j] = std::move(din);
          has_b[ru - 1][j] = 1;
        }
        if (split) {
          CHECK(w.backward_pending());
          w.exec_backward_weights();
        }
      } else if (a.kind == ActionKind::OPT_STEP) {
        UpdateJob& job = w.begin_update(a);
        OptimizerShard& shard = *ws.o[ru];
        if (apply == Apply::at_once) {
          job.finish_gradients(w.context());
          shard.run_update(w.context(), job, {});
          w.commit_update(job);
        } else {
          Context& ctx = *shard_ctx[ru];
          jobs[ru] = &job;
          updating[ru] = std::thread([&job, &shard, &ctx] {
            job.finish_gradients(ctx);
            shard.run_update(ctx, job, {});
          });
        }
      } else if (a.kind == ActionKind::FLUSH) {
        w.exec_flush(a);  // the last action of every list here
      }
      allocations += g_allocations.load() - before;
      ++pc[ru];
      progress = true;
    }
    REQUIRE((done || progress));
  }
  return allocations;
}

}  // namespace

TEST_CASE("the steady state allocates nothing, in every mode") {
  const Model model = build_model(tiny(Arch::bert, false));
  struct Case {
    Mode mode;
    int d, m, steps;
  };
  for (const Case c :
       {Case{Mode::gpipe, 2, 3, 1}, Case{Mode::onef1b, 3, 4, 1}, Case{Mode::twobw, 3, 3, 3},
        Case{Mode::pipedream, 3, 1, 8}, Case{Mode::xpipe, 3, 2, 3}}) {
    INFO(to_string(c.mode));
    const Schedule s = c.mode == Mode::pipedream ? *make_pipedream(c.d, c.steps)
                                                 : *make_schedule(c.mode, c.d, c.m, c.steps);
    const auto mbs = batches(Arch::bert, model.options().vocab_size, 3 * s.total_microbatches());
    for (Backward backward : {Backward::one_pass, Backward::split}) {
      INFO((backward == Backward::split ? "split backward" : "one-pass backward"));
      Workers ws = make_workers(model, c.d, c.mode, c.m);
      auto run = [&](int k) {
        return drive(ws, s, mbs, k * s.total_microbatches(), Apply::at_once, nullptr, backward);
      };
      CHECK(run(0) > 0);  // warm-up: the arenas reach their size (and it counts)
      CHECK(run(1) == 0);
      CHECK(run(2) == 0);
      CHECK(ws[0]->updates() == 3 * s.steps);
    }
  }
}

TEST_CASE("workers share no mutable state: concurrent pipelines equal sequential ones") {
  const Model model = build_model(tiny(Arch::gpt, false));
  const Schedule s = *make_xpipe(2, 2, 3);
  const auto mbs = batches(Arch::gpt, model.options().vocab_size, s.total_microbatches());
  auto result = [&](Workers& ws) {
    std::vector<std::vector<float>> out;
    for (auto& w : ws.w)
      for (int i = 0; i < w->num_layers(); ++i)
        out.emplace_back(w->params(i).begin(), w->params(i).end());
    return out;
  };
  Workers seq = make_workers(model, 2, Mode::xpipe, 2, 2);
  drive(seq, s, mbs, 0);
  Workers a = make_workers(model, 2, Mode::xpipe, 2, 2);
  Workers b = make_workers(model, 2, Mode::xpipe, 2, 1);
  std::thread ta([&] { drive(a, s, mbs, 0); });
  std::thread tb([&] { drive(b, s, mbs, 0); });
  ta.join();
  tb.join();
  CHECK(result(a) == result(seq));
  CHECK(result(b) == result(seq));  // one thread or two: the kernels' bits do not change here
}

TEST_CASE("updates applied on another thread while the worker computes equal updates at once") {
  const Model model = build_model(tiny(Arch::gpt, false));
  struct Case {
    Mode mode;
    int d, m, steps;
    bool overlaps;  // some F/B runs while its stage's update is open
  };
  for (const Case c : {Case{Mode::twobw, 3, 3, 4, true}, Case{Mode::pipedream, 3, 1, 9, true},
                       Case{Mode::xpipe, 3, 2, 3, false}, Case{Mode::onef1b, 2, 3, 1, false}}) {
    INFO(to_string(c.mode));
    const Schedule s = c.mode == Mode::pipedream ? *make_pipedream(c.d, c.steps)
                                                 : *make_schedule(c.mode, c.d, c.m, c.steps);
    const auto mbs = batches(Arch::gpt, model.options().vocab_size, 2 * s.total_microbatches());
    Workers a = make_workers(model, c.d, c.mode, c.m);
    Workers b = make_workers(model, c.d, c.mode, c.m);
    int overlapped = 0;
    for (int64_t run = 0; run < 2; ++run) {
      drive(a, s, mbs, run * s.total_microbatches());
      drive(b, s, mbs, run * s.total_microbatches(), Apply::concurrent, &overlapped);
    }
    CHECK((overlapped > 0) == c.overlaps);
    for (int r = 0; r < c.d; ++r) {
      const size_t ru = static_cast<size_t>(r);
      CHECK(b[ru]->updates() == a[ru]->updates());
      for (int i = 0; i < a[ru]->num_layers(); ++i) {
        CHECK(std::memcmp(a[ru]->params(i).data(), b[ru]->params(i).data(),
                          a[ru]->params(i).size_bytes()) == 0);
        CHECK(std::memcmp(a.o[ru]->state(i).data(), b.o[ru]->state(i).data(),
                          a.o[ru]->state(i).size_bytes()) == 0);
      }
    }
  }
}

TEST_CASE("a split backward computes exec_backward's bits, and nothing runs between its halves") {
  const Model model = build_model(tiny(Arch::gpt, false));
  for (const Mode mode : {Mode::gpipe, Mode::twobw, Mode::pipedream}) {
    INFO(to_string(mode));
    const int d = 3, m = mode == Mode::pipedream ? 1 : 3;
    const int steps = mode == Mode::pipedream ? 6 : (mode == Mode::gpipe ? 1 : 2);
    const Schedule s =
        mode == Mode::pipedream ? *make_pipedream(d, steps) : *make_schedule(mode, d, m, steps);
    const auto mbs = batches(Arch::gpt, model.options().vocab_size, s.total_microbatches());
    Workers a = make_workers(model, d, mode, m);
    Workers b = make_workers(model, d, mode, m);
    drive(a, s, mbs, 0);
    drive(b, s, mbs, 0, Apply::at_once, nullptr, Backward::split);
    for (size_t r = 0; r < static_cast<size_t>(d); ++r) {
      for (int i = 0; i < a[r]->num_layers(); ++i) {
        CHECK(std::memcmp(a[r]->params(i).data(), b[r]->params(i).data(),
                          a[r]->params(i).size_bytes()) == 0);
        CHECK(std::memcmp(a.o[r]->state(i).data(), b.o[r]->state(i).data(),
                          a.o[r]->state(i).size_bytes()) == 0);
      }
    }
  }
  // between the halves: every other action is refused
  Workers ws = make_workers(model, 2, Mode::gpipe, 2);
  StageWorker& w = *ws[1];
  const auto mbs = batches(Arch::gpt, model.options().vocab_size, 2);
  REQUIRE(w.start_run(*make_gpipe(2, 2), 0).ok());
  Tensor in = Tensor::zeros({kB, kT, model.options().width});
  CHECK_THROWS_AS(w.exec_backward_weights(), CheckFailure);  // no first half
  w.exec_forward({1, ActionKind::F, 0, 0, 0}, mbs[0], in);
  w.exec_forward({1, ActionKind::F, 1, 0, 0}, mbs[1], in);
  CHECK(w.exec_backward_input({1, ActionKind::B, 0, 0, 0}, mbs[0], Tensor()).defined());
  CHECK(w.backward_pending());
  CHECK(w.in_flight() == 2);  // microbatch 0 stays stashed until its weight half
  CHECK_THROWS_AS(w.exec_backward({1, ActionKind::B, 1, 0, 0}, mbs[1], Tensor()), CheckFailure);
  CHECK_THROWS_AS(w.begin_update({1, ActionKind::OPT_STEP, -1, 1, 0}), CheckFailure);
  w.exec_backward_weights();
  CHECK_FALSE(w.backward_pending());
  CHECK(w.in_flight() == 1);
  CHECK(w.exec_backward({1, ActionKind::B, 1, 0, 0}, mbs[1], Tensor()).defined());
}

TEST_CASE("tied parameter hooks and per-layer gradient norms") {
  const Model model = build_model(tiny(Arch::gpt, true));
  Workers ws = make_workers(model, 2, Mode::onef1b, 1);
  const size_t n = static_cast<size_t>(model.options().vocab_size) * model.options().width;
  REQUIRE(ws[0]->num_tied() == 1);
  CHECK(ws[0]->tied_role(0) == TiedRole::owner);
  CHECK(ws[1]->tied_role(0) == TiedRole::copy);
  CHECK(ws[0]->tied_weights(0).size() == n);
  CHECK_THROWS_AS(ws[1]->tied_weights(0), CheckFailure);
  // both copies start equal
  CHECK(std::memcmp(ws[0]->tied_weights(0).data(),
                    ws[1]->params(ws[1]->num_layers() - 1).data() +
                        model.layer(model.num_layers() - 1).find_slot("lm_head.weight")->offset,
                    n * sizeof(float)) == 0);
  // an update's job: each side's tied gradient
  for (size_t r = 0; r < 2; ++r) {
    REQUIRE(ws[r]->start_run(*make_1f1b(2, 1), 0).ok());
    UpdateJob& job = ws[r]->begin_update({static_cast<int>(r), ActionKind::OPT_STEP, -1, 1, 0});
    CHECK(job.tied_role(0) == ws[r]->tied_role(0));
    CHECK(job.tied_grad(0).size() == n);
    CHECK_THROWS_AS(job.tied_weights(0), CheckFailure);  // not applied yet
  }
  Workers one = make_workers(model, 1, Mode::onef1b, 1);
  CHECK(one[0]->tied_role(0) == TiedRole::both);

  // finish_gradients: Model::grad_sumsq per layer, after the local tied sum
  const auto mbs = batches(Arch::gpt, model.options().vocab_size, 1);
  const Schedule s = *make_1f1b(1, 1);
  REQUIRE(one[0]->start_run(s, 0).ok());
  one[0]->exec_forward(s.per_stage[0][0], mbs[0], Tensor());
  one[0]->exec_backward(s.per_stage[0][1], mbs[0], Tensor());
  const ParamSlot* head = model.layer(3).find_slot("lm_head.weight");
  const std::vector<float> wte(one[0]->grads(0).begin(), one[0]->grads(0).begin() + n);
  const std::vector<float> lm(one[0]->grads(3).begin() + head->offset,
                              one[0]->grads(3).begin() + head->offset + n);
  UpdateJob& job = one[0]->begin_update(s.per_stage[0][2]);
  CHECK_THROWS_AS(job.tied_grad(0), CheckFailure);  // both sides are here
  const auto sums = job.finish_gradients(one[0]->context());
  REQUIRE(sums.size() == static_cast<size_t>(model.num_layers()));
  bool summed = true;
  for (size_t k = 0; k < n; ++k) {
    const float expected = wte[k] + lm[k];
    summed = summed && job.grads(0)[k] == expected && job.grads(3)[head->offset + k] == expected &&
             lm[k] != 0.0f;
  }
  CHECK(summed);
  for (int i = 0; i < model.num_layers(); ++i) {
    std::vector<float> g(job.grads(i).begin(), job.grads(i).end());
    CHECK(sums[static_cast<size_t>(i)] == model.grad_sumsq(one[0]->context(), i, g.data()));
  }
  CHECK_THROWS_AS(job.finish_gradients(one[0]->context()), CheckFailure);  // once per update
  // the update: both copies of the tied parameter stay equal; the gradients are consumed
  one.o[0]->run_update(one[0]->context(), job, {});
  CHECK(std::memcmp(job.tied_weights(0).data(), job.params(3).data() + head->offset,
                    n * sizeof(float)) == 0);
  CHECK(std::all_of(job.grads(0).begin(), job.grads(0).end(), [](float g) { return g == 0; }));
  one[0]->commit_update(job);
  CHECK(one[0]->updates() == 1);
  CHECK(std::memcmp(one[0]->tied_weights(0).data(), one[0]->params(3).data() + head->offset,
                    n * sizeof(float)) == 0);
  CHECK(std::memcmp(one[0]->tied_weights(0).data(), wte.data(), n * sizeof(float)) != 0);
}

TEST_CASE("2bw: a continued run computes its first step with the kept previous version") {
  const Model model = build_model(tiny(Arch::gpt, false));
  constexpr int d = 2, m = 2;
  const auto mbs = batches(Arch::gpt, model.options().vocab_size, 4 * m);
  Workers whole = make_workers(model, d, Mode::twobw, m);
  drive(whole, *make_2bw(d, m, 4), mbs, 0);
  Workers split = make_workers(model, d, Mode::twobw, m);
  // a fresh stage has no previous version to continue from
  CHECK_FALSE(split[0]->holds_previous());
  auto refused = split[0]->start_run(*make_2bw(d, m, 2, true), 0);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message.find("version -1, which the stage does not hold") !=
        std::string::npos);
  drive(split, *make_2bw(d, m, 2), mbs, 0);
  for (int r = 0; r < d; ++r) CHECK(split[r]->holds_previous());
  drive(split, *make_2bw(d, m, 2, true), mbs, 2 * m);
  for (int r = 0; r < d; ++r) {
    CHECK(split[r]->updates() == 4);
    for (int i = 0; i < split[r]->num_layers(); ++i) {
      CHECK(std::memcmp(split[r]->params(i).data(), whole[r]->params(i).data(),
                        split[r]->params(i).size_bytes()) == 0);
    }
  }
}

TEST_CASE("a stage worker refuses actions out of order") {
  const Model model = build_model(tiny(Arch::gpt, true));
  const Partition p = *Partition::even(model.num_layers(), 2);
  StageWorkerOptions o;
  o.mode = Mode::onef1b;
  o.stage = 1;
  o.microbatches = 2;
  o.B = kB;
  o.T = kT;
  StageWorker w(model, p, adamw(), o);
  const auto mbs = batches(Arch::gpt, model.options().vocab_size, 2);
  const Action f{1, ActionKind::F, 0, 0, 0};
  const Action b{1, ActionKind::B, 0, 0, 0};
  Tensor in = Tensor::zeros({kB, kT, model.options().width});
  CHECK_THROWS_AS(w.exec_forward(f, mbs[0], in), CheckFailure);  // no run started
  auto wrong = w.start_run(*make_gpipe(2, 2), 0);
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.error().message == "a gpipe schedule given to a 1f1b stage");
  REQUIRE(w.start_run(*make_1f1b(2, 2), 0).ok());
  CHECK_THROWS_AS(w.exec_backward(b, mbs[0], Tensor()), CheckFailure);  // B before F
  CHECK_THROWS_AS(w.exec_forward(f, mbs[0], Tensor()), CheckFailure);   // missing input
  CHECK_THROWS_AS(w.exec_forward({0, ActionKind::F, 0, 0, 0}, mbs[0], in), CheckFailure);
  const ForwardOutput out = w.exec_forward(f, mbs[0], in);
  CHECK_FALSE(out.out.defined());  // the last stage returns a loss
  CHECK(out.loss.count > 0);
  CHECK_THROWS_AS(w.exec_forward(f, mbs[0], in), CheckFailure);  // F twice
  // an in-place update under a stashed activation is refused (single policy)
  const Action opt{1, ActionKind::OPT_STEP, -1, 1, 0};
  CHECK_THROWS_AS(w.begin_update(opt), CheckFailure);
  const Action b_wrong{1, ActionKind::B, 0, 1, 0};  // version 1 does not exist yet
  CHECK_THROWS_AS(w.exec_backward(b_wrong, mbs[0], Tensor()), CheckFailure);
  CHECK(w.exec_backward(b, mbs[0], Tensor()).defined());  // the gradient of the stage's input
  CHECK(w.in_flight() == 0);
  CHECK_THROWS_AS(w.begin_update({1, ActionKind::OPT_STEP, -1, 2, 0}), CheckFailure);  // v2
  // while the update is open: the version it writes in place is not there to compute with
  const Action f1{1, ActionKind::F, 1, 0, 0};
  CHECK_FALSE(w.waits_for_update(f1));
  UpdateJob& job = w.begin_update(opt);
  CHECK(w.update_open());
  CHECK(w.waits_for_update(f1));
  CHECK(w.waits_for_update(opt));
  CHECK_FALSE(w.waits_for_update({1, ActionKind::FLUSH, -1, 0, 0}));
  CHECK_THROWS_AS(w.exec_forward(f1, mbs[1], in), CheckFailure);
  CHECK_THROWS_AS(w.begin_update(opt), CheckFailure);  // one update at a time
  CHECK_FALSE(w.start_run(*make_1f1b(2, 2), 2).ok());
  // the protocol's steps in order, each once, by the stage's own shard
  OptimizerShard shard(model, p, 1, adamw());
  OptimizerShard other(model, p, 0, adamw());
  CHECK_THROWS_AS(shard.run_update(w.context(), job, {}), CheckFailure);  // not finished
  CHECK_THROWS_AS(w.commit_update(job), CheckFailure);                    // not applied
  job.finish_gradients(w.context());
  CHECK_THROWS_AS(other.run_update(w.context(), job, {}), CheckFailure);  // another stage's
  shard.run_update(w.context(), job, {});
  CHECK_THROWS_AS(shard.run_update(w.context(), job, {}), CheckFailure);  // twice
  w.commit_update(job);
  CHECK_THROWS_AS(w.commit_update(job), CheckFailure);  // twice
  CHECK_FALSE(w.update_open());
  CHECK(w.updates() == 1);
  CHECK_FALSE(w.waits_for_update(f1));
}

TEST_CASE("output tensors go to the next stage without copies and are reused once dropped") {
  const Model model = build_model(tiny(Arch::gpt, true));
  const Partition p = *Partition::even(model.num_layers(), 2);
  StageWorkerOptions o;
  o.mode = Mode::gpipe;
  o.stage = 0;
  o.microbatches = 2;
  o.B = kB;
  o.T = kT;
  StageWorker w(model, p, adamw(), o);
  CHECK(w.stash_slots() == 2);
  const auto mbs = batches(Arch::gpt, model.options().vocab_size, 2);
  const Schedule s = *make_gpipe(2, 2);
  REQUIRE(w.start_run(s, 0).ok());
  ForwardOutput a = w.exec_forward({0, ActionKind::F, 0, 0, 0}, mbs[0], Tensor());
  ForwardOutput b = w.exec_forward({0, ActionKind::F, 1, 0, 0}, mbs[1], Tensor());
  REQUIRE(a.out.defined());
  CHECK(a.out.storage() != b.out.storage());
  CHECK(a.out.shape() == std::vector<int64_t>{kB, kT, model.options().width});
  const void* first = a.out.storage().get();
  const Tensor g = Tensor::zeros({kB, kT, model.options().width});
  CHECK_FALSE(w.exec_backward({0, ActionKind::B, 0, 0, 0}, mbs[0], g).defined());  // stage 0
  w.exec_backward({0, ActionKind::B, 1, 0, 0}, mbs[1], g);
  OptimizerShard shard(model, p, 0, adamw());
  UpdateJob& job = w.begin_update({0, ActionKind::OPT_STEP, -1, 1, 0});
  job.finish_gradients(w.context());
  shard.run_update(w.context(), job, {});
  w.commit_update(job);
  w.exec_flush({0, ActionKind::FLUSH, -1, 0, 0});
  a = {};  // the next stage drops the first output: its storage comes back
  REQUIRE(w.start_run(s, 2).ok());
  const ForwardOutput c = w.exec_forward({0, ActionKind::F, 0, 0, 0}, mbs[0], Tensor());
  CHECK(c.out.storage().get() == first);
  CHECK(w.updates() == 1);

  o.stash_slots = 1;
  StageWorker small(model, p, adamw(), o);
  auto st = small.start_run(s, 0);
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().message.find("stashes up to 2 microbatches but the stage has 1") !=
        std::string::npos);
}

namespace {

/// Stage r of a two-stage gpipe pipeline of one microbatch of kB x kT tokens.
StageWorkerOptions gpipe_stage(int r) {
  StageWorkerOptions o;
  o.mode = Mode::gpipe;
  o.stage = r;
  o.microbatches = 1;
  o.B = kB;
  o.T = kT;
  return o;
}

/// Host memory that counts what it holds (a stand-in for a channel's send_memory()).
class CountingHostMemory final : public BackendMemory {
 public:
  Device device() const override { return Device::cpu; }
  std::string name() const override { return "counting host memory"; }
  float* allocate(size_t n) override {
    ++blocks;
    return static_cast<float*>(std::calloc(n == 0 ? 1 : n, sizeof(float)));
  }
  void release(float* p) override {
    --blocks;
    std::free(p);
  }
  void to_backend(float* dst, const float* src, size_t n) override {
    std::memcpy(dst, src, n * sizeof(float));
  }
  void to_host(float* dst, const float* src, size_t n) override {
    std::memcpy(dst, src, n * sizeof(float));
  }
  void copy(float* dst, const float* src, size_t n) override {
    std::memmove(dst, src, n * sizeof(float));
  }
  void fill_zero(float* dst, long N) override {
    std::memset(dst, 0, static_cast<size_t>(N) * sizeof(float));
  }
  void synchronize() override {}
  BackendMemory& lasting_memory() override { return *this; }
  int blocks = 0;
};

}  // namespace

TEST_CASE("a host stage allocates what it sends in the edge memory it is given, same bits") {
  // two stages with their outputs and input gradients in memories of their own (as a channel
  // that lends them hands out), against the same two stages in host memory
  const Model model = build_model(tiny(Arch::gpt, false));
  const Partition p = *Partition::even(model.num_layers(), 2);
  const auto mbs = batches(Arch::gpt, model.options().vocab_size, 1);
  const Schedule s = *make_gpipe(2, 1);
  std::vector<std::unique_ptr<StageWorker>> given, plain;
  for (int r = 0; r < 2; ++r) {
    const StageWorkerOptions o = gpipe_stage(r);
    given.push_back(std::make_unique<StageWorker>(model, p, adamw(), o));
    plain.push_back(std::make_unique<StageWorker>(model, p, adamw(), o));
  }
  CountingHostMemory forward, backward;
  given[0]->set_edge_memory(&forward, nullptr);
  given[1]->set_edge_memory(nullptr, &backward);
  CHECK(forward.blocks == given[0]->stash_slots() + 1);  // the pool starts afresh in it
  CHECK(backward.blocks == 2);
  for (auto* ws : {&given, &plain})
    for (auto& w : *ws) REQUIRE(w->start_run(s, 0).ok());
  const Action f0{0, ActionKind::F, 0, 0, 0}, f1{1, ActionKind::F, 0, 0, 0};
  const Action b1{1, ActionKind::B, 0, 0, 0}, b0{0, ActionKind::B, 0, 0, 0};
  ForwardOutput act = given[0]->exec_forward(f0, mbs[0], Tensor());
  const ForwardOutput act_plain = plain[0]->exec_forward(f0, mbs[0], Tensor());
  CHECK(act.out.memory() == &forward);
  CHECK(act_plain.out.memory() == nullptr);
  CHECK(std::memcmp(act.out.f32(), act_plain.out.f32(), act.out.nbytes()) == 0);
  CHECK(given[1]->exec_forward(f1, mbs[0], act.out).loss.sum ==
        plain[1]->exec_forward(f1, mbs[0], act_plain.out).loss.sum);
  Tensor grad = given[1]->exec_backward(b1, mbs[0], Tensor());
  const Tensor grad_plain = plain[1]->exec_backward(b1, mbs[0], Tensor());
  CHECK(grad.memory() == &backward);
  CHECK(std::memcmp(grad.f32(), grad_plain.f32(), grad.nbytes()) == 0);
  given[0]->exec_backward(b0, mbs[0], grad);
  // back to host memory: the pools' own tensors go, the ones still held stay where they are
  given[0]->set_edge_memory(nullptr, nullptr);
  given[1]->set_edge_memory(nullptr, nullptr);
  CHECK(forward.blocks == 1);   // `act`
  CHECK(backward.blocks == 1);  // `grad`
  act = {};
  grad = Tensor();
  CHECK(forward.blocks == 0);
  CHECK(backward.blocks == 0);
}

TEST_CASE("off the host, the tensors between stages stay in the device's lasting memory") {
  // two stages on checked devices (memory closed to the host) and the same two on the CPU: the
  // activation and the gradient that cross the edge are in the checked device's lasting memory,
  // never host memory, and carry the CPU's bits
  const Model model = build_model(tiny(Arch::gpt, false));
  const Partition p = *Partition::even(model.num_layers(), 2);
  const auto mbs = batches(Arch::gpt, model.options().vocab_size, 1);
  const Schedule s = *make_gpipe(2, 1);
  Context c0(1), c1(1);
  CheckedBackend d0(c0), d1(c1);
  std::vector<std::unique_ptr<StageWorker>> dev, cpu;
  for (int r = 0; r < 2; ++r) {
    StageWorkerOptions o = gpipe_stage(r);
    cpu.push_back(std::make_unique<StageWorker>(model, p, adamw(), o));
    o.backend = r == 0 ? &d0 : &d1;
    dev.push_back(std::make_unique<StageWorker>(model, p, adamw(), o));
  }
  for (auto* ws : {&dev, &cpu})
    for (auto& w : *ws) REQUIRE(w->start_run(s, 0).ok());
  BackendMemory& lasting = d0.lasting_memory();
  const Action f0{0, ActionKind::F, 0, 0, 0}, f1{1, ActionKind::F, 0, 0, 0};
  const Action b1{1, ActionKind::B, 0, 0, 0}, b0{0, ActionKind::B, 0, 0, 0};
  const ForwardOutput act = dev[0]->exec_forward(f0, mbs[0], Tensor());
  const ForwardOutput act_cpu = cpu[0]->exec_forward(f0, mbs[0], Tensor());
  CHECK(act.out.memory() == &lasting);
  CHECK_FALSE(act.out.host_readable());
  CHECK(std::memcmp(host_copy(act.out).f32(), act_cpu.out.f32(), act_cpu.out.nbytes()) == 0);
  const ForwardOutput loss = dev[1]->exec_forward(f1, mbs[0], act.out);
  const ForwardOutput loss_cpu = cpu[1]->exec_forward(f1, mbs[0], act_cpu.out);
  CHECK(loss.loss.sum == loss_cpu.loss.sum);
  const Tensor grad = dev[1]->exec_backward(b1, mbs[0], Tensor());
  const Tensor grad_cpu = cpu[1]->exec_backward(b1, mbs[0], Tensor());
  CHECK(grad.memory() == &lasting);
  CHECK(std::memcmp(host_copy(grad).f32(), grad_cpu.f32(), grad_cpu.nbytes()) == 0);
  dev[0]->exec_backward(b0, mbs[0], grad);
  cpu[0]->exec_backward(b0, mbs[0], grad_cpu);
  for (int i = 0; i < dev[0]->num_layers(); ++i) {
    std::vector<float> g(dev[0]->grads(i).size());
    dev[0]->memory().to_host(g.data(), dev[0]->grads(i).data(), g.size());
    CHECK(std::memcmp(g.data(), cpu[0]->grads(i).data(), g.size() * sizeof(float)) == 0);
  }
}

// ---- recompute ------------------------------------------------------------------------------

namespace {

// Every stage's parameters and optimizer state, and its gradients.
std::vector<std::vector<float>> state_of(Workers& ws) {
  std::vector<std::vector<float>> out;
  for (size_t r = 0; r < ws.size(); ++r) {
    for (int i = 0; i < ws[r]->num_layers(); ++i) {
      out.emplace_back(ws[r]->params(i).begin(), ws[r]->params(i).end());
      out.emplace_back(ws.o[r]->state(i).begin(), ws.o[r]->state(i).end());
      out.emplace_back(ws[r]->grads(i).begin(), ws[r]->grads(i).end());
    }
  }
  return out;
}

bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].size() != b[k].size() ||
        std::memcmp(a[k].data(), b[k].data(), a[k].size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

}  // namespace

TEST_CASE("recompute: every mode computes the bits of no recompute, one pass or split") {
  struct Case {
    Mode mode;
    int d, m, steps;
  };
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    const Model model = build_model(tiny(arch, false));
    const int n = model.num_layers();
    const std::vector<bool> none(static_cast<size_t>(n), false), all(static_cast<size_t>(n), true);
    // blocks and head only; the first stage's first layer and a middle one
    const std::vector<bool> some{false, true, false, true}, first{true, false, true, false};
    for (const Case c :
         {Case{Mode::gpipe, 2, 3, 1}, Case{Mode::onef1b, 3, 4, 1}, Case{Mode::twobw, 3, 3, 3},
          Case{Mode::pipedream, 3, 1, 7}, Case{Mode::xpipe, 3, 2, 3}}) {
      CAPTURE(to_string(c.mode));
      CAPTURE((arch == Arch::gpt ? "gpt" : "bert"));
      const Schedule s = c.mode == Mode::pipedream ? *make_pipedream(c.d, c.steps)
                                                   : *make_schedule(c.mode, c.d, c.m, c.steps);
      const auto mbs = batches(arch, model.options().vocab_size, 2 * s.total_microbatches());
      Workers base = make_workers(model, c.d, c.mode, c.m, 1, none);
      drive(base, s, mbs, 0);
      drive(base, s, mbs, s.total_microbatches());
      const auto want = state_of(base);
      for (const auto* flags : {&all, &some, &first}) {
        for (Backward backward : {Backward::one_pass, Backward::split}) {
          CAPTURE((flags == &all ? "all" : flags == &some ? "{1, 3}" : "{0, 2}"));
          CAPTURE((backward == Backward::split ? "split" : "one pass"));
          Workers ws = make_workers(model, c.d, c.mode, c.m, 1, *flags);
          drive(ws, s, mbs, 0, Apply::at_once, nullptr, backward);
          // the second run allocates nothing: the scratch is allocated once
          CHECK(drive(ws, s, mbs, s.total_microbatches(), Apply::at_once, nullptr, backward) == 0);
          CHECK(same_bits(state_of(ws), want));
        }
      }
    }
  }
}

TEST_CASE("recompute: the stash holds only the recomputed layers' inputs (bytes allocated)") {
  const Model model = build_model(tiny(Arch::gpt, false));
  const int n = model.num_layers();
  const size_t bth = static_cast<size_t>(kB) * kT * model.options().width;
  for (Mode mode : {Mode::gpipe, Mode::xpipe}) {
    CAPTURE(to_string(mode));
    const int d = 2, m = 4;
    Workers none = make_workers(model, d, mode, m, 1, std::vector<bool>(static_cast<size_t>(n)));
    Workers all =
        make_workers(model, d, mode, m, 1, std::vector<bool>(static_cast<size_t>(n), true));
    for (size_t r = 0; r < static_cast<size_t>(d); ++r) {
      CAPTURE(r);
      const StageWorker& a = *none[r];
      const StageWorker& b = *all[r];
      REQUIRE(a.stash_slots() == b.stash_slots());
      const size_t slots = static_cast<size_t>(a.stash_slots());
      size_t saved = 0, params = 0;
      for (int i = 0; i < a.num_layers(); ++i) {
        saved += model.layer(a.first_layer() + i).saved_floats(kB, kT);
        params += model.layer(a.first_layer() + i).param_floats();
        CHECK_FALSE(a.recomputes(i));
        CHECK(b.recomputes(i));
      }
      const size_t hidden = static_cast<size_t>(a.num_layers() - 1) * bth;
      // no recompute: every slot holds the hidden outputs and every layer's saved activations
      CHECK(a.stash_bytes() == slots * (hidden + saved) * sizeof(float));
      CHECK(a.recompute_scratch_bytes() == 0);
      // all recomputed: the slots keep the inputs (hidden outputs) only, plus in xpipe the
      // weights the forward used; one microbatch's saved activations live in the scratch
      const size_t weights = mode == Mode::xpipe ? params : 0;
      CHECK(b.stash_bytes() == slots * (hidden + weights) * sizeof(float));
      CHECK(b.recompute_scratch_bytes() == (saved + bth) * sizeof(float));
      if (mode == Mode::gpipe) {
        CHECK(b.stash_bytes() + b.recompute_scratch_bytes() < a.stash_bytes());
      }
    }
  }
}

TEST_CASE("scratch given away and taken back from other stages' buffers computes the same bits") {
  const Model model = build_model(tiny(Arch::gpt, false));
  const int n = model.num_layers();
  const std::vector<bool> none(static_cast<size_t>(n), false), some{false, true, false, true};
  for (Mode mode : {Mode::onef1b, Mode::twobw, Mode::xpipe}) {
    for (const auto* flags : {&none, &some}) {
      CAPTURE(to_string(mode));
      CAPTURE(std::string(flags == &none ? "no recompute" : "recompute {1, 3}"));
      const Schedule s = *make_schedule(mode, 3, 3, is_synchronous(mode) ? 1 : 3);
      const auto mbs = batches(Arch::gpt, model.options().vocab_size, 2 * s.total_microbatches());
      Workers base = make_workers(model, 3, mode, 3, 1, *flags);
      drive(base, s, mbs, 0);
      drive(base, s, mbs, s.total_microbatches());

      Workers ws = make_workers(model, 3, mode, 3, 1, *flags);
      drive(ws, s, mbs, 0);
      ScratchPool pool;
      for (size_t r = 0; r < ws.size(); ++r) {
        ws[r]->give_scratch(pool);
        CHECK_FALSE(ws[r]->holds_scratch());
        CHECK(ws[r]->stash_bytes() == 0);
      }
      CHECK(pool.bytes_kept() > 0);
      // a stage without its scratch runs nothing
      auto refused = ws[0]->start_run(s, s.total_microbatches());
      REQUIRE_FALSE(refused.ok());
      CHECK(refused.error().message.find("scratch buffers were given away") != std::string::npos);
      // the last stage first: each takes buffers another stage computed in (dirty)
      for (size_t r = ws.size(); r-- > 0;) ws[r]->take_scratch(pool);
      CHECK(pool.bytes_allocated() == 0);  // every buffer came back from the pool
      CHECK(pool.bytes_reused() > 0);
      drive(ws, s, mbs, s.total_microbatches());
      CHECK(same_bits(state_of(ws), state_of(base)));
    }
  }
}
