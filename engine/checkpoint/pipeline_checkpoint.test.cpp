// Pipeline checkpoint tests on the serial executor: N steps + checkpoint + resume + N steps equal
// 2N steps bitwise (pipedream, xpipe: with the same run boundary); other stage counts; refusals.
#include "engine/checkpoint/pipeline_checkpoint.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <string>
#include <vector>

#include "engine/config/config.hpp"
#include "engine/data/loader.hpp"
#include "engine/execution/serial_executor.hpp"
#include "engine/execution/stage_worker.hpp"
#include "kernels/bf16.hpp"
#include "kernels/checked_backend.hpp"
#include "tests/support/bf16_skip.hpp"
#include "tests/support/bits.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

Config tiny_config(const std::string& mode, int stages, Arch arch = Arch::gpt) {
  Config c = testing::tiny_config(mode, stages, 4, tiny_model(arch, true, 5));  // 2bw needs m >= d
  c.optimizer = clipped_adamw();  // tiny models clip at every step: the clip path is exercised
  c.optimizer.warmup_steps = 2;
  REQUIRE_MESSAGE(validate(c).ok(), validate(c).error().message);
  return c;
}

// A pipeline and its data stream, as a trainer holds them.
struct Pipeline {
  std::unique_ptr<SerialExecutor> exec;
  std::unique_ptr<DataLoader> data;
  std::vector<double> losses;

  explicit Pipeline(const Config& c) {
    auto e = SerialExecutor::create(c);
    REQUIRE_MESSAGE(e.ok(), e.error().message);
    exec = std::move(*e);
    const int T = c.pipeline.seq_len > 0 ? c.pipeline.seq_len : c.model.context;
    auto d =
        DataLoader::open(c.data, c.model.arch, c.model.vocab_size, c.pipeline.microbatch_size, T);
    REQUIRE_MESSAGE(d.ok(), d.error().message);
    data = std::move(*d);
  }
  void run(int steps) {
    auto l = exec->run(steps, *data);
    REQUIRE_MESSAGE(l.ok(), l.error().message);
    losses.insert(losses.end(), l->begin(), l->end());
  }
  std::vector<StageWorker*> workers() {
    std::vector<StageWorker*> w;
    for (int r = 0; r < exec->stages(); ++r) w.push_back(&exec->worker(r));
    return w;
  }
  std::vector<OptimizerShard*> shards() {
    std::vector<OptimizerShard*> o;
    for (int r = 0; r < exec->stages(); ++r) o.push_back(&exec->optimizer(r));
    return o;
  }
  std::string save(const Config& c, const std::string& dir, int64_t step) {
    auto ws = workers();
    auto os = shards();
    auto p = save_pipeline_checkpoint(dir, c, {step, data->position(), false}, ws, os);
    REQUIRE_MESSAGE(p.ok(), p.error().message);
    return *p;
  }
  Status load(const Config& c, const std::string& path) {
    auto ckpt = load_checkpoint(path);
    REQUIRE_MESSAGE(ckpt.ok(), ckpt.error().message);
    if (Status ok = check_resume(ckpt->info, c); !ok) return ok;
    auto ws = workers();
    auto os = shards();
    if (Status ok = load_pipeline_checkpoint(*ckpt, ws, os); !ok) return ok;
    data->seek(ckpt->info.data_position);
    return {};
  }
};

// Parameters and optimizer state of every layer, wherever it lives, agree bit for bit.
void check_same_state(Pipeline& a, Pipeline& b) {
  const Partition& pa = a.exec->partition();
  const Partition& pb = b.exec->partition();
  REQUIRE(pa.num_layers() == pb.num_layers());
  for (int i = 0; i < pa.num_layers(); ++i) {
    CAPTURE(i);
    CHECK(same_bits(a.exec->params(i), b.exec->params(i)));
    const int ra = pa.stage_of(i), rb = pb.stage_of(i);
    CHECK(same_bits(a.exec->optimizer(ra).state(i - pa.begin(ra)),
                    b.exec->optimizer(rb).state(i - pb.begin(rb))));
  }
  for (int r = 0; r < b.exec->stages(); ++r)
    CHECK(b.exec->worker(r).updates() == a.exec->worker(0).updates());
  CHECK(a.data->position() == b.data->position());
}

