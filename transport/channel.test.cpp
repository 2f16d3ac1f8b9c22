// Channel layout: every participant computes the same channels in the same order, tied
// parameters held by two stages get their four channels after the pipeline's.
#include "transport/channel.hpp"

#include <doctest/doctest.h>

#include "kernels/check.hpp"
#include "transport/local_channel.hpp"

namespace actorpipe {

TEST_CASE("channel layout: pipeline channels by tag, then four per split tied parameter") {
  const std::vector<TiedPair> tied{{0, 2}, {1, 1}, {2, 0}};
  const auto layout = channel_layout(3, tied);
  REQUIRE(layout.size() == 4 + 4 + 4);  // the pair on one stage needs none
  for (size_t i = 0; i < layout.size(); ++i) CHECK(layout[i].tag == i);
  CHECK(layout[0].kind == ChannelKind::activation);
  CHECK((layout[0].from == 0 && layout[0].to == 1));
  CHECK(layout[3].kind == ChannelKind::gradient);
  CHECK((layout[3].from == 2 && layout[3].to == 1));
  // tied parameter 0: owner stage 0, copy stage 2
  CHECK(layout[4].kind == ChannelKind::tied_to_owner);
  CHECK((layout[4].tied == 0 && layout[4].from == 2 && layout[4].to == 0));
  CHECK(layout[5].kind == ChannelKind::tied_to_copy);
  CHECK((layout[5].from == 0 && layout[5].to == 2));
  CHECK(layout[6].kind == ChannelKind::tied_weights);
  CHECK(layout[7].kind == ChannelKind::tied_prediction);
  CHECK((layout[7].from == 0 && layout[7].to == 2));
  // tied parameter 2: owner stage 2, copy stage 0
  CHECK((layout[8].tied == 2 && layout[8].from == 0 && layout[8].to == 2));
  CHECK(to_string(ChannelKind::tied_weights) == "tied_weights");
}

TEST_CASE("channel set: tied channels are found by parameter and kind") {
  auto set = make_local_channels(2, {{0, 1}});
  REQUIRE(set.ok());
  CHECK(set->stages() == 2);
  CHECK(set->size() == 6);
  CHECK(set->tied(0, ChannelKind::tied_weights).ends().tag == 4);
  CHECK(&set->tied(0, ChannelKind::tied_to_owner) == &set->at(2));
  CHECK_THROWS_AS(set->tied(1, ChannelKind::tied_weights), CheckFailure);
  CHECK_THROWS_AS(set->tied(0, ChannelKind::activation), CheckFailure);
  auto post = set->tied(0, ChannelKind::tied_to_owner).post(Tensor::zeros({3}), 7, 2);
  REQUIRE(post.ok());
  CHECK(set->pending() == 1);
  auto bad = make_local_channels(2, {{0, 2}});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("tied parameter 0 between stages 0 and 2") != std::string::npos);
  CHECK(make_local_channels(1).ok());
  CHECK(make_local_channels(1)->size() == 0);
}

}  // namespace actorpipe
