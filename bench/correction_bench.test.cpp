// Tests of the delay-correction rows' choice of corrections: every one a mode takes, or the
// ones asked for with the reference first.
#include "bench/correction_bench.hpp"

#include <doctest/doctest.h>

using namespace actorpipe;
using namespace actorpipe::bench;

namespace {
using Names = std::vector<std::string>;
}

TEST_CASE("the synchronous modes take no correction, xpipe no compensation") {
  CHECK(corrections_of(Mode::gpipe).empty());
  CHECK(corrections_of(Mode::onef1b).empty());
  const Names xpipe = corrections_of(Mode::xpipe);
  CHECK(xpipe.front() == "none");
  for (const std::string& c : xpipe) {
    const bool compensates = c.rfind("dc", 0) == 0 || c.rfind("secant", 0) == 0;
    CHECK_MESSAGE(!compensates, c);
  }
  CHECK(corrections_of(Mode::pipedream) == corrections_of(Mode::twobw));
}

TEST_CASE("measured corrections: all without a choice, else the chosen ones after none") {
  CHECK(measured_corrections(Mode::pipedream, {}) == corrections_of(Mode::pipedream));
  const Names only{"rot32+nesterov", "dc"};
  // in the mode's order, none first even when not asked for
  CHECK(measured_corrections(Mode::pipedream, only) == Names{"none", "dc", "rot32+nesterov"});
  CHECK(measured_corrections(Mode::twobw, only) == Names{"none", "dc", "rot32+nesterov"});
  CHECK(measured_corrections(Mode::xpipe, only) == Names{"none", "rot32+nesterov"});
  CHECK(measured_corrections(Mode::xpipe, Names{"dc"}) == Names{"none"});
  CHECK(measured_corrections(Mode::pipedream, Names{"none"}) == Names{"none"});
  CHECK(measured_corrections(Mode::gpipe, only).empty());
}

TEST_CASE("a correction's name gives its settings") {
  const CorrectionSettings r = correction_settings("rot32+nesterov");
  CHECK(r.delay_correction == "nesterov");
  CHECK(r.basis_rotation);
  CHECK(r.rotation_block == 32);
  const CorrectionSettings n = correction_settings("nadam");
  CHECK(n.delay_correction == "nesterov");
  CHECK(n.momentum_decay == doctest::Approx(0.004f));
  CHECK_FALSE(n.basis_rotation);
  CHECK(correction_settings("dc").delay_correction == "dc");
  CHECK(correction_settings("rot").rotation_block == 0);
}