// The rotation's four arrays of layer 1's qkv matrix in a checkpoint: the rows' side's
// covariance and basis of shape `left`, the columns' side's of shape `right`.
void check_qkv_rotation(const CheckpointContents& ckpt, const std::vector<int64_t>& left,
                        const std::vector<int64_t>& right) {
  for (const char* suffix :
       {"rotation_left_cov", "rotation_right_cov", "rotation_left_basis", "rotation_right_basis"}) {
    CAPTURE(suffix);
    const NamedTensor* t =
        find_tensor(ckpt.optimizer, std::string("layers.1.attn.qkv.weight.") + suffix);
    REQUIRE(t != nullptr);
    CHECK(t->shape == (std::string(suffix).find("left") != std::string::npos ? left : right));
  }
}

// The message with which a pipeline of `other` refuses a checkpoint written by one of `c` after
// one step ("" if it loads).
std::string load_refusal(const Config& c, const Config& other) {
  TempDir dir;
  Pipeline first(c);
  first.run(1);
  const auto path = first.save(c, dir.str(), 1);
  Pipeline second(other);
  const Status refused = second.load(other, path);
  return refused.ok() ? std::string() : refused.error().message;
}

}  // namespace

TEST_CASE("gpipe and 1f1b: 2N steps equal N steps + checkpoint + resume + N steps, bitwise") {
  constexpr int N = 3;
  for (const char* mode : {"gpipe", "1f1b"}) {
    for (Arch arch : {Arch::gpt, Arch::bert}) {
      const std::string what = std::string(mode) + (arch == Arch::gpt ? " gpt" : " bert");
      CAPTURE(what);
      const Config c = tiny_config(mode, 2, arch);
      TempDir dir;
      Pipeline whole(c);
      whole.run(2 * N);

      Pipeline first(c);
      first.run(N);
      const std::string path = first.save(c, dir.str(), N);
      CHECK(path == (dir.path / "step-3").string());

      Pipeline resumed(c);
      Status ok = resumed.load(c, dir.str());  // the directory: its latest checkpoint
      REQUIRE_MESSAGE(ok.ok(), ok.error().message);
      resumed.run(N);
      check_same_state(whole, resumed);
      CHECK(same_bits(std::vector<double>(whole.losses.begin() + N, whole.losses.end()),
                      resumed.losses));
    }
  }
}

TEST_CASE("2bw: 2N steps equal N steps + checkpoint + resume + N steps, bitwise") {
  constexpr int N = 3;
  for (int stages : {2, 3}) {
    for (bool tied : {true, false}) {
      CAPTURE(stages);
      CAPTURE(tied);
      Config c = tiny_config("2bw", stages);
      c.model.tied = tied;  // tied: the head's copy follows the embedding's owner across stages
      TempDir dir;
      Pipeline whole(c);
      whole.run(2 * N);

      Pipeline first(c);
      first.run(N);
      first.save(c, dir.str(), N);
      Pipeline resumed(c);
      Status ok = resumed.load(c, dir.str());
      REQUIRE_MESSAGE(ok.ok(), ok.error().message);
      for (int r = 0; r < stages; ++r) CHECK(resumed.exec->worker(r).holds_previous());
      resumed.run(N);
      check_same_state(whole, resumed);
      CHECK(same_bits(std::vector<double>(whole.losses.begin() + N, whole.losses.end()),
                      resumed.losses));
    }
  }
}

TEST_CASE(
    "2bw: a checkpoint without the previous version resumes with a run that drains and "
    "refills") {
  constexpr int N = 3;
  const Config c = tiny_config("2bw", 2);
  TempDir dir;
  Pipeline first(c);
  first.run(N);
  first.save(c, dir.str(), N);
  auto ckpt = load_checkpoint(dir.str());
  REQUIRE_MESSAGE(ckpt.ok(), ckpt.error().message);
  ckpt->versions.clear();  // as a checkpoint of another mode
  Pipeline resumed(c);
  auto ws = resumed.workers();
  auto os = resumed.shards();
  Status ok = load_pipeline_checkpoint(*ckpt, ws, os);
  REQUIRE_MESSAGE(ok.ok(), ok.error().message);
  resumed.data->seek(ckpt->info.data_position);
  CHECK_FALSE(resumed.exec->worker(0).holds_previous());
  resumed.run(N);
  // its first step computes with the newest weights: the continued run differs
  Pipeline whole(c);
  whole.run(2 * N);
  CHECK(resumed.exec->worker(0).updates() == whole.exec->worker(0).updates());
  bool all_equal = true;
  for (int i = 0; i < c.model.depth + 2; ++i)
    all_equal = all_equal && same_bits(whole.exec->params(i), resumed.exec->params(i));
  CHECK_FALSE(all_equal);
}

