// Memory check tests: the least bytes of a run's stages are the parameter floats times the
// copies the mode and optimizer keep; more than is available is an error naming the size keys.
#include "engine/execution/memory_check.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/tiny_model.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

// The tiny GPT over 2 stages: layers 0 and 1, then the rest.
std::pair<Model, Partition> two_stages() {
  Model model = build_model(tiny_model(Arch::gpt, true, 3));
  const std::vector<int> counts{2, model.num_layers() - 2};
  auto part = Partition::from_counts(model.num_layers(), counts);
  REQUIRE(part.ok());
  return {std::move(model), std::move(*part)};
}

}  // namespace

TEST_CASE("the least bytes count weights, gradients, optimizer state and weight versions") {
  const auto [model, part] = two_stages();
  uint64_t floats0 = 0, floats1 = 0;
  for (int i = 0; i < 2; ++i) floats0 += model.layer(i).param_floats();
  for (int i = 2; i < model.num_layers(); ++i) floats1 += model.layer(i).param_floats();
  const std::vector<int> both{0, 1}, second{1};
  CHECK(least_stage_bytes(model, part, Mode::onef1b, "adamw", both, 0, 0) ==
        16 * (floats0 + floats1));
  CHECK(least_stage_bytes(model, part, Mode::gpipe, "sgd", both, 0, 0) == 12 * (floats0 + floats1));
  CHECK(least_stage_bytes(model, part, Mode::twobw, "adamw", both, 0, 0) ==
        20 * (floats0 + floats1));
  CHECK(least_stage_bytes(model, part, Mode::xpipe, "adamw", second, 0, 0) == 20 * floats1);
  CHECK(least_stage_bytes(model, part, Mode::pipedream, "sgd", second, 0, 0) == 16 * floats1);
  // one microbatch of B x T: every stage's output, and the last stage's logits
  const ModelOptions& o = model.options();
  const uint64_t bt = 3 * 5;
  CHECK(least_stage_bytes(model, part, Mode::onef1b, "adamw", both, 3, 5) ==
        16 * (floats0 + floats1) + 4 * bt * (2 * o.width + o.vocab_size));
  const std::vector<int> first{0};
  CHECK(least_stage_bytes(model, part, Mode::onef1b, "adamw", first, 3, 5) ==
        16 * floats0 + 4 * bt * o.width);
  // bf16: a 2-byte copy of every stored version (1f1b one, 2bw two)
  CHECK(least_stage_bytes(model, part, Mode::onef1b, "adamw", both, 0, 0, Precision::bf16) ==
        18 * (floats0 + floats1));
  CHECK(least_stage_bytes(model, part, Mode::twobw, "adamw", both, 0, 0, Precision::bf16) ==
        24 * (floats0 + floats1));
  // a bf16 stash: the extra version's weight matrices are their bf16 copy alone, but a tied one
  uint64_t operands = 0;
  for (int i = 0; i < model.num_layers(); ++i) {
    const auto& slots = model.layer(i).slots();
    for (size_t s = 0; s < slots.size(); ++s) {
      const bool tied = std::any_of(model.tied().begin(), model.tied().end(), [&](const auto& t) {
        return (t.owner_layer == i && t.owner_slot == slots[s].name) ||
               (t.copy_layer == i && t.copy_slot == slots[s].name);
      });
      if (slots[s].product_operand && !tied) operands += slots[s].numel;
    }
    CHECK(model.bf16_stash_floats(i) <= model.layer(i).product_operand_floats());
  }
  REQUIRE(operands > 0);
  // the head's decoder is a product operand, tied to the embedding: kept in f32
  const int head = model.num_layers() - 1;
  CHECK(model.bf16_stash_floats(head) < model.layer(head).product_operand_floats());
  CHECK(least_stage_bytes(model, part, Mode::twobw, "adamw", both, 0, 0, Precision::bf16, true) ==
        24 * (floats0 + floats1) - 4 * operands);
}

TEST_CASE("stages that cannot fit are an error naming the keys that size the model") {
  const auto [model, part] = two_stages();
  const std::vector<int> both{0, 1};
  const uint64_t need = least_stage_bytes(model, part, Mode::onef1b, "adamw", both, 0, 0);
  CHECK(check_memory_fits(model, part, Mode::onef1b, "adamw", both, 0, 0, need).ok());
  CHECK(check_memory_fits(model, part, Mode::onef1b, "adamw", both, 0, 0, std::nullopt).ok());
  // what fits in fp32 does not in bf16, whose weight copies come on top
  const Status copies =
      check_memory_fits(model, part, Mode::onef1b, "adamw", both, 0, 0, need, Precision::bf16);
  REQUIRE_FALSE(copies.ok());
  CHECK(copies.error().message.find("weight versions with their bf16 copies") != std::string::npos);
  const Status bad = check_memory_fits(model, part, Mode::onef1b, "adamw", both, 0, 0, need - 1);
  REQUIRE(!bad.ok());
  MESSAGE(bad.error().message);
  const ModelOptions& o = model.options();
  CHECK(bad.error().message.find(fmt::format("model.width = {}, model.depth = {}, "
                                             "model.vocab_size = {}, model.context = {}, "
                                             "pipeline.microbatch_size = 0, sequence length 0: "
                                             "the stages here need at least",
                                             o.width, o.depth, o.vocab_size, o.context)) !=
        std::string::npos);
  CHECK(bad.error().message.find("of memory is available") != std::string::npos);
  // this machine reports what it has
  const auto here = host_available_bytes();
  REQUIRE(here.has_value());
  CHECK(*here > 0);
}

