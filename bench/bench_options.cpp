// Command line of actorpipe-bench: which shapes and thread counts to measure, how many
// repetitions, whether to run the PyTorch peer, print JSON lines or profile a step.
#include "bench/bench_options.hpp"

#include <charconv>

#include "bench/bench_shapes.hpp"

namespace actorpipe::bench {

namespace {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin <= s.size()) {
    const size_t end = std::min(s.find(',', begin), s.size());
    out.push_back(s.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

Expected<int> parse_int(const std::string& option, const std::string& text, int lo, int hi) {
  int v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || v < lo || v > hi)
    return make_error("{}: '{}' is not an integer in [{}, {}]", option, text, lo, hi);
  return v;
}

}  // namespace

std::string bench_usage() {
  return R"(usage: actorpipe-bench [options]

Times the reference trainer's full step (forward, backward, AdamW) of a GPT, next to the
GEMM-only floor of the same step and a PyTorch peer running the same model.

  --shapes a,b,...   shapes to measure: tiny, small, gpt2 (default: all three)
  --threads 1,2      thread counts (default: 1,2)
  --reps N           timed steps per configuration, median reported (default: 5)
  --warmup N         untimed steps before timing, at least 1 (default: 1)
  --no-peer          do not run the PyTorch peer
  --json             one JSON object per line per measurement instead of the table
  --profile          also break one step down by kernel category (sampled)
  --python PATH      interpreter of the peer (default: /usr/bin/python3)
  --peer-script PATH the peer script (default: bench/peers/torch_step.py of the source tree)
)";
}

Expected<BenchOptions> parse_bench_options(std::span<const std::string> args) {
  BenchOptions o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> Expected<std::string> {
      if (i + 1 >= args.size()) return make_error("{}: missing value", a);
      return args[++i];
    };
    if (a == "--shapes") {
      auto v = value();
      if (!v) return v.error();
      o.shapes.clear();
      for (const std::string& name : split_commas(*v)) {
        auto shape = find_bench_shape(name);
        if (!shape) return shape.error();
        o.shapes.push_back(name);
      }
    } else if (a == "--threads") {
      auto v = value();
      if (!v) return v.error();
      o.threads.clear();
      for (const std::string& t : split_commas(*v)) {
        auto n = parse_int("--threads", t, 1, 256);
        if (!n) return n.error();
        o.threads.push_back(*n);
      }
    } else if (a == "--reps" || a == "--warmup") {
      auto v = value();
      if (!v) return v.error();
      auto n = parse_int(a, *v, 1, 100000);
      if (!n) return n.error();
      (a == "--reps" ? o.reps : o.warmup) = *n;
    } else if (a == "--python" || a == "--peer-script") {
      auto v = value();
      if (!v) return v.error();
      (a == "--python" ? o.python : o.peer_script) = *v;
    } else if (a == "--no-peer") {
      o.peer = false;
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--profile") {
      o.profile = true;
    } else if (a == "--child") {
      o.child = true;
    } else if (a == "--help" || a == "-h") {
      o.help = true;
    } else {
      return make_error("unknown option '{}' (see --help)", a);
    }
  }
  return o;
}

}  // namespace actorpipe::bench
