// Metrics tests: the JSON line parses back to every field (the loss to the same double), a
// non-finite loss is null, and the derived rate and ETA follow their formulas.
#include "actors/api/actorpipe/metrics.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/support/temp_dir.hpp"

using namespace actorpipe;

namespace {

StepMetrics sample() {
  StepMetrics m;
  m.step = 12;
  m.steps = 40;
  m.first_step = 4;
  m.loss = 0.1 + 0.2;  // 0.30000000000000004: needs all 17 digits
  m.tokens = 6144;
  m.seconds = 1.5;
  m.stages = {{1.25, 0.25}, {0.75, 0.5}};
  return m;
}

}  // namespace

TEST_CASE("a metrics line is one JSON object with every field, the loss exact, times in µs") {
  const StepMetrics m = sample();
  const std::string line = metrics_json(m);
  CHECK(line == R"({"step":12,"loss":0.30000000000000004,"tokens":6144,"time":1.500000,)"
                R"("busy":[1.250000,0.750000],"idle":[0.250000,0.500000]})");
  CHECK(line.find('\n') == std::string::npos);
  const auto j = nlohmann::json::parse(line);
  CHECK(j.at("step").get<int64_t>() == 12);
  CHECK(j.at("loss").get<double>() == m.loss);  // bitwise: the shortest round-trip text
  CHECK(j.at("tokens").get<int64_t>() == 6144);
  CHECK(j.at("time").get<double>() == 1.5);
  CHECK(j.at("busy") == nlohmann::json::array({1.25, 0.75}));
  CHECK(j.at("idle") == nlohmann::json::array({0.25, 0.5}));
  StepMetrics fine = m;
  fine.seconds = 0.06400597000000001;  // a sum of nanosecond counts
  CHECK(nlohmann::json::parse(metrics_json(fine)).at("time").get<double>() == 0.064006);
}

TEST_CASE("a non-finite loss is written as null, no stages give empty arrays") {
  StepMetrics m = sample();
  m.loss = std::numeric_limits<double>::quiet_NaN();
  m.stages.clear();
  const auto j = nlohmann::json::parse(metrics_json(m));
  CHECK(j.at("loss").is_null());
  CHECK(j.at("busy").empty());
  CHECK(j.at("idle").empty());
  m.loss = std::numeric_limits<double>::infinity();
  CHECK(nlohmann::json::parse(metrics_json(m)).at("loss").is_null());
}

TEST_CASE("tokens per second and ETA") {
  StepMetrics m = sample();
  CHECK(m.tokens_per_second() == doctest::Approx(6144 / 1.5));
  // 8 steps done by this trainer in 1.5 s, 28 to go
  CHECK(m.eta_seconds() == doctest::Approx(1.5 / 8 * 28));
  m.step = m.steps;
  CHECK(m.eta_seconds() == 0.0);
  m.step = m.first_step;  // nothing run yet: no estimate
  CHECK(m.eta_seconds() == 0.0);
  m.seconds = 0.0;
  CHECK(m.tokens_per_second() == 0.0);
}