TEST_CASE("pipedream and xpipe: a resume drains and refills, exactly like a run boundary") {
  constexpr int N = 4;
  for (const char* mode : {"pipedream", "xpipe"}) {
    const std::string what = mode;
    CAPTURE(what);
    const Config c = tiny_config(mode, 3);
    TempDir dir;
    // the reference: the same pipeline, drained after N steps and refilled
    Pipeline split(c);
    split.run(N);
    split.run(N);

    Pipeline first(c);
    first.run(N);
    first.save(c, dir.str(), N);
    Pipeline resumed(c);
    Status ok = resumed.load(c, (dir.path / "step-4").string());
    REQUIRE_MESSAGE(ok.ok(), ok.error().message);
    resumed.run(N);
    check_same_state(split, resumed);
    CHECK(same_bits(std::vector<double>(split.losses.begin() + N, split.losses.end()),
                    resumed.losses));

    // the drain is visible: without the boundary the stale-weight warm-up of the second half
    // does not happen and the weights differ
    Pipeline whole(c);
    whole.run(2 * N);
    bool all_equal = true;
    for (int i = 0; i < c.model.depth + 2; ++i)
      all_equal = all_equal && same_bits(whole.exec->params(i), split.exec->params(i));
    CHECK_FALSE(all_equal);
  }
}

TEST_CASE("sync modes: a checkpoint saved at d stages continues bitwise at d' stages") {
  constexpr int N = 2;
  struct Case {
    const char* mode;
    int from, to;
  };
  for (const Case& k : {Case{"1f1b", 2, 4}, Case{"gpipe", 3, 1}, Case{"1f1b", 1, 3}}) {
    const std::string what = k.mode;
    CAPTURE(what);
    CAPTURE(k.from);
    CAPTURE(k.to);
    const Config a = tiny_config(k.mode, k.from);
    Config b = tiny_config(k.mode, k.to);
    TempDir dir;
    Pipeline whole(a);
    whole.run(2 * N);
    Pipeline first(a);
    first.run(N);
    first.save(a, dir.str(), N);
    Pipeline resumed(b);
    Status ok = resumed.load(b, dir.str());
    REQUIRE_MESSAGE(ok.ok(), ok.error().message);
    resumed.run(N);
    check_same_state(whole, resumed);
    CHECK(same_bits(std::vector<double>(whole.losses.begin() + N, whole.losses.end()),
                    resumed.losses));
  }
}

