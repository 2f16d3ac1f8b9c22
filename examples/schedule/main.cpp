// actorpipe-schedule: prints a mode's schedule as a stage x time grid with its bubble, stash and
// weight-version counts; exports/imports the torch CSV form; simulates with a cost model.
#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "engine/schedule/csv.hpp"
#include "engine/schedule/generators.hpp"
#include "engine/schedule/lowering.hpp"
#include "engine/schedule/schedule.hpp"
#include "engine/schedule/simulator.hpp"
#include "engine/schedule/validate.hpp"

using namespace actorpipe;

namespace {

constexpr double kMaxWork = 1e5;  // stages x microbatches x steps of a generated schedule

constexpr const char* usage = R"(usage: actorpipe-schedule [options]
  --mode M            gpipe | 1f1b | 2bw | pipedream | xpipe (default 1f1b)
  --stages D          pipeline stages, >= 1 (default 4)
  --microbatches M    microbatches per optimizer step, >= 1 (default 8; 2bw needs M >= D)
  --steps N           optimizer steps, >= 1 (default 1; gpipe and 1f1b cover exactly one);
                      pipedream runs M*N microbatches, each its own step
                      (D*M*N at most 100000: about 2 s to generate, validate and simulate)
  --versions          print the weight version (@v) and xpipe lookahead (+s) in the grid
  --lowered           print the grid with SEND/RECV actions
  --csv FILE          write the compute-only torch.distributed.pipelining CSV ("-": stdout only)
  --import FILE       read a compute-only CSV instead of generating (validated; --mode names it)
  --simulate          print the simulated timeline
  --cost-f LIST       F time per stage, comma-separated (one value or one per stage; default 1)
  --cost-b LIST       B time per stage (default 2)
  --opt-time S        OPT_STEP time in seconds (default 0)
  --act-bytes N       bytes per activation/gradient transfer (default 0)
  --latency S         link latency in seconds (default 0)
  --bandwidth B       link bandwidth in bytes/s (default 0 = infinite)
  --json              print one JSON object instead of text
  --help              this text
)";

struct BadArgument {
  std::string message;
};

[[noreturn]] void bad(std::string message) {
  throw BadArgument{std::move(message)};
}

int to_int(std::string_view flag, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < 1 || v > 1000000) {
    bad(fmt::format("{}: '{}' is not allowed: expected an integer from 1 to 1000000", flag, text));
  }
  return static_cast<int>(v);
}

double to_number(std::string_view flag, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v) || v < 0) {
    bad(fmt::format("{}: '{}' is not allowed: expected a finite number >= 0", flag, text));
  }
  return v;
}

std::vector<double> to_list(std::string_view flag, const std::string& text) {
  std::vector<double> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(to_number(flag, item));
  if (out.empty() || text.back() == ',') {
    bad(fmt::format("{}: '{}' is not allowed: expected numbers >= 0 separated by commas", flag,
                    text));
  }
  return out;
}

// One value for every stage, or one value per stage.
std::vector<double> per_stage(std::string_view flag, std::vector<double> v, int stages) {
  if (v.size() == 1) return std::vector<double>(stages, v[0]);
  if (static_cast<int>(v.size()) != stages) {
    bad(fmt::format("{}: {} values for {} stages: give one value or one per stage", flag, v.size(),
                    stages));
  }
  return v;
}

struct Options {
  std::string mode = "1f1b";
  int stages = 4, microbatches = 8, steps = 1;
  bool versions = false, lowered = false, simulate = false, json = false;
  std::string csv, import;
  std::vector<double> cost_f{1.0}, cost_b{2.0};
  double opt_time = 0, act_bytes = 0, latency = 0, bandwidth = 0;
  std::set<std::string> given;
};

