// Forced moves: the grammar of migration.moves, its canonical text, and every error.
#include "engine/config/forced_moves.hpp"

#include <doctest/doctest.h>

#include "engine/config/config.hpp"

using namespace actorpipe;

TEST_CASE("migration.moves reads steps and layer counts, spaces anywhere") {
  auto none = parse_forced_moves("  ");
  REQUIRE(none.ok());
  CHECK(none->empty());
  auto two = parse_forced_moves(" 10:3,5 ;20 : 4, 4;");
  REQUIRE(two.ok());
  REQUIRE(two->size() == 2);
  CHECK((*two)[0] == ForcedMove{10, {3, 5}});
  CHECK((*two)[1] == ForcedMove{20, {4, 4}});
  CHECK(to_string(*two) == "10: 3, 5; 20: 4, 4");
  auto back = parse_forced_moves(to_string(*two));
  REQUIRE(back.ok());
  CHECK(*back == *two);
}

TEST_CASE("migration.moves errors quote the move and say what is allowed") {
  auto message = [](const char* text) {
    auto r = parse_forced_moves(text);
    REQUIRE_FALSE(r.ok());
    return r.error().message;
  };
  CHECK(message("10 3, 5").find("\"10 3, 5\" has no ':'") != std::string::npos);
  CHECK(message("0: 3, 5").find("the step must be an integer >= 1") != std::string::npos);
  CHECK(message("x: 3, 5").find("the step must be an integer >= 1") != std::string::npos);
  CHECK(message("4: 3, 0").find("\"0\" is not a layer count") != std::string::npos);
  CHECK(message("4: 3,, 5").find("\"\" is not a layer count") != std::string::npos);
  CHECK(message("4: 3, -5").find("\"-5\" is not a layer count") != std::string::npos);
  CHECK(message("4: 3, 5;; 6: 4, 4").find("an empty move") != std::string::npos);
  CHECK(message("6: 3, 5; 6: 4, 4").find("step 6 after step 6: the steps must increase") !=
        std::string::npos);
}

TEST_CASE("validate checks forced moves against the stages and the model's layers") {
  Config c;  // GPT, depth 4: 6 layers
  c.pipeline.stages = 2;
  c.migration.moves = "3: 2, 4; 5: 1, 2, 3; 7: 3, 4";
  auto ok = validate(c);
  REQUIRE_FALSE(ok.ok());
  const std::string& m = ok.error().message;
  CHECK(m.find("migration.moves: \"5: 1, 2, 3\" has 3 layer counts but pipeline.stages = 2") !=
        std::string::npos);
  CHECK(m.find("migration.moves: \"7: 3, 4\" sums to 7 but the model has 6 layers") !=
        std::string::npos);
  CHECK(m.find("\"3: 2, 4\"") == std::string::npos);
  c.migration.moves = "3: 2, 4";
  CHECK(validate(c).ok());
  c.migration.check_every = 0;
  c.migration.threshold = 0;
  c.migration.patience = 0;
  c.migration.min_gain = 1;
  auto bad = validate(c);
  REQUIRE_FALSE(bad.ok());
  for (const char* key : {"migration.check_every = 0", "migration.threshold = 0",
                          "migration.patience = 0", "migration.min_gain = 1"}) {
    CHECK_MESSAGE(bad.error().message.find(key) != std::string::npos, key);
  }
}