TEST_CASE("the checkpoint holds layer-granular tensors, optimizer state and the manifest fields") {
  const Config c = tiny_config("2bw", 2);
  TempDir dir;
  Pipeline p(c);
  p.run(3);
  const std::string path = p.save(c, dir.str(), 3);
  auto ckpt = load_checkpoint(path);
  REQUIRE(ckpt.ok());
  const Model& model = p.exec->model();
  size_t slots = 0;
  for (int i = 0; i < model.num_layers(); ++i) {
    const auto params = p.exec->params(i);
    for (const ParamSlot& s : model.layer(i).slots()) {
      ++slots;
      const std::string name = model.param_name(i, s);
      const NamedTensor* t = find_tensor(ckpt->model, name);
      REQUIRE_MESSAGE(t, name);
      CHECK(t->shape == s.shape);
      CHECK(same_bits(t->f32, params.subspan(s.offset, s.numel)));
      CHECK(find_tensor(ckpt->optimizer, name + ".adam_m"));
      CHECK(find_tensor(ckpt->optimizer, name + ".adam_v"));
    }
  }
  CHECK(ckpt->model.size() == slots);
  CHECK(ckpt->optimizer.size() == 2 * slots);
  // every version a stage still holds besides the newest is saved under <param>@v<k>
  size_t older = 0;
  for (int r = 0; r < p.exec->stages(); ++r) {
    const WeightStore& store = p.exec->worker(r).store();
    for (int v : store.versions()) {
      if (v == store.latest()) continue;
      const int first = p.exec->worker(r).first_layer();
      for (int i = 0; i < p.exec->worker(r).num_layers(); ++i) {
        const ParamSlot& s = model.layer(first + i).slots().front();
        const NamedTensor* t =
            find_tensor(ckpt->versions, model.param_name(first + i, s) + "@v" + std::to_string(v));
        REQUIRE(t);
        CHECK(same_bits(t->f32, store.params(v, i).subspan(s.offset, s.numel)));
        older += model.layer(first + i).slots().size();
      }
    }
  }
  CHECK(ckpt->versions.size() == older);
  CHECK(older == slots);  // 2bw: every stage still holds W(t-1) beside W(t)
  CHECK(ckpt->info.step == 3);
  CHECK(ckpt->info.data_position == 12);
  CHECK(ckpt->info.mode == "2bw");
  CHECK(ckpt->info.stages == 2);
  CHECK(ckpt->info.extra.at("updates") == "3");
  CHECK(ckpt->info.rng_state == std::vector<uint64_t>{c.train.seed, c.data.seed});
}

TEST_CASE("a checkpoint's bytes are counted without copying a stage's memory out") {
  // 2bw keeps an older version; on the checked device every copy out of a stage's memory is an
  // op of its backend
  for (const char* device : {"cpu", "checked"}) {
    CAPTURE(std::string(device));
    Config c = tiny_config("2bw", 2);
    c.pipeline.device = device;
    Pipeline p(c);
    p.run(2);
    auto ws = p.workers();
    auto os = p.shards();
    std::vector<long> ops;
    for (StageWorker* w : ws) {
      auto* checked = dynamic_cast<CheckedBackend*>(&w->context().backend());
      ops.push_back(checked != nullptr ? checked->ops() : 0);
    }
    auto bytes = pipeline_checkpoint_bytes(ws, os);
    REQUIRE_MESSAGE(bytes.ok(), bytes.error().message);
    for (size_t r = 0; r < ws.size(); ++r) {
      auto* checked = dynamic_cast<CheckedBackend*>(&ws[r]->context().backend());
      CHECK((checked != nullptr) == (std::string(device) == "checked"));
      if (checked != nullptr) CHECK(checked->ops() == ops[r]);
    }
    auto refs = pipeline_checkpoint_refs(ws, os);
    REQUIRE(refs.ok());
    CHECK(*bytes == tensor_bytes(*refs));
    CHECK_FALSE(refs->versions.empty());
  }
}

TEST_CASE("SGD state is saved as momentum and resumes bitwise") {
  Config c = tiny_config("1f1b", 2);
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 0.1f;
  TempDir dir;
  Pipeline whole(c);
  whole.run(4);
  Pipeline first(c);
  first.run(2);
  auto path = first.save(c, dir.str(), 2);
  auto ckpt = load_checkpoint(path);
  REQUIRE(ckpt.ok());
  CHECK(find_tensor(ckpt->optimizer, "layers.1.attn.qkv.weight.momentum"));
  CHECK_FALSE(find_tensor(ckpt->optimizer, "layers.1.attn.qkv.weight.adam_m"));
  Pipeline resumed(c);
  REQUIRE(resumed.load(c, path).ok());
  resumed.run(2);
  check_same_state(whole, resumed);
}

