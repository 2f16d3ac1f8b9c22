// Trace tests: the Chrome trace of a schedule's actions is valid JSON with one named track per
// stage and per optimizer shard and one complete event per action or update, named by the
// action's text form, times in µs.
#include "actors/api/actorpipe/trace.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/schedule/generators.hpp"
#include "engine/schedule/lowering.hpp"

using namespace actorpipe;

namespace {

// Spans of every action of a lowered 2bw schedule, stage r's i-th action at [i + r/10, + 0.5) ms.
std::vector<TraceSpan> schedule_spans(int d, int m, int steps) {
  auto s = make_2bw(d, m, steps);
  REQUIRE(s.ok());
  auto lowered = lower(*s);
  REQUIRE(lowered.ok());
  std::vector<TraceSpan> spans;
  for (int r = 0; r < d; ++r) {
    const auto& list = lowered->per_stage[static_cast<size_t>(r)];
    for (size_t i = 0; i < list.size(); ++i) {
      const double t = (static_cast<double>(i) + 0.1 * r) * 1e-3;
      spans.push_back({r, list[i], t, t + 0.5e-3});
    }
  }
  return spans;
}

}  // namespace

TEST_CASE("one track per stage, one span per action named by its text form") {
  constexpr int d = 3;
  const auto spans = schedule_spans(d, 4, 2);
  const auto j = nlohmann::json::parse(chrome_trace_json(spans, d));
  CHECK(j.at("displayTimeUnit") == "ms");
  const auto& events = j.at("traceEvents");
  std::map<int, std::string> track_names;
  std::map<int, int> spans_per_track;
  size_t complete = 0;
  for (const auto& e : events) {
    const int tid = e.at("tid").get<int>();
    CHECK(e.at("pid").get<int>() == 1);
    if (e.at("ph") == "M") {
      if (e.at("name") == "thread_name") {
        CHECK(track_names.count(tid) == 0);
        track_names[tid] = e.at("args").at("name").get<std::string>();
      }
      continue;
    }
    REQUIRE(e.at("ph") == "X");
    const TraceSpan& s = spans[complete++];
    auto action = parse_action(e.at("name").get<std::string>());
    REQUIRE_MESSAGE(action.ok(), e.dump());
    CHECK(*action == s.action);
    CHECK(action->stage == tid);  // the span sits on its stage's track
    CHECK(e.at("cat").get<std::string>() == to_string(s.action.kind));
    CHECK(e.at("ts").get<double>() == doctest::Approx(s.start * 1e6));
    CHECK(e.at("dur").get<double>() == doctest::Approx(500.0));
    CHECK(e.at("args").at("microbatch").get<int>() == s.action.microbatch);
    ++spans_per_track[tid];
  }
  CHECK(complete == spans.size());
  REQUIRE(track_names.size() == 2 * d);  // a stage and its optimizer shard each
  for (int r = 0; r < d; ++r) {
    CHECK(track_names[r] == "stage " + std::to_string(r));
    CHECK(track_names[d + r] == "stage " + std::to_string(r) + " optimizer");
    CHECK(spans_per_track[r] > 0);
    CHECK(spans_per_track[d + r] == 0);
  }
}

TEST_CASE("update spans sit on their stage's optimizer track, sorted after the stage") {
  constexpr int d = 2;
  std::vector<TraceSpan> spans = {
      {1, *parse_action("1F0"), 0.001, 0.002, false},
      {1, *parse_action("1OPT_STEP@1"), 0.002, 0.005, true},
  };
  const auto j = nlohmann::json::parse(chrome_trace_json(spans, d));
  std::map<int, int> sort_index;
  std::vector<nlohmann::json> complete;
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("name") == "thread_sort_index")
      sort_index[e.at("tid").get<int>()] = e.at("args").at("sort_index").get<int>();
    if (e.at("ph") == "X") complete.push_back(e);
  }
  REQUIRE(complete.size() == 2);
  CHECK(complete[0].at("tid") == 1);
  CHECK(complete[0].at("cat") == "F");
  CHECK(complete[1].at("tid") == d + 1);
  CHECK(complete[1].at("cat") == "update");
  CHECK(complete[1].at("name") == to_string(spans[1].action));
  CHECK(complete[1].at("dur").get<double>() == doctest::Approx(3000.0));
  // stage 0, stage 0 optimizer, stage 1, stage 1 optimizer
  CHECK(sort_index[0] < sort_index[d + 0]);
  CHECK(sort_index[d + 0] < sort_index[1]);
  CHECK(sort_index[1] < sort_index[d + 1]);
}

TEST_CASE("a trace without spans still names every stage's track") {
  const auto j = nlohmann::json::parse(chrome_trace_json({}, 2));
  int threads = 0;
  for (const auto& e : j.at("traceEvents")) threads += e.at("name") == "thread_name";
  CHECK(threads == 4);  // two stages, two optimizer shards
}

TEST_CASE("a mark is a global instant event with its name and detail") {
  const TraceMark mark{1.5, "migration [1, 7] -> [4, 4]", "imbalance \"0.99\""};
  const auto j = nlohmann::json::parse(chrome_trace_json({}, 2, std::span(&mark, 1)));
  int marks = 0;
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph") != "i") continue;
    ++marks;
    CHECK(e.at("s") == "g");
    CHECK(e.at("cat") == "migration");
    CHECK(e.at("name") == "migration [1, 7] -> [4, 4]");
    CHECK(e.at("ts").get<double>() == 1500000.0);
    CHECK(e.at("args").at("detail") == "imbalance \"0.99\"");
  }
  CHECK(marks == 1);
}

TEST_CASE("write_chrome_trace writes the file, an unwritable path is an error naming it") {
  const auto spans = schedule_spans(2, 2, 1);
  const auto path = std::filesystem::temp_directory_path() /
                    ("actorpipe-trace-test-" + std::to_string(getpid()) + ".json");
  REQUIRE(write_chrome_trace(path.string(), spans, 2).ok());
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  CHECK(text.str() == chrome_trace_json(spans, 2));
  std::filesystem::remove(path);

  Status bad = write_chrome_trace("/nonexistent-dir/trace.json", spans, 2);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("/nonexistent-dir/trace.json") != std::string::npos);
}

TEST_CASE("times are microseconds with exact nanosecond decimals") {
  const TraceSpan span{1, *parse_action("1B3@2"), 0.001234567, 0.002};
  const std::string json = chrome_trace_json(std::span(&span, 1), 2);
  CHECK(json.find(R"("name":"1B3@2","cat":"B","ts":1234.567,"dur":765.433,)"
                  R"("args":{"microbatch":3,"version":2}})") != std::string::npos);
}
