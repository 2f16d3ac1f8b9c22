#include "engine/delay_correction.hpp"

#include <doctest/doctest.h>

#include <string>

namespace actorpipe {

TEST_CASE("every value of optimizer.delay_correction parses and names itself") {
  for (std::string_view name : delay_correction_names) {
    DelayCorrectionChoice c;
    REQUIRE(from_string(name, c));
    CHECK(to_string(c) == name);
  }
  DelayCorrectionChoice c;
  REQUIRE(from_string("secant+nesterov", c));
  CHECK(c.compensation == DelayCorrectionChoice::Compensation::secant);
  CHECK(c.lookahead);
  CHECK(c.needs_weight_change());
  REQUIRE(from_string("nesterov", c));
  CHECK(c.compensation == DelayCorrectionChoice::Compensation::none);
  CHECK(c.lookahead);
  CHECK_FALSE(c.needs_weight_change());
}

TEST_CASE("an unknown delay correction is refused and leaves the choice alone") {
  DelayCorrectionChoice c{DelayCorrectionChoice::Compensation::dc, true};
  for (const char* bad : {"", "nesterov+secant", "Secant", "dc+", "secant+nadam", "dc nesterov"}) {
    INFO(bad);
    CHECK_FALSE(from_string(bad, c));
    CHECK(c == DelayCorrectionChoice{DelayCorrectionChoice::Compensation::dc, true});
  }
}

}  // namespace actorpipe