TEST_CASE("2bw with the dc correction resumes bitwise: the kept previous version gives its delta") {
  // the first update after the resume compensates with W(N) − W(N−1), the restored previous
  // version; SGD's mean square of dc is saved beside its momentum
  constexpr int N = 3;
  for (const char* kind : {"adamw", "sgd"}) {
    CAPTURE(kind);
    Config c = tiny_config("2bw", 2);
    c.optimizer.kind = kind;
    if (c.optimizer.kind == "sgd") c.optimizer.lr = 0.1f;
    c.optimizer.delay_correction = "dc";
    c.optimizer.dc_lambda = 50.0f;
    TempDir dir;
    Pipeline whole(c);
    whole.run(2 * N);
    Pipeline first(c);
    first.run(N);
    auto path = first.save(c, dir.str(), N);
    auto ckpt = load_checkpoint(path);
    REQUIRE(ckpt.ok());
    CHECK(static_cast<bool>(
              find_tensor(ckpt->optimizer, "layers.1.attn.qkv.weight.dc_mean_square")) ==
          (c.optimizer.kind == "sgd"));
    Pipeline resumed(c);
    Status ok = resumed.load(c, path);
    REQUIRE_MESSAGE(ok.ok(), ok.error().message);
    resumed.run(N);
    check_same_state(whole, resumed);
    CHECK(same_bits(std::vector<double>(whole.losses.begin() + N, whole.losses.end()),
                    resumed.losses));
  }
}

// Saves a run of c after N steps, resumes it in a new pipeline for N more and checks that it
// ends with the bits of the uninterrupted run: one run of 2N steps for 2bw (it keeps its previous
// version across a run boundary), two runs of N for the other modes (they drain and refill at a
// resume as at a boundary). Returns the checkpoint's contents.
CheckpointContents check_resumes_bitwise(const Config& c, int N) {
  TempDir dir;
  Pipeline whole(c);
  if (c.pipeline.mode == "2bw") {
    whole.run(2 * N);
  } else {
    whole.run(N);
    whole.run(N);
  }
  Pipeline first(c);
  first.run(N);
  auto path = first.save(c, dir.str(), N);
  auto ckpt = load_checkpoint(path);
  REQUIRE(ckpt.ok());
  Pipeline resumed(c);
  Status ok = resumed.load(c, path);
  REQUIRE_MESSAGE(ok.ok(), ok.error().message);
  resumed.run(N);
  check_same_state(whole, resumed);
  CHECK(
      same_bits(std::vector<double>(whole.losses.begin() + N, whole.losses.end()), resumed.losses));
  return std::move(*ckpt);
}

TEST_CASE("2bw and pipedream with the secant correction resume bitwise: its state is saved") {
  // the first update after the resume pairs its gradient with the saved previous gradient and
  // weights, and continues the saved running means; without them the resumed run would differ
  for (const char* mode : {"2bw", "pipedream"}) {
    for (const char* kind : {"adamw", "sgd"}) {
      INFO(mode << " " << kind);
      Config c = tiny_config(mode, 2);
      c.optimizer.kind = kind;
      if (c.optimizer.kind == "sgd") c.optimizer.lr = 0.1f;
      c.optimizer.delay_correction = "secant+nesterov";
      const CheckpointContents ckpt = check_resumes_bitwise(c, 3);
      for (const char* suffix : {"secant_weights", "secant_grad", "secant_num", "secant_den"})
        CHECK(find_tensor(ckpt.optimizer, std::string("layers.1.attn.qkv.weight.") + suffix));
    }
  }
}

TEST_CASE("basis rotation resumes bitwise: its covariances and eigenvectors are saved") {
  // the resumed run goes on rotating with the saved eigenvectors until its next refresh, and
  // the saved covariances feed that refresh; without them the resumed run would differ.
  // rotation_every 2 after N = 3 updates: the first update after the resume keeps the saved
  // basis, the second refreshes it
  for (const char* mode : {"1f1b", "2bw", "pipedream", "xpipe"}) {
    INFO(std::string(mode));
    Config c = tiny_config(mode, 2);
    c.optimizer.basis_rotation = true;
    c.optimizer.rotation_every = 2;
    const CheckpointContents ckpt = check_resumes_bitwise(c, 3);
    const int64_t C = c.model.width;  // qkv: (3C, C)
    check_qkv_rotation(ckpt, {3 * C, 3 * C}, {C, C});
    CHECK(find_tensor(ckpt.optimizer, "layers.1.ln1.weight.rotation_left_cov") == nullptr);
    // a run without the rotation refuses such a checkpoint: its v is in the rotated basis
    Config plain = c;
    plain.optimizer.basis_rotation = false;
    CHECK(load_refusal(c, plain).find("written with optimizer.basis_rotation = true "
                                      "(rotation_max_dim 1024, rotation_block 0), the stages use "
                                      "basis_rotation = false") != std::string::npos);
  }
}