Options parse(int argc, char** argv) {
  Options o;
  const std::set<std::string> flags = {"--versions", "--lowered", "--simulate", "--json", "--help"};
  const std::set<std::string> valued = {
      "--mode",   "--stages", "--microbatches", "--steps",     "--csv",     "--import",
      "--cost-f", "--cost-b", "--opt-time",     "--act-bytes", "--latency", "--bandwidth"};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (flags.count(arg)) {
      o.given.insert(arg);
      continue;
    }
    if (!valued.count(arg)) {
      bad(
          fmt::format("unknown argument '{}'; allowed: --mode, --stages, --microbatches, "
                      "--steps, --versions, --lowered, --csv, --import, --simulate, --cost-f, "
                      "--cost-b, --opt-time, --act-bytes, --latency, --bandwidth, --json, --help",
                      arg));
    }
    if (i + 1 >= argc) bad(fmt::format("{} needs a value (see --help)", arg));
    const std::string v = argv[++i];
    o.given.insert(arg);
    if (arg == "--mode") o.mode = v;
    if (arg == "--stages") o.stages = to_int(arg, v);
    if (arg == "--microbatches") o.microbatches = to_int(arg, v);
    if (arg == "--steps") o.steps = to_int(arg, v);
    if (arg == "--csv") o.csv = v;
    if (arg == "--import") o.import = v;
    if (arg == "--cost-f") o.cost_f = to_list(arg, v);
    if (arg == "--cost-b") o.cost_b = to_list(arg, v);
    if (arg == "--opt-time") o.opt_time = to_number(arg, v);
    if (arg == "--act-bytes") o.act_bytes = to_number(arg, v);
    if (arg == "--latency") o.latency = to_number(arg, v);
    if (arg == "--bandwidth") o.bandwidth = to_number(arg, v);
  }
  o.versions = o.given.count("--versions") > 0;
  o.lowered = o.given.count("--lowered") > 0;
  o.simulate = o.given.count("--simulate") > 0;
  o.json = o.given.count("--json") > 0;
  if (o.json && o.csv == "-") bad("--json and --csv - both write stdout: choose one");
  // a schedule is generated, validated and printed whole: its size is bounded up front
  if (o.import.empty() && o.stages >= 1 && o.microbatches >= 1 && o.steps >= 1) {
    const double work = static_cast<double>(o.stages) * o.microbatches * o.steps;
    if (work > kMaxWork) {
      bad(
          fmt::format("--stages {} x --microbatches {} x --steps {} = {:.0f} microbatch-stages, "
                      "more than this tool handles ({:.0f}, about 2 s): choose smaller sizes",
                      o.stages, o.microbatches, o.steps, work, kMaxWork));
    }
  }
  if (!o.import.empty()) {
    for (const char* f : {"--stages", "--microbatches", "--steps"}) {
      if (o.given.count(f))
        bad(
            fmt::format("{} cannot be combined with --import: the file "
                        "defines the shape",
                        f));
    }
  }
  return o;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::cerr << fmt::format("actorpipe-schedule: cannot read '{}'\n", path);
    std::exit(1);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

template <class T>
T or_die(Expected<T> e, int code) {
  if (!e) {
    std::cerr << "actorpipe-schedule: " << e.error().message << "\n";
    std::exit(code);
  }
  return std::move(*e);
}

std::string list(const std::vector<int>& v) {
  std::string out;
  for (int x : v) out += fmt::format("{}{}", out.empty() ? "" : " ", x);
  return out;
}

int run(const Options& o) {
  auto mode = parse_mode(o.mode);
  if (!mode) bad("--mode: " + mode.error().message);
  Schedule s;
  if (!o.import.empty()) {
    CsvImport opts;
    opts.mode = *mode;
    s = or_die(import_csv(read_file(o.import), opts), 1);
  } else {
    auto made = make_schedule(*mode, o.stages, o.microbatches, o.steps);
    if (!made) bad(made.error().message);
    s = std::move(*made);
  }
  CostModel costs;
  costs.forward = per_stage("--cost-f", o.cost_f, s.stages);
  costs.backward = per_stage("--cost-b", o.cost_b, s.stages);
  costs.optimizer.assign(s.stages, o.opt_time);
  costs.activation_bytes.assign(s.stages - 1, o.act_bytes);
  costs.latency = o.latency;
  costs.bandwidth = o.bandwidth;
  const Simulation sim = or_die(simulate(s, costs), 1);

  if (!o.csv.empty()) {
    const std::string csv = or_die(export_csv(s), 1);
    if (o.csv == "-") {
      std::cout << csv;
      return 0;
    }
    std::ofstream out(o.csv, std::ios::binary);
    out << csv;
    if (!out.flush()) {
      std::cerr << fmt::format("actorpipe-schedule: cannot write '{}'\n", o.csv);
      return 1;
    }
  }

  if (o.json) {
    nlohmann::json j;
    j["mode"] = std::string(to_string(s.mode));
    j["stages"] = s.stages;
    j["microbatches"] = s.microbatches;
    j["steps"] = s.steps;
    j["bubble_fraction"] = sim.bubble_fraction;
    j["stash_per_stage"] = sim.peak_stash;
    j["versions_per_stage"] = sim.versions_kept;
    j["makespan"] = sim.makespan;
    if (o.simulate) {
      nlohmann::json timeline = nlohmann::json::array();
      for (const TimedAction& t : sim.timeline) {
        timeline.push_back({{"stage", t.action.stage},
                            {"action", to_string(t.action)},
                            {"start", t.start},
                            {"end", t.end}});
      }
      j["timeline"] = std::move(timeline);
    }
    std::cout << j.dump() << "\n";
    return 0;
  }

  GridOptions grid;
  grid.versions = o.versions;
  const Schedule shown = o.lowered ? or_die(lower(s), 1) : s;
  std::cout << fmt::format("{} schedule: d={} stages, m={} microbatches per step, {} step{}\n",
                           to_string(s.mode), s.stages, s.microbatches, s.steps,
                           s.steps == 1 ? "" : "s");
  std::cout << format_grid(shown, grid);
  std::cout << fmt::format("bubble fraction: {:.6f}   makespan: {}\n", sim.bubble_fraction,
                           sim.makespan);
  std::cout << fmt::format("activation stash per stage: {}\n", list(sim.peak_stash));
  std::cout << fmt::format("weight versions per stage:  {}\n", list(sim.versions_kept));
  if (o.simulate) std::cout << "\n" << format_timeline(sim);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    if (o.given.count("--help")) {
      std::cout << usage;
      return 0;
    }
    return run(o);
  } catch (const BadArgument& e) {
    std::cerr << "actorpipe-schedule: " << e.message << "\n";
    return 2;
  }
}