TEST_CASE("a migration line names the verdict, its numbers and its reason, escaped") {
  MigrationEvent e;
  e.step = 20;
  e.moved = true;
  e.from = {1, 7};
  e.to = {4, 4};
  e.imbalance = 0.5;
  e.busy = {0.25, 1.75};
  e.speed = {1.0, 1.5};
  e.predicted_now = 2.5;
  e.predicted_new = 1.25;
  e.layers_moved = 3;
  e.bytes_moved = 1 << 20;
  e.bytes_sent = 1 << 19;
  e.decided = e.step - 1;
  e.move_seconds = 0.004;
  e.reason = "imbalance \"high\"\n";
  const std::string line = migration_json(e);
  CHECK(line.find('\n') == std::string::npos);
  const auto j = nlohmann::json::parse(line).at("migration");
  CHECK(j.at("step") == 20);
  CHECK(j.at("forced") == false);
  CHECK(j.at("moved") == true);
  CHECK(j.at("from") == nlohmann::json::array({1, 7}));
  CHECK(j.at("to") == nlohmann::json::array({4, 4}));
  CHECK(j.at("imbalance").get<double>() == 0.5);
  CHECK(j.at("busy") == nlohmann::json::array({0.25, 1.75}));
  CHECK(j.at("speed") == nlohmann::json::array({1.0, 1.5}));
  CHECK(j.at("predicted_now").get<double>() == 2.5);
  CHECK(j.at("predicted_new").get<double>() == 1.25);
  CHECK(j.at("layers_moved") == 3);
  CHECK(j.at("bytes_moved") == 1 << 20);
  CHECK(j.at("bytes_sent") == 1 << 19);
  CHECK(j.at("decided") == e.step - 1);
  CHECK(j.at("move_seconds").get<double>() == 0.004);
  CHECK(j.at("reason") == "imbalance \"high\"\n");
  CHECK(j.at("error") == "");
}

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("a resumed run's metrics file keeps the steps up to the checkpoint, once each") {
  actorpipe::testing::TempDir tmp;
  const std::string path = (tmp.path / "m.jsonl").string();
  const std::string step = R"({"step":)";
  const std::string tail = R"(,"loss":1,"tokens":1,"time":1.000000,"busy":[],"idle":[]})";
  {
    std::ofstream out(path);
    out << step << 1 << tail << '\n'
        << R"({"migration":{"step":1,"forced":true}})" << '\n'
        << step << 2 << tail << '\n'
        << R"({"resumed":{"step":2,"checkpoint":"c","dropped":0}})" << '\n'
        << step << 3 << tail << '\n'
        << R"({"migration":{"step":3,"forced":true}})" << '\n'
        << step << 4 << tail << '\n'
        << R"({"step":5,"loss":1,"tok)";  // a write cut short by the kill
  }
  auto dropped = resume_metrics_file(path, 2, "ckpt/step-2");
  REQUIRE_MESSAGE(dropped, dropped.error().message);
  CHECK(*dropped == 4);
  CHECK(slurp(path) ==
        step + "1" + tail + "\n" + R"({"migration":{"step":1,"forced":true}})" + "\n" + step + "2" +
            tail + "\n" + R"({"resumed":{"step":2,"checkpoint":"c","dropped":0}})" + "\n" +
            R"({"resumed":{"step":2,"checkpoint":"ckpt/step-2","dropped":4}})" + "\n");
  CHECK(!std::filesystem::exists(path + ".resume-tmp"));
  // the resumed line is JSON, the checkpoint escaped
  const auto j = nlohmann::json::parse(resumed_json(7, "a\"b", 0));
  CHECK(j.at("resumed").at("checkpoint") == "a\"b");
  // a file that is not there yet is created with the resumed line alone
  const std::string fresh = (tmp.path / "new.jsonl").string();
  auto none = resume_metrics_file(fresh, 5, "c");
  REQUIRE(none);
  CHECK(*none == 0);
  CHECK(slurp(fresh) == R"({"resumed":{"step":5,"checkpoint":"c","dropped":0}})"
                        "\n");
  // a directory that cannot be written: an error naming the path, the file unchanged
  const std::string before = slurp(path);
  auto bad = resume_metrics_file((tmp.path / "no-such-dir" / "m.jsonl").string(), 2, "c");
  REQUIRE(!bad);
  CHECK(bad.error().message.find("no-such-dir/m.jsonl") != std::string::npos);
  CHECK(slurp(path) == before);
}

TEST_CASE("restart_metrics_file: a training that starts over keeps the earlier restarts only") {
  testing::TempDir tmp;
  const std::string path = tmp.file("m.jsonl");
  const std::string first = restart_json(0, 1, 3, "", "rank 1 killed by signal 9 (SIGKILL)");
  {
    std::ofstream f(path);
    f << R"({"step":1,"loss":1.0,"tokens":1,"time":1.000000,"busy":[],"idle":[]})" << '\n'
      << first << '\n'
      << R"({"step":1,"loss":1.0,"tokens":1,"time":1.000000,"busy":[],"idle":[]})" << '\n'
      << R"({"step":2,"loss":1.0,"tok)";  // a write cut short by the kill
  }
  auto dropped = restart_metrics_file(path);
  REQUIRE_MESSAGE(dropped, dropped.error().message);
  CHECK(*dropped == 3);
  CHECK(slurp(path) == first + "\n");  // no "resumed" line: nothing was resumed
  // none there yet: an empty file
  const std::string fresh = tmp.file("new.jsonl");
  auto none = restart_metrics_file(fresh);
  REQUIRE(none);
  CHECK(*none == 0);
  CHECK(slurp(fresh).empty());
}

TEST_CASE("stopped_json: the step, the signal and the checkpoint, a resume keeps it") {
  CHECK(stopped_json(37, "SIGTERM", "ckpt/step-37") ==
        R"({"stopped":{"step":37,"signal":"SIGTERM","checkpoint":"ckpt/step-37"}})");
  CHECK(stopped_json(3, "", "") == R"({"stopped":{"step":3,"signal":"","checkpoint":""}})");
  testing::TempDir tmp;
  const std::string path = tmp.file("m.jsonl");
  {
    std::ofstream f(path);
    f << R"({"step":3,"loss":1.0,"tokens":1,"time":1.000000,"busy":[],"idle":[]})" << '\n'
      << stopped_json(3, "SIGINT", "c/step-3") << '\n'
      << R"({"step":4,"loss":1.0,"tokens":1,"time":1.000000,"busy":[],"idle":[]})" << '\n'
      << stopped_json(4, "SIGINT", "c/step-4") << '\n';
  }
  auto dropped = resume_metrics_file(path, 3, "c/step-3");
  REQUIRE(dropped.ok());
  CHECK(*dropped == 2);  // step 4 and its stop: the resume replays them
  std::ifstream f(path);
  std::string l1, l2, l3, rest;
  std::getline(f, l1);
  std::getline(f, l2);
  std::getline(f, l3);
  CHECK(l2 == stopped_json(3, "SIGINT", "c/step-3"));
  CHECK(l3 == resumed_json(3, "c/step-3", 2));
  CHECK_FALSE(std::getline(f, rest));
}