TEST_CASE("basis rotation saves AdamW's m in the rotated basis and refuses one that is not") {
  // a matrix that rotates keeps M' (kernels/basis_rotation.hpp), saved as adam_m_rotated; a
  // checkpoint that holds its m in the coordinates (adam_m, as written before M' was kept) is
  // refused by name instead of being read as M'
  Config c = tiny_config("pipedream", 2);
  c.optimizer.basis_rotation = true;
  TempDir dir;
  Pipeline first(c);
  first.run(1);
  auto ckpt = load_checkpoint(first.save(c, dir.str(), 1));
  REQUIRE_MESSAGE(ckpt.ok(), ckpt.error().message);
  const std::string qkv = "layers.1.attn.qkv.weight";
  CHECK(find_tensor(ckpt->optimizer, qkv + ".adam_m_rotated") != nullptr);
  CHECK(find_tensor(ckpt->optimizer, qkv + ".adam_m") == nullptr);
  CHECK(find_tensor(ckpt->optimizer, "layers.1.ln1.weight.adam_m") != nullptr);  // no rotation
  CHECK(find_tensor(ckpt->optimizer, "layers.1.ln1.weight.adam_m_rotated") == nullptr);
  for (NamedTensor& t : ckpt->optimizer)
    if (t.name == qkv + ".adam_m_rotated") t.name = qkv + ".adam_m";
  TempDir old;
  auto path = save_checkpoint(old.str(), *ckpt);
  REQUIRE_MESSAGE(path.ok(), path.error().message);
  Pipeline second(c);
  const Status refused = second.load(c, *path);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message.find("has no tensor " + qkv + ".adam_m_rotated") !=
        std::string::npos);
}

TEST_CASE("basis rotation in blocks resumes bitwise, its blocks saved flat") {
  // qkv (3C, C) in blocks of C / 2: both sides in blocks, 6 and 2 of (C/2)² floats
  for (const char* mode : {"2bw", "xpipe"}) {
    INFO(std::string(mode));
    Config c = tiny_config(mode, 2);
    c.optimizer.basis_rotation = true;
    c.optimizer.rotation_every = 2;
    const int64_t C = c.model.width, b = C / 2;
    c.optimizer.rotation_block = static_cast<int>(b);
    const CheckpointContents ckpt = check_resumes_bitwise(c, 3);
    check_qkv_rotation(ckpt, {6 * b * b}, {2 * b * b});
    // another block size is another basis: refused, naming both
    Config whole = c;
    whole.optimizer.rotation_block = 0;
    CHECK(load_refusal(c, whole).find(fmt::format("rotation_block {}), the stages use "
                                                  "basis_rotation = true (rotation_max_dim 1024, "
                                                  "rotation_block 0)",
                                                  b)) != std::string::npos);
  }
}

TEST_CASE("2bw with a bf16 stash resumes bitwise, and its checkpoint resumes an f32 stash too") {
  if (actorpipe::testing::skip_without_bf16()) return;
  // the previous version's linear weights are saved as their bf16 values: what the products of
  // either stash read, so both continue with the uninterrupted run's bits
  constexpr int N = 3;
  Config c = tiny_config("2bw", 2);
  c.model.width = 64;
  c.model.heads = 4;
  c.pipeline.precision = "bf16";
  Config f = c;
  c.pipeline.stash_precision = "bf16";
  REQUIRE_MESSAGE(validate(c).ok(), validate(c).error().message);
  TempDir dir;
  Pipeline whole(c), whole_f32(f);
  whole.run(2 * N);
  whole_f32.run(2 * N);
  CHECK(same_bits(whole.losses, whole_f32.losses));
  check_same_state(whole, whole_f32);

  Pipeline first(c), first_f32(f);
  first.run(N);
  first_f32.run(N);
  TempDir dir_f32;
  const std::string path = first.save(c, dir.str(), N);
  first_f32.save(f, dir_f32.str(), N);
  auto saved = load_checkpoint(path), saved_f32 = load_checkpoint(dir_f32.str());
  REQUIRE(saved.ok());
  REQUIRE(saved_f32.ok());
  const std::string name = fmt::format("layers.1.attn.qkv.weight@v{}", N - 1);
  const NamedTensor* kept = find_tensor(saved->versions, name);
  const NamedTensor* full = find_tensor(saved_f32->versions, name);
  REQUIRE(kept != nullptr);
  REQUIRE(full != nullptr);
  REQUIRE(kept->f32.size() == full->f32.size());
  bool rounded = true;
  for (size_t k = 0; k < kept->f32.size(); ++k)
    rounded = rounded && kept->f32[k] == round_bf16(full->f32[k]);
  CHECK(rounded);
  // a bias of the previous version and the newest weights are saved exactly
  const std::string bias = fmt::format("layers.1.attn.qkv.bias@v{}", N - 1);
  CHECK(same_bits(find_tensor(saved->versions, bias)->f32,
                  find_tensor(saved_f32->versions, bias)->f32));
  CHECK(same_bits(saved->model.front().f32, saved_f32->model.front().f32));

  for (const Config* resume_as : {&c, &f}) {
    CAPTURE(resume_as->pipeline.stash_precision);
    Pipeline resumed(*resume_as);
    Status ok = resumed.load(*resume_as, path);
    REQUIRE_MESSAGE(ok.ok(), ok.error().message);
    resumed.run(N);
    check_same_state(whole, resumed);
    CHECK(same_bits(std::vector<double>(whole.losses.begin() + N, whole.losses.end()),
                    resumed.losses));
  }
}

