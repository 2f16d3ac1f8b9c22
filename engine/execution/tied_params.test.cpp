// Tied parameters of a stage: where each copy lives, which mode follows the owner, and which of
// the owner's values each stored version of a following copy holds.
#include "engine/execution/tied_params.hpp"

#include <doctest/doctest.h>

#include "engine/schedule/generators.hpp"
#include "kernels/check.hpp"
#include "tests/support/tiny_model.hpp"

namespace actorpipe {

using testing::build_model;
using testing::tiny_model;

TEST_CASE("tied params: the embedding's stage owns, the head's stage holds the copy") {
  const Model model = build_model(tiny_model(Arch::gpt, /*tied=*/true, 7));
  REQUIRE(model.tied().size() == 1);
  const auto two = Partition::even(model.num_layers(), 2);
  const auto one = Partition::even(model.num_layers(), 1);
  REQUIRE(two.ok());
  REQUIRE(one.ok());
  const TiedParams owner(model, *two, 0, Mode::onef1b, 1);
  const TiedParams copy(model, *two, 1, Mode::onef1b, 1);
  const TiedParams both(model, *one, 0, Mode::onef1b, 1);
  CHECK(owner.layout(0).role == TiedRole::owner);
  CHECK(owner.layout(0).owner_local == 0);
  CHECK(copy.layout(0).role == TiedRole::copy);
  CHECK(copy.layout(0).copy_local == model.num_layers() - 1 - two->begin(1));
  CHECK(owner.layout(0).numel == copy.layout(0).numel);
  CHECK(owner.layout(0).numel == static_cast<size_t>(24 * 8));  // V x C
  CHECK(both.layout(0).role == TiedRole::both);
  CHECK_THROWS_AS(owner.layout(1), CheckFailure);
  // untied: nothing to keep equal
  const Model untied = build_model(tiny_model(Arch::gpt, false, 7));
  CHECK(TiedParams(untied, *two, 1, Mode::twobw, 2).size() == 0);
}

TEST_CASE("tied params: synchronous modes exchange gradients, the others follow the owner") {
  const Model model = build_model(tiny_model(Arch::gpt, true, 7));
  const auto two = Partition::even(model.num_layers(), 2);
  REQUIRE(two.ok());
  for (Mode mode : {Mode::gpipe, Mode::onef1b}) {
    CHECK(tied_sync(mode) == TiedSync::exchange_grads);
    CHECK_FALSE(TiedParams(model, *two, 1, mode, 1).follows(0));
  }
  for (Mode mode : {Mode::twobw, Mode::pipedream, Mode::xpipe}) {
    CHECK(tied_sync(mode) == TiedSync::follow_owner);
    CHECK(TiedParams(model, *two, 1, mode, 2).follows(0));
    CHECK_FALSE(TiedParams(model, *two, 0, mode, 2).follows(0));  // the owner itself
  }
}

TEST_CASE("tied params: held values, the owner's forwards of a run, renames") {
  const Model model = build_model(tiny_model(Arch::gpt, true, 7));
  const auto two = Partition::even(model.num_layers(), 2);
  REQUIRE(two.ok());
  TiedParams copy(model, *two, 1, Mode::twobw, 2);
  CHECK(copy.held(0, 0) == TiedVersion{0, 0});  // both copies start from the same init
  CHECK_FALSE(copy.held(1, 0).valid());
  copy.set_held(1, 0, TiedVersion{1, 0});
  CHECK(copy.held(1, 0) == TiedVersion{1, 0});

  // the owner (stage 0) computes forward j of a 2bw run with the version its action names
  const auto s = make_schedule(Mode::twobw, 2, 2, 3);
  REQUIRE(s.ok());
  copy.plan_run(*s, /*base=*/5, s->total_microbatches(), /*predicts=*/false);
  for (const Action& a : s->per_stage[0]) {
    if (a.kind != ActionKind::F) continue;
    CHECK(copy.owner_forward(a.microbatch) == TiedVersion{5 + a.version, 0});
  }

  // set_updates: a current copy stays current under the new name; a lagging one is forgotten
  copy.rename(/*latest=*/1, /*updates=*/9);
  CHECK(copy.held(9, 0) == TiedVersion{9, 0});
  CHECK_FALSE(copy.held(1, 0).valid());
  copy.set_held(9, 0, TiedVersion{8, 0});
  copy.rename(9, 4);
  CHECK_FALSE(copy.held(4, 0).valid());
  // a previous 2bw version added at rest: the follower waits for the owner's value
  copy.add_previous(3);
  CHECK_FALSE(copy.held(3, 0).valid());
  TiedParams owner(model, *two, 0, Mode::twobw, 2);
  owner.add_previous(3);
  CHECK(owner.held(3, 0) == TiedVersion{3, 0});
  CHECK(to_string(TiedVersion{3, 1}) == "3+1");
  CHECK(to_string(TiedVersion{}) == "none");
}

}  // namespace actorpipe
