// Benchmark report: one measurement (actorpipe's step, its GEMM floor and the PyTorch peer
// for one shape and thread count) as a table row, a JSON line and a profile table.
#include "bench/bench_report.hpp"

#include <fmt/format.h>

namespace actorpipe::bench {

namespace {
nlohmann::ordered_json number_or_null(bool ok, double v) {
  return ok ? nlohmann::ordered_json(v) : nlohmann::ordered_json();
}
}  // namespace

double peer_ratio(const Measurement& m) {
  return m.peer.ran && m.peer.tokens_per_s > 0 ? m.ours.tokens_per_s / m.peer.tokens_per_s : 0.0;
}

nlohmann::ordered_json measurement_json(const Measurement& m) {
  const StepResult& o = m.ours;
  nlohmann::ordered_json j = {
      {"name", "reference_trainer_step"},
      {"shape", m.shape.name},
      {"config", m.shape.describe()},
      {"threads", o.threads},
      {"precision", o.precision},
      {"tokens_per_s", o.tokens_per_s},
      {"gflops", o.gflops},
      {"peak_rss_mb", o.peak_rss_mb},
      {"peer_tokens_per_s", number_or_null(m.peer.ran, m.peer.tokens_per_s)},
      {"ratio", number_or_null(m.peer.ran, peer_ratio(m))},
      {"floor_ratio", number_or_null(o.floor_ok, o.floor_ratio)},
      {"step_ms", o.step_ms},
      {"step_ms_all", o.step_ms_all},
      {"reps", o.reps},
      {"warmup", o.warmup},
      {"parameters", o.parameters},
      {"model_flops_per_step", o.model_flops},
      {"first_loss", o.first_loss},
      {"floor_ms", number_or_null(o.floor_ok, o.floor_ms)},
      {"gemm_calls", o.gemm_calls},
      {"gemm_flops_per_step", o.gemm_flops},
      {"floor_gemm_gflops", number_or_null(o.floor_ok, o.gemm_flops / (o.floor_ms / 1000.0) / 1e9)},
      {"peer_step_ms", number_or_null(m.peer.ran, m.peer.step_ms)},
      {"peer_peak_rss_mb", number_or_null(m.peer.ran, m.peer.peak_rss_mb)},
      {"peer_import_rss_mb", number_or_null(m.peer.ran, m.peer.import_rss_mb)},
  };
  if (!o.floor_ok) j["floor_note"] = o.floor_note;
  if (m.peer.ran) {
    j["peer"] = fmt::format("torch {} ({})", m.peer.torch_version, m.peer.attention);
    j["peer_parameters"] = m.peer.parameters;
  } else {
    j["peer"] = nullptr;
    if (!m.peer.error.empty()) j["peer_note"] = m.peer.error;
  }
  if (o.profile) j["profile"] = to_json(o).at("profile");
  add_interference(j, m.other);
  return j;
}

std::string table_header() {
  return fmt::format(
             "{:<6} {:>3} {:>4} {:>9} {:>9} {:>8} {:>8} {:>9} {:>6} {:>9} {:>9} {:>8} {:>6}  {}\n",
             "shape", "thr", "prec", "step ms", "tok/s", "GFLOP/s", "RSS MiB", "floor ms", "/floor",
             "torch ms", "tok/s", "RSS MiB", "ratio", "other") +
         fmt::format(
             "{:<6} {:>3} {:>4} {:>9} {:>9} {:>8} {:>8} {:>9} {:>6} {:>9} {:>9} {:>8} {:>6}  {}\n",
             "", "", "", "actorpipe", "", "", "", "GEMM-only", "", "PyTorch", "", "", "ap/pt",
             "cores");
}

std::string table_row(const Measurement& m) {
  const StepResult& o = m.ours;
  std::string floor = o.floor_ok ? fmt::format("{:>9.1f} {:>5.2f}x", o.floor_ms, o.floor_ratio)
                                 : fmt::format("{:>9} {:>6}", "-", "-");
  std::string peer = m.peer.ran
                         ? fmt::format("{:>9.1f} {:>9.0f} {:>8.0f} {:>5.2f}x", m.peer.step_ms,
                                       m.peer.tokens_per_s, m.peer.peak_rss_mb, peer_ratio(m))
                         : fmt::format("{:>9} {:>9} {:>8} {:>6}", "-", "-", "-", "-");
  return fmt::format("{:<6} {:>3} {:>4} {:>9.1f} {:>9.0f} {:>8.1f} {:>8.0f} {} {}  {}\n",
                     m.shape.name, o.threads, o.precision, o.step_ms, o.tokens_per_s, o.gflops,
                     o.peak_rss_mb, floor, peer, interference_cell(m.other));
}

std::string profile_table(const Measurement& m) {
  if (!m.ours.profile) return {};
  const ProfileReport& p = *m.ours.profile;
  std::string s = fmt::format(
      "profile: {} ({}) at {} thread{}: {} step{} sampled every {:.1f} ms on {} thread{} "
      "({} samples{}), {:.1f} ms per sampled step (median unsampled {:.1f} ms)\n",
      m.shape.name, m.shape.describe(), m.ours.threads, m.ours.threads == 1 ? "" : "s", p.steps,
      p.steps == 1 ? "" : "s", p.period_ms, p.workers + 1, p.workers == 0 ? "" : "s", p.samples,
      p.dropped > 0 ? fmt::format(", {} dropped", p.dropped) : "", p.step_ms, m.ours.step_ms);
  s += fmt::format("  {:<13} {:>10} {:>7} {:>16}\n", "category", "caller ms", "share",
                   p.workers > 0 ? "other threads ms" : "");
  double caller = 0.0, workers = 0.0;
  for (const auto& row : p.rows) {
    caller += row.caller_ms;
    workers += row.workers_ms;
  }
  for (const auto& row : p.rows) {
    if (row.caller_ms < 0.05 && row.workers_ms < 0.05) continue;
    s += fmt::format("  {:<13} {:>10.1f} {:>6.1f}% {:>16}\n", to_string(row.category),
                     row.caller_ms, caller > 0 ? 100.0 * row.caller_ms / caller : 0.0,
                     p.workers > 0 ? fmt::format("{:.1f}", row.workers_ms) : "");
  }
  s += fmt::format("  {:<13} {:>10.1f} {:>6.1f}% {:>16}\n", "total", caller, 100.0,
                   p.workers > 0 ? fmt::format("{:.1f}", workers) : "");
  s += "  hottest functions (share of the samples of all threads, blocked ones left out):\n";
  for (const auto& h : p.hottest) {
    std::string name = h.name;
    if (name.size() > 96) name = name.substr(0, 93) + "...";
    s += fmt::format("  {:>6.1f}%  {:<12} {}{}\n", 100.0 * h.share, to_string(h.category), name,
                     h.where.empty() || h.where[0] == '/' ? "" : "  (" + h.where + ")");
  }
  return s;
}

std::string cells(const std::vector<double>& v, const char* format) {
  std::string s;
  for (double x : v) {
    if (!s.empty()) s += ' ';
    s += fmt::format(fmt::runtime(format), x);
  }
  return s;
}

std::vector<std::string> split_lines(const std::string& out) {
  std::vector<std::string> lines;
  size_t at = 0;
  while (at < out.size()) {
    const size_t nl = out.find('\n', at);
    lines.push_back(out.substr(at, nl == std::string::npos ? nl : nl - at));
    at = nl == std::string::npos ? out.size() : nl + 1;
  }
  return lines;
}

}  // namespace actorpipe::bench