TEST_CASE("mismatched checkpoints are refused naming what does not match") {
  const Config c = tiny_config("1f1b", 2);
  TempDir dir;
  Pipeline p(c);
  p.run(1);
  const std::string path = p.save(c, dir.str(), 1);

  SUBCASE("model, optimizer kind, batch shape and data kind are listed together") {
    Config other = c;
    other.model.width = 16;
    other.optimizer.kind = "sgd";
    other.pipeline.microbatch_size = 3;
    other.pipeline.seq_len = 5;
    other.data.kind = "text";
    other.data.path = "corpus.txt";
    auto ckpt = load_checkpoint(path);
    REQUIRE(ckpt.ok());
    Status s = check_resume(ckpt->info, other);
    REQUIRE_FALSE(s.ok());
    const std::string& msg = s.error().message;
    CHECK(msg.find("model.width: the checkpoint has 8, the config has 16") != std::string::npos);
    CHECK(msg.find("optimizer.kind: the checkpoint has adamw, the config has sgd") !=
          std::string::npos);
    CHECK(msg.find("pipeline.microbatch_size: the checkpoint has 2, the config has 3") !=
          std::string::npos);
    CHECK(msg.find("pipeline.seq_len: the checkpoint has 6, the config has 5") !=
          std::string::npos);
    CHECK(msg.find("data.kind: the checkpoint has synthetic, the config has text") !=
          std::string::npos);
  }
  SUBCASE("mode, stages, seeds and learning rate may change") {
    Config other = c;
    other.pipeline.mode = "gpipe";
    other.pipeline.stages = 3;
    other.optimizer.lr = 1e-3f;
    other.data.seed = 99;
    auto ckpt = load_checkpoint(path);
    REQUIRE(ckpt.ok());
    CHECK(check_resume(ckpt->info, other).ok());
  }
  SUBCASE("a missing tensor or a wrong shape is named") {
    auto ckpt = load_checkpoint(path);
    REQUIRE(ckpt.ok());
    CheckpointContents broken = *ckpt;
    std::erase_if(broken.model,
                  [](const NamedTensor& t) { return t.name == "layers.2.mlp.fc.weight"; });
    Pipeline q(c);
    auto ws = q.workers();
    auto os = q.shards();
    Status s = load_pipeline_checkpoint(broken, ws, os);
    REQUIRE_FALSE(s.ok());
    CHECK(s.error().message.find("model.safetensors has no tensor layers.2.mlp.fc.weight") !=
          std::string::npos);

    broken = *ckpt;
    for (NamedTensor& t : broken.optimizer) {
      if (t.name == "layers.0.wte.adam_v") t.shape = {t.numel()};
    }
    s = load_pipeline_checkpoint(broken, ws, os);
    REQUIRE_FALSE(s.ok());
    CHECK(s.error().message.find("layers.0.wte.adam_v in optimizer.safetensors has shape [192], "
                                 "the model expects [24, 8]") != std::string::npos);
  }
}