namespace {

// A memory that only reports where it is and what it has left (nothing is allocated in it).
class ReportingMemory final : public BackendMemory {
 public:
  ReportingMemory(std::string pool, std::string name, uint64_t free, bool host = false)
      : pool_(std::move(pool)), name_(std::move(name)), free_(free), host_(host) {}
  Device device() const override { return host_ ? Device::cpu : Device::cuda; }
  bool host_memory() const override { return host_; }
  std::string name() const override { return name_; }
  std::string pool() const override { return pool_; }
  std::optional<uint64_t> available_bytes() const override { return free_; }
  float* allocate(size_t) override { throw std::logic_error("ReportingMemory: allocate"); }
  void release(float*) override {}
  void to_backend(float*, const float*, size_t) override {}
  void to_host(float*, const float*, size_t) override {}
  void copy(float*, const float*, size_t) override {}
  void fill_zero(float*, long) override {}
  void synchronize() override {}

 private:
  std::string pool_, name_;
  uint64_t free_;
  bool host_;
};

}  // namespace

TEST_CASE("stages are counted per memory pool: a GPU's stages against its free memory") {
  const auto [model, part] = two_stages();
  const std::vector<int> both{0, 1}, first{0}, second{1};
  const auto need = [&](const std::vector<int>& stages, Precision p = Precision::fp32) {
    return least_stage_bytes(model, part, Mode::twobw, "adamw", stages, 2, 8, p);
  };
  auto check = [&](std::vector<BackendMemory*> memories, Precision p = Precision::fp32) {
    return check_stages_fit(model, part, Mode::twobw, "adamw", both, memories, 2, 8, p);
  };
  SUBCASE("two stages on one GPU hold together") {
    ReportingMemory gpu("cuda:0", "cuda:0 (test)", need(both));
    CHECK(check({&gpu, &gpu}).ok());
    ReportingMemory small("cuda:0", "cuda:0 (test)", need(both) - 1);
    const Status bad = check({&small, &small});
    REQUIRE_FALSE(bad.ok());
    MESSAGE(bad.error().message);
    CHECK(bad.error().message.find("the stages [0, 1] on cuda:0 (test) need at least") !=
          std::string::npos);
    CHECK(bad.error().message.find("is free there") != std::string::npos);
    // a companion on the same GPU is the same pool, though another object
    ReportingMemory other("cuda:0", "cuda:0 (test)", need(both) - 1);
    CHECK_FALSE(check({&small, &other}).ok());
  }
  SUBCASE("stages on two GPUs each fit their own") {
    ReportingMemory a("cuda:0", "cuda:0 (test)", need(first));
    ReportingMemory b("cuda:1", "cuda:1 (test)", need(second));
    CHECK(check({&a, &b}).ok());
    ReportingMemory tight("cuda:1", "cuda:1 (test)", need(second) - 1);
    const Status bad = check({&a, &tight});
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.error().message.find("the stages [1] on cuda:1 (test)") != std::string::npos);
  }
  SUBCASE("the host's RAM holds the stages on the CPU and those on a checked backend") {
    // stage 0 on the host (its memory), stage 1 on memory closed to the host in the same RAM
    ReportingMemory ram("host", "host memory", need(both), true);
    ReportingMemory closed("host", "checked", need(both), false);
    CHECK(check({&ram, &closed}).ok());
    ReportingMemory less("host", "host memory", need(both) - 1, true);
    const Status bad = check({&less, &closed});
    REQUIRE_FALSE(bad.ok());
    // the host's RAM is named as before
    CHECK(bad.error().message.find("the stages here need at least") != std::string::npos);
    CHECK(bad.error().message.find("of memory is available") != std::string::npos);
  }
  SUBCASE("in bf16 a stage off the host keeps no weight copies") {
    const uint64_t copies = need(both, Precision::bf16);
    REQUIRE(copies > need(both));
    ReportingMemory gpu("cuda:0", "cuda:0 (test)", need(both));
    CHECK(check({&gpu, &gpu}, Precision::bf16).ok());
    ReportingMemory ram("host", "host memory", need(both), true);
    CHECK_FALSE(check({&ram, &ram}, Precision::bf16).ok());
    ReportingMemory more("host", "host memory", copies, true);
    CHECK(check({&more, &more}, Precision::bf16).ok());
  }
  SUBCASE("no memories: every stage in the host's memory") {
    CHECK(check({}).ok());  // the tiny model fits this machine
    CHECK(host_backend_memory().pool() == "host");
    CHECK(host_backend_memory().available_bytes().has_value());
  }
}
