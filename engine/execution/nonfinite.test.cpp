// Non-finite gradient helpers: the first bad layer, and the message's exact words.
#include "engine/execution/nonfinite.hpp"

#include <doctest/doctest.h>

#include <limits>
#include <vector>

#include "engine/model/model.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;

TEST_CASE("first_nonfinite: the first NaN or infinity, -1 when there is none") {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK(first_nonfinite(std::vector<double>{}) == -1);
  CHECK(first_nonfinite(std::vector<double>{0.0, 1e300, 3.0}) == -1);
  CHECK(first_nonfinite(std::vector<double>{0.0, inf, nan}) == 1);
  CHECK(first_nonfinite(std::vector<double>{nan}) == 0);
  CHECK(first_nonfinite(std::vector<double>{1.0, 2.0, -inf}) == 2);
}

TEST_CASE("nonfinite_gradient names the step, the layer and its kind") {
  auto built = Model::build(testing::tiny_model(Arch::gpt, true, 2));
  REQUIRE(built.ok());
  const Model& model = *built;
  CHECK(nonfinite_gradient(model, 7, 1, std::numeric_limits<double>::infinity()) ==
        "non-finite gradient in step 7 at layer 1 (gpt_block; sum of squares inf)");
  CHECK(nonfinite_gradient(model, 1, 0, std::numeric_limits<double>::quiet_NaN()) ==
        "non-finite gradient in step 1 at layer 0 (gpt_embedding; sum of squares nan)");
}
