// Progress line tests: durations, rates, the exact line, and the printer's two behaviours: plain
// lines every `every` steps when not on a terminal, one line rewritten with \r on a terminal.
#include "actors/api/actorpipe/progress.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <limits>
#include <string>

using namespace actorpipe;

namespace {

StepMetrics at(int64_t step, double seconds) {
  StepMetrics m;
  m.step = step;
  m.steps = 5;
  m.loss = 2.0 + 1.0 / static_cast<double>(step);
  m.tokens = step * 1000;
  m.seconds = seconds;
  m.stages = {{0.9 * seconds, 0.1 * seconds}, {0.5 * seconds, 0.5 * seconds}};
  return m;
}

// Everything written to a temporary FILE by `write`.
template <class F>
std::string capture(F write) {
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  write(f);
  std::fflush(f);
  std::string out(static_cast<size_t>(std::ftell(f)), '\0');
  std::rewind(f);
  CHECK(std::fread(out.data(), 1, out.size(), f) == out.size());
  std::fclose(f);
  return out;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("durations and rates") {
  CHECK(format_duration(0) == "0s");
  CHECK(format_duration(-3) == "0s");
  CHECK(format_duration(42.9) == "42s");
  CHECK(format_duration(185) == "3:05");
  CHECK(format_duration(3723) == "1:02:03");
  CHECK(format_rate(0) == "0");
  CHECK(format_rate(950.2) == "950");
  CHECK(format_rate(1234) == "1.23k");
  CHECK(format_rate(12345) == "12.3k");
  CHECK(format_rate(123456) == "123k");
  CHECK(format_rate(4.56e6) == "4.56M");
}

TEST_CASE("the progress line shows step, loss, floor, tokens/s, busy % per stage and ETA") {
  StepMetrics m;
  m.step = 120;
  m.steps = 300;
  m.loss = 1.23456;
  m.tokens = 123000;
  m.seconds = 10.0;  // 12 steps/s: 180 steps to go take 15 s
  m.stages = {{8.7, 1.3}, {9.1, 0.9}};
  CHECK(format_progress(m) == "step 120/300  loss 1.2346  12.3k tok/s  busy 87% 91%  ETA 15s");
  CHECK(format_progress(m, 1.092) ==
        "step 120/300  loss 1.2346 (floor 1.0920)  12.3k tok/s  busy 87% 91%  ETA 15s");
  m.stages.clear();  // the serial backend measures no stage times
  CHECK(format_progress(m) == "step 120/300  loss 1.2346  12.3k tok/s  ETA 15s");
}

TEST_CASE("not on a terminal: one plain line every `every` steps and at the last step") {
  const std::string out = capture([](std::FILE* f) {
    ProgressPrinter p(f, /*tty=*/false, /*every=*/2);
    for (int s = 1; s <= 5; ++s) p.step(at(s, 0.5 * s));
    p.finish();
  });
  CHECK(out.find('\r') == std::string::npos);
  CHECK(out.find('\x1b') == std::string::npos);
  CHECK(count(out, "\n") == 3);
  CHECK(out.rfind("step 2/5  loss 2.5000", 0) == 0);
  CHECK(out.find("\nstep 4/5  loss 2.2500") != std::string::npos);
  CHECK(out.find("\nstep 5/5  loss 2.2000") != std::string::npos);
  CHECK(out.back() == '\n');
}

TEST_CASE("on a terminal: one line rewritten in place, at most ten times a second, then ended") {
  const std::string out = capture([](std::FILE* f) {
    ProgressPrinter p(f, /*tty=*/true, /*every=*/1);
    p.step(at(1, 1.00));
    p.step(at(2, 1.05));  // 50 ms later: skipped
    p.step(at(3, 1.20));
    p.step(at(4, 1.21));  // skipped
    p.step(at(5, 1.22));  // the last step is always shown
    p.finish();
    p.finish();  // idempotent
  });
  CHECK(count(out, "\r") == 3);
  CHECK(count(out, "\x1b[K") == 3);
  CHECK(count(out, "\n") == 1);
  CHECK(out.back() == '\n');
  CHECK(out.find("step 2/5") == std::string::npos);
  CHECK(out.find("step 4/5") == std::string::npos);
  CHECK(out.find("\rstep 5/5") != std::string::npos);
}

TEST_CASE("every = 0 prints nothing") {
  for (bool tty : {false, true}) {
    const std::string out = capture([tty](std::FILE* f) {
      ProgressPrinter p(f, tty, 0);
      for (int s = 1; s <= 5; ++s) p.step(at(s, s));
      p.finish();
    });
    CHECK(out.empty());
  }
}

TEST_CASE("format_progress: steps dropped by train.nonfinite = skip end the line") {
  StepMetrics m;
  m.step = 3;
  m.steps = 10;
  m.loss = std::numeric_limits<double>::quiet_NaN();
  m.skipped = true;
  m.skipped_steps = 2;
  const std::string line = format_progress(m);
  CHECK(line.substr(0, 19) == "step 3/10  loss nan");
  CHECK(line.substr(line.size() - 24) == "  skipped 2 (non-finite)");
}
