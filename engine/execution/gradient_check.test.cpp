// Gradient check tests: the built-in GPT and BERT pass; a layer with a wrong weight gradient, a
// wrong input gradient or a split backward that loses a gradient is reported by name.
#include "engine/execution/gradient_check.hpp"

#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/model/internal/transformer_layers.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

enum class Bug { none, weight_gradient, input_gradient, split_drops_gradient };

// y = x ⊙ w (per channel) + x: a hidden layer small enough to get wrong on purpose.
class ChannelScale final : public Layer {
 public:
  ChannelScale(int index, int width, Bug bug)
      : Layer(LayerRole::hidden, "channel_scale", index, {[&] {
                ParamSlot s;
                s.name = "w";
                s.shape = {width};
                s.init = InitKind::normal;
                s.init_std = 0.5f;
                return s;
              }()}),
        C_(width),
        bug_(bug) {}
  size_t saved_floats(int, int) const override { return 0; }
  LossStats forward(Context&, const float* params, const Microbatch& mb, const float* in,
                    float* out, float*) const override {
    const size_t N = static_cast<size_t>(mb.B) * mb.T;
    for (size_t r = 0; r < N; ++r)
      for (int c = 0; c < C_; ++c) {
        const size_t k = r * C_ + c;
        out[k] = in[k] * params[c] + in[k];
      }
    return {};
  }
  void backward(Context&, const float* params, float* grads, const Microbatch& mb, const float* in,
                const float*, const float* dout, float* din, float,
                DeferredGrads* later) const override {
    const size_t N = static_cast<size_t>(mb.B) * mb.T;
    const float wrong = bug_ == Bug::weight_gradient ? 1.5f : 1.0f;
    const float dx_extra = bug_ == Bug::input_gradient ? 0.0f : 1.0f;  // forgets the residual
    for (size_t r = 0; r < N; ++r)
      for (int c = 0; c < C_; ++c) {
        const size_t k = r * C_ + c;
        din[k] = dout[k] * (params[c] + dx_extra);
        if (!(bug_ == Bug::split_drops_gradient && later != nullptr))
          grads[c] += wrong * dout[k] * in[k];
      }
  }

 private:
  int C_;
  Bug bug_;
};

Model model_with(Bug bug) {
  const ModelOptions o = tiny_model(Arch::gpt, true, 3);
  std::vector<std::shared_ptr<const Layer>> layers{
      internal::make_gpt_embedding(o, 0), std::make_shared<ChannelScale>(1, o.width, bug),
      internal::make_block(o, 2, true), internal::make_gpt_head(o, 3)};
  auto m = Model::from_layers(o, std::move(layers), {{0, "wte", 3, "lm_head.weight"}});
  REQUIRE_MESSAGE(m.ok(), (m.ok() ? "" : m.error().message));
  return std::move(m).value();
}

}  // namespace

TEST_CASE("the built-in GPT and BERT pass, every slot but the tied copy checked") {
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    const Model m = build_model(tiny_model(arch, true, 7));
    const auto mbs = tiny_batches(arch, m.options().vocab_size, 2, 11);
    auto r = check_gradients(m, mbs);
    REQUIRE(r.ok());
    CAPTURE(r->describe());
    CHECK(r->passed());
    CHECK(r->describe() == "passed");
    size_t slots = 0;
    for (int i = 0; i < m.num_layers(); ++i) slots += m.layer(i).slots().size();
    CHECK(r->slots.size() == slots - 1);  // the head's tied decoder weight is wte
    CHECK(r->splits.size() == static_cast<size_t>(m.num_layers()));
    for (const SlotCheck& s : r->slots) {
      CAPTURE(s.name);
      CHECK(s.scale > 0);
      CHECK(s.worst < 5e-3);  // measured: the f32 noise stays well inside the tolerance
    }
    CHECK(r->splits[1].deferred > 0);  // a block splits its backward
    CHECK(r->loss > 0);
  }
}

TEST_CASE("a correct layer of one's own passes") {
  auto r = check_gradients(model_with(Bug::none), tiny_batches(Arch::gpt, 24, 2, 12));
  REQUIRE(r.ok());
  CAPTURE(r->describe());
  CHECK(r->passed());
  CHECK(r->splits[1].type == "channel_scale");
  CHECK(r->splits[1].deferred == 0);  // it does not split: a one-pass backward, still correct
}

TEST_CASE("a wrong weight gradient is caught and named") {
  auto r = check_gradients(model_with(Bug::weight_gradient), tiny_batches(Arch::gpt, 24, 2, 12));
  REQUIRE(r.ok());
  CHECK(!r->passed());
  const std::string d = r->describe();
  CAPTURE(d);
  CHECK(d.find("layers.1.w:") != std::string::npos);
  CHECK(d.find("layers.0.") == std::string::npos);  // the layers before it are right
}

TEST_CASE("a wrong input gradient shows in the slots before the layer") {
  auto r = check_gradients(model_with(Bug::input_gradient), tiny_batches(Arch::gpt, 24, 2, 12));
  REQUIRE(r.ok());
  CHECK(!r->passed());
  const std::string d = r->describe();
  CAPTURE(d);
  CHECK(d.find("layers.0.wpe") != std::string::npos);
  CHECK(d.find("layers.1.w:") == std::string::npos);
}

TEST_CASE("a split backward that loses a gradient is caught") {
  auto r =
      check_gradients(model_with(Bug::split_drops_gradient), tiny_batches(Arch::gpt, 24, 2, 12));
  REQUIRE(r.ok());
  CHECK(!r->passed());
  CHECK(r->describe() ==
        "layer 1 (channel_scale): split backward's gradients after DeferredGrads::run differ "
        "from the one-pass ones");
}

TEST_CASE("bad arguments are errors") {
  const Model m = build_model(tiny_model(Arch::gpt, true, 7));
  CHECK(check_gradients(m, {}).error().message == "gradient check: no microbatches");
  auto mbs = tiny_batches(Arch::gpt, 24, 1, 1);
  GradientCheckOptions o;
  o.step = 0;
  CHECK(!check_gradients(m, mbs, o).ok());
  mbs[0].T = 9;
  CHECK(check_gradients(m, mbs).error().message.find("T <= context 8") != std::string::npos);
}
