// Tests of the layer profile: one cost per layer of the model, named after its kind and index,
// every part timed; the loaded variant records its load; bad arguments are refused by name.
#include "bench/layer_profile.hpp"

#include <doctest/doctest.h>

#include <string>

using namespace actorpipe;
using namespace actorpipe::bench;

namespace {

ModelOptions small_gpt() {
  ModelOptions m;  // the defaults: V256 C128 L4 H4, tied
  m.context = 32;
  return m;
}

void check_layers(const LayerProfile& p) {
  REQUIRE(p.layers.size() == 6);  // embedding, 4 blocks, head
  CHECK(p.layers.front().name == "gpt_embedding 0");
  CHECK(p.layers[3].name == "gpt_block 3");
  CHECK(p.layers.back().name == "gpt_head 5");
  for (const LayerCost& c : p.layers) {
    CAPTURE(c.name);
    CHECK(c.forward > 0.0);
    CHECK(c.backward > 0.0);
    CHECK(c.update > 0.0);
    CHECK(c.copy > 0.0);
    CHECK(c.predict > 0.0);
  }
}

}  // namespace

TEST_CASE("a profile has one timed cost per layer, named by kind and index") {
  auto p = profile_layers(small_gpt(), OptimizerOptions{}, 2, 16, 1, 2);
  REQUIRE_MESSAGE(p.ok(), (p.ok() ? "" : p.error().message));
  check_layers(*p);
  CHECK(p->threads == 1);
  CHECK(p->B == 2);
  CHECK(p->T == 16);
  CHECK(p->reps == 2);
  CHECK(p->load_threads == 0);
  CHECK(p->tied);
}

TEST_CASE("a loaded profile runs with other threads computing and records them") {
  auto p = profile_layers_loaded(small_gpt(), OptimizerOptions{}, 2, 16, 1, 1, 2);
  REQUIRE_MESSAGE(p.ok(), (p.ok() ? "" : p.error().message));
  check_layers(*p);
  CHECK(p->load_threads == 2);
  auto none = profile_layers_loaded(small_gpt(), OptimizerOptions{}, 2, 16, 2, 1, 0);
  REQUIRE(none.ok());
  CHECK(none->load_threads == 0);
  CHECK(none->threads == 2);
}

TEST_CASE("bad profile arguments are refused with their names and values") {
  auto e = profile_layers(small_gpt(), OptimizerOptions{}, 0, 16, 1, 1);
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().message.find("B = 0") != std::string::npos);
  e = profile_layers(small_gpt(), OptimizerOptions{}, 2, 33, 1, 1);
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().message.find("T = 33") != std::string::npos);
  CHECK(e.error().message.find("context (32)") != std::string::npos);
  e = profile_layers_loaded(small_gpt(), OptimizerOptions{}, 2, 16, 1, 1, -1);
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().message.find("load_threads = -1") != std::string::npos);
  // the loaded variant checks its own arguments before it starts any thread
  e = profile_layers_loaded(small_gpt(), OptimizerOptions{}, 2, 16, 0, 1, 1);
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().message.find("threads = 0") != std::string::npos);
}
