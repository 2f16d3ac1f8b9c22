// Config: one TOML file ([model] [data] [pipeline] [optimizer] [train] [checkpoint]) plus
// command-line overrides `--set section.key=value`, parsed into engine/options.hpp and validated.
#include "engine/config/config.hpp"

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <set>
#include <sstream>
#include <toml.hpp>

#include "engine/config/forced_moves.hpp"
#include "engine/config/option_table.hpp"
#include "engine/delay_correction.hpp"
#include "engine/internal/file_io.hpp"
#include "engine/mode.hpp"
#include "engine/utf8.hpp"

namespace actorpipe {

namespace {

using internal::find_option;
using internal::OptionSpec;
using internal::OptKind;
using internal::OptValue;

std::string join(const std::vector<std::string>& xs, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (i) out += sep;
    out += xs[i];
  }
  return out;
}

std::string trim(std::string_view s) {
  auto b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  auto e = s.find_last_not_of(" \t");
  return std::string(s.substr(b, e - b + 1));
}

std::vector<std::string> keys_of(std::string_view section) {
  std::vector<std::string> out;
  for (const auto& s : internal::option_table()) {
    if (s.section == section) out.push_back(s.key);
  }
  return out;
}

// A TOML value as the user would have written it.
std::string show(const toml::value& v) {
  switch (v.type()) {
    case toml::value_t::boolean:
      return v.as_boolean() ? "true" : "false";
    case toml::value_t::integer:
      return fmt::format("{}", v.as_integer());
    case toml::value_t::floating:
      return fmt::format("{}", v.as_floating());
    case toml::value_t::string:
      return internal::to_toml_text(OptKind::string, v.as_string().str);
    case toml::value_t::array: {
      std::vector<std::string> xs;
      for (const auto& x : v.as_array()) xs.push_back(show(x));
      return "[" + join(xs, ", ") + "]";
    }
    case toml::value_t::table:
      return "a table";
    default:
      return "a date/time";
  }
}

std::string type_of(const toml::value& v) {
  switch (v.type()) {
    case toml::value_t::boolean:
      return "a boolean";
    case toml::value_t::integer:
      return "an integer";
    case toml::value_t::floating:
      return "a float";
    case toml::value_t::string:
      return "a string";
    case toml::value_t::array:
      return "an array";
    case toml::value_t::table:
      return "a table";
    default:
      return "a date/time";
  }
}

// Converts a TOML value to the key's type; the error text says what is wrong and what is allowed.
Expected<OptValue> convert(const OptionSpec& spec, const toml::value& v) {
  auto wrong = [&](std::string_view expected) {
    return make_error("{} = {}: expected {}, got {}", spec.name(), show(v), expected, type_of(v));
  };
  switch (spec.kind) {
    case OptKind::integer: {
      if (!v.is_integer()) return wrong("an integer");
      auto x = v.as_integer();
      if (x < INT_MIN || x > INT_MAX) {
        return make_error("{} = {}: out of the 32-bit integer range (allowed: {})", spec.name(), x,
                          spec.allowed);
      }
      return OptValue{static_cast<int64_t>(x)};
    }
    case OptKind::uinteger: {
      if (!v.is_integer()) return wrong("a non-negative integer");
      auto x = v.as_integer();
      if (x < 0) {
        return make_error("{} = {}: negative (allowed: {})", spec.name(), x, spec.allowed);
      }
      return OptValue{static_cast<int64_t>(x)};
    }
    case OptKind::real32:
    case OptKind::real64: {
      double x = 0;
      if (v.is_floating()) {
        x = v.as_floating();
      } else if (v.is_integer()) {
        x = static_cast<double>(v.as_integer());
      } else {
        return wrong("a number");
      }
      if (!std::isfinite(x) || (spec.kind == OptKind::real32 && std::fabs(x) > FLT_MAX)) {
        return make_error("{} = {}: not a finite {} (allowed: {})", spec.name(), show(v),
                          spec.kind == OptKind::real32 ? "32-bit float" : "number", spec.allowed);
      }
      return OptValue{x};
    }
    case OptKind::boolean:
      if (!v.is_boolean()) return wrong("true or false");
      return OptValue{v.as_boolean()};
    case OptKind::string:
      if (!v.is_string()) return wrong("a string");
      return OptValue{v.as_string().str};
    case OptKind::arch: {
      if (!v.is_string()) return wrong("a string (gpt or bert)");
      const std::string& s = v.as_string().str;
      if (s != "gpt" && s != "bert") {
        return make_error("{} = {}: unknown architecture (allowed: gpt, bert)", spec.name(),
                          show(v));
      }
      return OptValue{s};
    }
    case OptKind::int_list: {
      if (v.is_string()) {
        if (v.as_string().str == "even") return OptValue{std::vector<int64_t>{}};
        if (v.as_string().str == "auto") return OptValue{std::string("auto")};
        return make_error("{} = {}: expected \"even\", \"auto\" or an array of integers",
                          spec.name(), show(v));
      }
      if (!v.is_array()) return wrong("\"even\", \"auto\" or an array of integers");
      std::vector<int64_t> out;
      for (const auto& x : v.as_array()) {
        if (!x.is_integer() || x.as_integer() < INT_MIN || x.as_integer() > INT_MAX) {
          return make_error("{} = {}: element {} is not a 32-bit integer", spec.name(), show(v),
                            show(x));
        }
        out.push_back(x.as_integer());
      }
      return OptValue{std::move(out)};
    }
    case OptKind::layer_set: {
      constexpr std::string_view allowed =
          "\"none\", \"all\", \"auto\" or an array of layer indices";
      if (v.is_string()) {
        const std::string& w = v.as_string().str;
        if (w == "none" || w == "all" || w == "auto") return OptValue{w};
        return make_error("{} = {}: expected {}", spec.name(), show(v), allowed);
      }
      if (!v.is_array()) return wrong(allowed);
      std::vector<int64_t> out;
      for (const auto& x : v.as_array()) {
        if (!x.is_integer() || x.as_integer() < INT_MIN || x.as_integer() > INT_MAX) {
          return make_error("{} = {}: element {} is not a 32-bit integer", spec.name(), show(v),
                            show(x));
        }
        out.push_back(x.as_integer());
      }
      return OptValue{std::move(out)};
    }
  }
  return make_error("{}: unhandled type", spec.name());
}

std::string unknown_section_message(const std::string& name) {
  std::string msg = fmt::format("unknown section [{}] (known: {})", name,
                                join(internal::option_sections(), ", "));
  if (auto c = internal::closest(name, internal::option_sections()); !c.empty()) {
    msg += fmt::format("; did you mean [{}]?", c);
  }
  return msg;
}

std::string unknown_key_message(const std::string& section, const std::string& key) {
  std::string msg = fmt::format("{}.{}: unknown key", section, key);
  if (auto c = internal::closest(key, keys_of(section)); !c.empty()) {
    return msg + fmt::format("; did you mean {}.{}?", section, c);
  }
  for (const auto& s : internal::option_table()) {
    if (s.key == key) return msg + fmt::format("; did you mean {}?", s.name());
  }
  return msg + fmt::format(" (known keys of [{}]: {})", section, join(keys_of(section), ", "));
}

std::string where(const toml::value& v) {
  const auto loc = v.location();
  return fmt::format("{}:{}", loc.file_name(), loc.line());
}

// Applies a parsed TOML document, appending one message per problem.
void apply_document(Config& config, const toml::value& root, std::vector<std::string>& errors) {
  // Visit sections and keys in file order (toml11 tables are unordered).
  auto by_line = [](const toml::table& t) {
    std::vector<std::pair<std::string, const toml::value*>> xs;
    for (const auto& [k, v] : t) xs.emplace_back(k, &v);
    std::sort(xs.begin(), xs.end(), [](const auto& a, const auto& b) {
      auto la = a.second->location().line(), lb = b.second->location().line();
      return la != lb ? la < lb : a.first < b.first;
    });
    return xs;
  };
  for (const auto& [section, value] : by_line(root.as_table())) {
    const auto& sections = internal::option_sections();
    const bool known = std::find(sections.begin(), sections.end(), section) != sections.end();
    if (!value->is_table() && known) {
      errors.push_back(
          fmt::format("{}: {} must be a section [{}]", where(*value), section, section));
      continue;
    }
    if (!value->is_table()) {
      std::string msg =
          fmt::format("{}: {} = {} is outside any section", where(*value), section, show(*value));
      for (const auto& s : internal::option_table()) {
        if (s.key == section) {
          msg += fmt::format("; did you mean {} (under [{}])?", s.name(), s.section);
          break;
        }
      }
      errors.push_back(msg);
      continue;
    }
    if (!known) {
      errors.push_back(fmt::format("{}: {}", where(*value), unknown_section_message(section)));
      continue;
    }
    for (const auto& [key, v] : by_line(value->as_table())) {
      const OptionSpec* spec = find_option(section, key);
      if (!spec) {
        errors.push_back(fmt::format("{}: {}", where(*v), unknown_key_message(section, key)));
        continue;
      }
      auto converted = convert(*spec, *v);
      if (!converted) {
        errors.push_back(fmt::format("{}: {}", where(*v), converted.error().message));
        continue;
      }
      spec->set(config, *converted);
    }
  }
}

Expected<toml::value> parse_toml(const std::string& text, const std::string& name) {
  // TOML is UTF-8; toml11 3.7 reads out of bounds reporting an invalid sequence in a literal
  // string, so the text is checked before it sees it.
  if (const auto bad = find_invalid_utf8(text)) {
    const auto line =
        1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(*bad), '\n');
    return make_error("{}:{}: not UTF-8: byte {:#04x} at offset {} (TOML text is UTF-8)", name,
                      line, static_cast<unsigned char>(text[*bad]), *bad);
  }
  std::istringstream in(text);
  try {
    return toml::parse(in, name);
  } catch (const toml::syntax_error& e) {
    return make_error("{}:{}: TOML syntax error:\n{}", name, e.location().line(), e.what());
  } catch (const std::exception& e) {
    return make_error("{}: TOML error:\n{}", name, e.what());
  }
}

Status finish(Config& config, const std::vector<std::string>& sets,
              std::vector<std::string> errors) {
  for (const auto& s : sets) {
    if (auto st = apply_set(config, s); !st) errors.push_back(st.error().message);
  }
  if (errors.empty()) {
    if (auto st = validate(config); !st) return st;
  }
  if (errors.empty()) return {};
  return Error{join(errors, "\n")};
}

Expected<Config> from_text(const std::string& text, const std::string& name,
                           const std::vector<std::string>& sets) {
  Config config;
  std::vector<std::string> errors;
  auto doc = parse_toml(text, name);
  if (!doc) return doc.error();
  apply_document(config, *doc, errors);
  if (auto st = finish(config, sets, std::move(errors)); !st) return st.error();
  return config;
}

}  // namespace

Expected<Config> load_config(const std::string& path, const std::vector<std::string>& sets) {
  if (path.empty()) {
    Config config;
    if (auto st = finish(config, sets, {}); !st) return st.error();
    return config;
  }
  auto text = internal::read_file(path);
  if (!text) return make_error("config {}", text.error().message);
  return from_text(*text, path, sets);
}

Expected<Config> config_from_string(std::string_view toml_text,
                                    const std::vector<std::string>& sets) {
  return from_text(std::string(toml_text), "<string>", sets);
}

Status apply_set(Config& config, std::string_view assignment) {
  const std::string arg = fmt::format("--set {}", assignment);
  const auto eq = assignment.find('=');
  if (eq == std::string_view::npos) {
    return make_error("{}: expected section.key=value (e.g. pipeline.mode=2bw)", arg);
  }
  const std::string lhs = trim(assignment.substr(0, eq));
  const std::string rhs = trim(assignment.substr(eq + 1));
  const auto dot = lhs.find('.');
  if (dot == std::string::npos) {
    std::string msg = fmt::format("{}: \"{}\" is not section.key", arg, lhs);
    for (const auto& s : internal::option_table()) {
      if (s.key == lhs) return make_error("{}; did you mean {}?", msg, s.name());
    }
    return make_error("{} (sections: {})", msg, join(internal::option_sections(), ", "));
  }
  const std::string section = lhs.substr(0, dot);
  const std::string key = lhs.substr(dot + 1);
  const auto& sections = internal::option_sections();
  if (std::find(sections.begin(), sections.end(), section) == sections.end()) {
    return make_error("{}: {}", arg, unknown_section_message(section));
  }
  const OptionSpec* spec = find_option(section, key);
  if (!spec) return make_error("{}: {}", arg, unknown_key_message(section, key));

  if (const auto bad = find_invalid_utf8(rhs)) {
    return make_error("{}: the value is not UTF-8: byte {:#04x} at offset {}", arg,
                      static_cast<unsigned char>(rhs[*bad]), *bad);
  }
  toml::value value;
  const bool quoted = !rhs.empty() && (rhs.front() == '"' || rhs.front() == '\'');
  if ((spec->kind == OptKind::string || spec->kind == OptKind::arch) && !quoted) {
    value = toml::value(rhs);
  } else if (spec->kind == OptKind::int_list && (rhs == "even" || rhs == "auto")) {
    value = toml::value(rhs);
  } else if (spec->kind == OptKind::layer_set && !rhs.empty() && rhs.front() != '[' && !quoted) {
    value = toml::value(rhs);  // --set pipeline.recompute=all
  } else {
    auto doc = parse_toml("v = " + rhs + "\n", arg);
    if (!doc) {
      return make_error("{}: {} is not a TOML value (expected {}; allowed: {})", arg, rhs,
                        internal::kind_name(spec->kind), spec->allowed);
    }
    value = doc->as_table().at("v");
  }
  auto converted = convert(*spec, value);
  if (!converted) return make_error("{}: {}", arg, converted.error().message);
  spec->set(config, *converted);
  return {};
}

Expected<std::vector<std::string>> collect_sets(int argc, const char* const* argv) {
  std::vector<std::string> out;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--set") {
      if (i + 1 >= argc) return make_error("--set needs a section.key=value argument");
      out.emplace_back(argv[++i]);
    } else if (a.rfind("--set=", 0) == 0) {
      out.emplace_back(a.substr(6));
    }
  }
  return out;
}

std::string to_toml(const Config& config) {
  std::string out = "# actorpipe configuration (docs/config.md describes every key)\n";
  std::string section;
  for (const auto& spec : internal::option_table()) {
    if (spec.section != section) {
      section = spec.section;
      out += fmt::format("\n[{}]\n", section);
    }
    out += fmt::format("{} = {}\n", spec.key,
                       internal::to_toml_text(spec.kind, spec.get(config), spec.name()));
  }
  return out;
}

int num_layers(const ModelOptions& model) {
  return model.depth + 2;
}

Status validate(const Config& c) {
  std::vector<std::string> e;
  auto bad = [&](std::string msg) { e.push_back(std::move(msg)); };
  const ModelOptions& m = c.model;
  if (m.vocab_size < 2) bad(fmt::format("model.vocab_size = {}: must be >= 2", m.vocab_size));
  if (m.context < 1) bad(fmt::format("model.context = {}: must be >= 1", m.context));
  if (m.width < 1) bad(fmt::format("model.width = {}: must be >= 1", m.width));
  if (m.depth < 1) bad(fmt::format("model.depth = {}: must be >= 1", m.depth));
  if (m.heads < 1) {
    bad(fmt::format("model.heads = {}: must be >= 1", m.heads));
  } else if (m.width >= 1 && m.width % m.heads != 0) {
    bad(fmt::format("model.heads = {}: must divide model.width = {} (allowed: a divisor of {})",
                    m.heads, m.width, m.width));
  }
  if (m.segments < 1) bad(fmt::format("model.segments = {}: must be >= 1", m.segments));
  if (m.init_seed > static_cast<uint64_t>(INT64_MAX)) {
    bad(fmt::format("model.init_seed = {}: must be <= 2^63-1 (a TOML integer)", m.init_seed));
  }

  const DataOptions& d = c.data;
  if (d.kind != "synthetic" && d.kind != "text" && d.kind != "tokens") {
    bad(fmt::format("data.kind = \"{}\": unknown data source (allowed: synthetic, text, tokens)",
                    d.kind));
  } else if (d.kind != "synthetic" && d.path.empty()) {
    bad(fmt::format("data.path = \"\": data.kind = \"{}\" needs a file path", d.kind));
  }
  if (d.synthetic_branching < 1) {
    bad(fmt::format("data.synthetic_branching = {}: must be >= 1", d.synthetic_branching));
  }
  if (!(d.mask_prob > 0.0 && d.mask_prob <= 1.0)) {
    bad(fmt::format("data.mask_prob = {}: must be in (0, 1]", d.mask_prob));
  }
  if (!(d.holdout >= 0.0 && d.holdout <= 0.5)) {
    bad(fmt::format("data.holdout = {}: must be in [0, 0.5]", d.holdout));
  }
  const EvalOptions& ev = c.eval;
  if (ev.every < 0) bad(fmt::format("eval.every = {}: must be >= 0", ev.every));
  if (ev.microbatches < 1 || ev.microbatches > kMaxMicrobatches) {
    bad(fmt::format("eval.microbatches = {}: must be in 1 .. {}", ev.microbatches,
                    kMaxMicrobatches));
  }
  if (!ev.path.empty() && d.kind == "synthetic") {
    bad(
        fmt::format("eval.path = \"{}\": a held-out file needs data.kind text or tokens (the "
                    "synthetic corpus has a held-out stream of its own)",
                    ev.path));
  }
  if (ev.every > 0 && ev.path.empty() && (d.kind == "text" || d.kind == "tokens") &&
      d.holdout == 0.0) {
    bad(
        fmt::format("eval.every = {} with data.kind = \"{}\": held-out data is needed; set "
                    "data.holdout (a fraction of the file kept out of training) or eval.path",
                    ev.every, d.kind));
  }
  for (auto [name, v] : {std::pair{"data.seed", d.seed},
                         {"data.synthetic_seed", d.synthetic_seed},
                         {"train.seed", c.train.seed}}) {
    if (v > static_cast<uint64_t>(INT64_MAX)) {
      bad(fmt::format("{} = {}: must be <= 2^63-1 (a TOML integer)", name, v));
    }
  }

  const PipelineOptions& p = c.pipeline;
  Mode mode{};
  if (!from_string(p.mode, mode)) {
    std::vector<std::string> names;
    for (Mode x : all_modes) names.emplace_back(to_string(x));
    bad(fmt::format("pipeline.mode = \"{}\": unknown mode (allowed: {})", p.mode,
                    join(names, ", ")));
  }
  const int layers = num_layers(m);
  if (p.stages < 1) {
    bad(fmt::format("pipeline.stages = {}: must be >= 1", p.stages));
  } else if (m.depth >= 1 && p.stages > layers) {
    bad(
        fmt::format("pipeline.stages = {}: more stages than the model's {} layers "
                    "(model.depth + 2 = {} + 2); every stage needs at least one layer",
                    p.stages, layers, m.depth));
  }
  if (p.microbatches < 1) {
    bad(fmt::format("pipeline.microbatches = {}: must be >= 1", p.microbatches));
  } else if (p.microbatches > kMaxMicrobatches) {
    bad(
        fmt::format("pipeline.microbatches = {}: at most {} per step (a step's schedule and its "
                    "bookkeeping grow with it)",
                    p.microbatches, kMaxMicrobatches));
  } else if (p.mode == "2bw" && p.stages >= 1 && p.microbatches < p.stages) {
    bad(
        fmt::format("pipeline.microbatches = {}: mode 2bw needs at least as many microbatches as "
                    "pipeline.stages = {}",
                    p.microbatches, p.stages));
  }
  if (p.replicas < 0) {
    bad(
        fmt::format("pipeline.replicas = {}: must be >= 0 (0: the planner chooses the replicas and "
                    "pipeline.stages for the job's processes)",
                    p.replicas));
  } else if (p.replicas > 1) {
    if (p.microbatches >= 1 && p.microbatches % p.replicas != 0) {
      bad(fmt::format(
          "pipeline.replicas = {}: must divide pipeline.microbatches = {} (each replica runs "
          "microbatches / replicas of every step)",
          p.replicas, p.microbatches));
    } else if (p.mode == "2bw" && p.stages >= 1 && p.microbatches / p.replicas < p.stages) {
      bad(fmt::format(
          "pipeline.replicas = {}: mode 2bw needs at least pipeline.stages = {} microbatches per "
          "replica, and pipeline.microbatches = {} gives {}",
          p.replicas, p.stages, p.microbatches, p.microbatches / p.replicas));
    }
    if (p.mode == "pipedream" || p.mode == "xpipe") {
      bad(fmt::format(
          "pipeline.replicas = {}: mode {} updates every stage after each microbatch on its "
          "own schedule of weight versions; replicas would need an all-reduce per microbatch "
          "(supported: gpipe, 1f1b, 2bw)",
          p.replicas, p.mode));
    }
  }
  if (p.microbatch_size < 1) {
    bad(fmt::format("pipeline.microbatch_size = {}: must be >= 1", p.microbatch_size));
  }
  if (p.seq_len < 0) {
    bad(fmt::format("pipeline.seq_len = {}: must be >= 0 (0 = model.context)", p.seq_len));
  } else if (p.seq_len > m.context) {
    bad(fmt::format("pipeline.seq_len = {}: exceeds model.context = {}", p.seq_len, m.context));
  }
  if (!p.partition.counts.empty()) {
    const std::vector<int>& counts = p.partition.counts;
    const std::string shown = fmt::format("[{}]", fmt::join(counts, ", "));
    int64_t sum = 0;
    bool positive = true;
    for (int x : counts) {
      sum += x;
      positive = positive && x >= 1;
    }
    if (static_cast<int>(counts.size()) != p.stages) {
      bad(
          fmt::format("pipeline.partition = {}: {} entries but pipeline.stages = {} (allowed: "
                      "\"even\", \"auto\" or one entry per stage)",
                      shown, counts.size(), p.stages));
    }
    if (!positive) {
      bad(fmt::format("pipeline.partition = {}: every stage needs at least 1 layer", shown));
    }
    if (m.depth >= 1 && sum != layers) {
      bad(
          fmt::format("pipeline.partition = {}: sums to {} but the model has {} layers "
                      "(model.depth + 2 = {} + 2)",
                      shown, sum, layers, m.depth));
    }
  }
  if (p.threads_per_stage < 1) {
    bad(fmt::format("pipeline.threads_per_stage = {}: must be >= 1", p.threads_per_stage));
  }
  if (p.precision != "fp32" && p.precision != "bf16") {  // kernels/precision.hpp
    bad(fmt::format("pipeline.precision = \"{}\": unknown precision (allowed: fp32, bf16)",
                    p.precision));
  }
  if (p.stash_precision != "fp32" && p.stash_precision != "bf16") {
    bad(fmt::format("pipeline.stash_precision = \"{}\": unknown precision (allowed: fp32, bf16)",
                    p.stash_precision));
  } else if (p.stash_precision == "bf16") {
    Mode stash_mode{};
    if (p.precision != "bf16") {
      bad(fmt::format(
          "pipeline.stash_precision = \"bf16\" needs pipeline.precision = \"bf16\" (got \"{}\"): "
          "the stash keeps the bf16 operands of bf16 products",
          p.precision));
    } else if (from_string(p.mode, stash_mode) && stash_mode != Mode::twobw &&
               stash_mode != Mode::pipedream) {
      bad(fmt::format(
          "pipeline.stash_precision = \"bf16\": pipeline.mode = \"{}\" keeps no weight version "
          "besides the newest (2bw and pipedream do)",
          p.mode));
    } else if (DelayCorrectionChoice dc;
               from_string(c.optimizer.delay_correction, dc) && dc.needs_weight_change()) {
      bad(fmt::format(
          "pipeline.stash_precision = \"bf16\": optimizer.delay_correction = \"{}\" computes "
          "Δ from the stashed version in f32 (use stash_precision = \"fp32\", or nesterov)",
          c.optimizer.delay_correction));
    }
  }
  if (p.device != "cpu" && p.device != "cuda" && p.device != "checked") {
    bad(fmt::format("pipeline.device = \"{}\": unknown device (allowed: cpu, cuda, checked)",
                    p.device));
  } else if (p.device != "cpu") {
    // what still reads or writes a stage's memory on the host (check_stage_backend)
    const std::string dev = fmt::format("pipeline.device = \"{}\"", p.device);
    if (p.stash_precision != "fp32") {
      bad(dev + ": pipeline.stash_precision = \"" + p.stash_precision +
          "\" keeps the stashed weights in host memory; only fp32 off the cpu");
    }
  }
  if (!p.device_ids.empty()) {
    const std::string shown = fmt::format("[{}]", fmt::join(p.device_ids, ", "));
    if (p.device != "cuda") {
      bad(
          fmt::format("pipeline.device_ids = {}: only with pipeline.device = \"cuda\" (here "
                      "\"{}\")",
                      shown, p.device));
    } else if (p.replicas != 0 && static_cast<int>(p.device_ids.size()) != p.stages) {
      bad(fmt::format("pipeline.device_ids = {}: {} entries but pipeline.stages = {}", shown,
                      p.device_ids.size(), p.stages));
    }
    if (std::any_of(p.device_ids.begin(), p.device_ids.end(), [](int id) { return id < 0; })) {
      bad(fmt::format("pipeline.device_ids = {}: GPU indices must be >= 0", shown));
    }
  }
  if (p.memory_limit_mb < 0) {
    bad(fmt::format("pipeline.memory_limit_mb = {}: must be >= 0 (MiB per stage; 0 = no limit)",
                    p.memory_limit_mb));
  }
  const MigrationOptions& mg = c.migration;
  if (auto moves = parse_forced_moves(mg.moves); !moves) {
    bad(moves.error().message);
  } else {
    for (const ForcedMove& mv : *moves) {
      const std::string shown = fmt::format("\"{}: {}\"", mv.step, fmt::join(mv.counts, ", "));
      int64_t sum = 0;
      for (int x : mv.counts) sum += x;
      if (static_cast<int>(mv.counts.size()) != p.stages) {
        bad(fmt::format("migration.moves: {} has {} layer counts but pipeline.stages = {}", shown,
                        mv.counts.size(), p.stages));
      } else if (m.depth >= 1 && sum != layers) {
        bad(
            fmt::format("migration.moves: {} sums to {} but the model has {} layers "
                        "(model.depth + 2 = {} + 2)",
                        shown, sum, layers, m.depth));
      }
    }
  }
  if (mg.check_every < 1) {
    bad(fmt::format("migration.check_every = {}: must be >= 1", mg.check_every));
  }
  if (!(mg.threshold > 0) || !std::isfinite(mg.threshold)) {
    bad(fmt::format("migration.threshold = {}: must be > 0", mg.threshold));
  }
  if (mg.patience < 1) bad(fmt::format("migration.patience = {}: must be >= 1", mg.patience));
  if (!(mg.min_gain >= 0 && mg.min_gain < 1)) {
    bad(fmt::format("migration.min_gain = {}: must be in [0, 1)", mg.min_gain));
  }
  if (p.recompute.kind == RecomputeSpec::Kind::layers) {
    const std::vector<int>& xs = p.recompute.layers;
    const std::string shown = fmt::format("[{}]", fmt::join(xs, ", "));
    for (size_t i = 0; i < xs.size(); ++i) {
      if (m.depth >= 1 && (xs[i] < 0 || xs[i] >= layers)) {
        bad(
            fmt::format("pipeline.recompute = {}: layer {} is outside the model's layers 0 .. {} "
                        "(model.depth + 2 = {} layers)",
                        shown, xs[i], layers - 1, layers));
      }
      if (std::find(xs.begin(), xs.begin() + static_cast<std::ptrdiff_t>(i), xs[i]) !=
          xs.begin() + static_cast<std::ptrdiff_t>(i)) {
        bad(fmt::format("pipeline.recompute = {}: layer {} is listed twice", shown, xs[i]));
      }
    }
  }
  const ClusterOptions& cl = c.cluster;
  if (!cl.placement.empty()) {
    const std::string shown = fmt::format("[{}]", fmt::join(cl.placement, ", "));
    if (static_cast<int>(cl.placement.size()) != p.stages) {
      bad(
          fmt::format("cluster.placement = {}: {} entries but pipeline.stages = {} (allowed: [] "
                      "or one rank per stage)",
                      shown, cl.placement.size(), p.stages));
    }
    if (std::any_of(cl.placement.begin(), cl.placement.end(), [](int r) { return r < 0; })) {
      bad(fmt::format("cluster.placement = {}: ranks must be >= 0", shown));
    }
  }
  if (cl.bind.empty()) bad("cluster.bind = \"\": must name an address (127.0.0.1 = this host)");
  if (cl.gpu_channel != "nccl" && cl.gpu_channel != "ucx") {
    bad(fmt::format("cluster.gpu_channel = \"{}\": allowed \"nccl\" or \"ucx\"", cl.gpu_channel));
  }
  if (!(cl.connect_timeout > 0)) {
    bad(fmt::format("cluster.connect_timeout = {}: must be > 0", cl.connect_timeout));
  }
  if (!(cl.peer_timeout > 0)) {
    bad(fmt::format("cluster.peer_timeout = {}: must be > 0", cl.peer_timeout));
  }
  const int tls_set = static_cast<int>(!cl.tls_certificate.empty()) +
                      static_cast<int>(!cl.tls_key.empty()) + static_cast<int>(!cl.tls_ca.empty());
  if (tls_set != 0 && tls_set != 3) {
    bad(
        fmt::format("cluster.tls_certificate = \"{}\", cluster.tls_key = \"{}\", cluster.tls_ca = "
                    "\"{}\": TLS needs all three files (or none for plain TCP)",
                    cl.tls_certificate, cl.tls_key, cl.tls_ca));
  }

  const OptimizerOptions& o = c.optimizer;
  if (o.kind != "adamw" && o.kind != "sgd") {
    bad(fmt::format("optimizer.kind = \"{}\": unknown optimizer (allowed: adamw, sgd)", o.kind));
  }
  auto finite = [](float x) { return std::isfinite(x); };
  if (!(o.lr > 0.0f) || !finite(o.lr)) bad(fmt::format("optimizer.lr = {}: must be > 0", o.lr));
  for (auto [name, v] : {std::pair{"optimizer.beta1", o.beta1},
                         {"optimizer.beta2", o.beta2},
                         {"optimizer.momentum", o.momentum}}) {
    if (!(v >= 0.0f && v < 1.0f)) bad(fmt::format("{} = {}: must be in [0, 1)", name, v));
  }
  if (!(o.eps > 0.0f) || !finite(o.eps)) {
    bad(fmt::format("optimizer.eps = {}: must be > 0", o.eps));
  }
  if (!(o.weight_decay >= 0.0f) || !finite(o.weight_decay)) {
    bad(fmt::format("optimizer.weight_decay = {}: must be >= 0", o.weight_decay));
  }
  if (!(o.grad_clip >= 0.0f) || !finite(o.grad_clip)) {
    bad(fmt::format("optimizer.grad_clip = {}: must be >= 0 (0 = off)", o.grad_clip));
  }
  if (o.warmup_steps < 0) {
    bad(fmt::format("optimizer.warmup_steps = {}: must be >= 0", o.warmup_steps));
  }
  if (o.decay_steps < 0 || (o.decay_steps > 0 && o.decay_steps <= o.warmup_steps)) {
    bad(fmt::format(
        "optimizer.decay_steps = {}: must be 0 (no decay) or greater than optimizer.warmup_steps "
        "({})",
        o.decay_steps, o.warmup_steps));
  }
  if (!(o.min_lr >= 0.0f && o.min_lr <= o.lr) || !finite(o.min_lr)) {
    bad(fmt::format("optimizer.min_lr = {}: must be in [0, optimizer.lr = {}]", o.min_lr, o.lr));
  }
  if (!(o.dc_lambda >= 0.0f) || !finite(o.dc_lambda)) {
    bad(fmt::format("optimizer.dc_lambda = {}: must be >= 0", o.dc_lambda));
  }
  if (!(o.momentum_decay >= 0.0f) || !finite(o.momentum_decay)) {
    bad(fmt::format("optimizer.momentum_decay = {}: must be >= 0", o.momentum_decay));
  }
  if (!(o.secant_decay >= 0.0f && o.secant_decay < 1.0f)) {
    bad(fmt::format("optimizer.secant_decay = {}: must be in [0, 1)", o.secant_decay));
  }
  if (o.rotation_every < 1) {
    bad(fmt::format("optimizer.rotation_every = {}: must be >= 1", o.rotation_every));
  }
  if (o.rotation_max_dim < 1) {
    bad(fmt::format("optimizer.rotation_max_dim = {}: must be >= 1", o.rotation_max_dim));
  }
  if (o.rotation_block < 0) {
    bad(fmt::format("optimizer.rotation_block = {}: must be >= 0 (0: each side whole)",
                    o.rotation_block));
  }
  DelayCorrectionChoice correction;
  if (!from_string(o.delay_correction, correction)) {
    bad(fmt::format("optimizer.delay_correction = \"{}\": unknown correction (allowed: {})",
                    o.delay_correction, fmt::join(delay_correction_names, ", ")));
  } else {
    if (o.momentum_decay != 0.0f && (!correction.lookahead || o.kind != "adamw")) {
      bad(fmt::format(
          "optimizer.momentum_decay = {}: NAdam's momentum schedule applies to a delay "
          "correction with the look-ahead (nesterov, dc+nesterov, secant+nesterov) with the "
          "adamw optimizer (here delay_correction = \"{}\", optimizer.kind = \"{}\")",
          o.momentum_decay, o.delay_correction, o.kind));
    }
    if (o.delay_correction != "none" && from_string(p.mode, mode)) {
      if (is_synchronous(mode)) {
        bad(fmt::format(
            "optimizer.delay_correction = \"{}\": pipeline.mode = \"{}\" computes every "
            "gradient at the weights it updates, so there is no delay to correct (the "
            "corrections apply to 2bw, pipedream and xpipe)",
            o.delay_correction, p.mode));
      } else if (correction.needs_weight_change() && mode == Mode::xpipe) {
        bad(fmt::format(
            "optimizer.delay_correction = \"{}\": pipeline.mode = \"xpipe\" runs each backward "
            "on the weights its update changes (only the forward used a prediction), so there is "
            "no weight change to compensate (use nesterov, or {} with 2bw or pipedream)",
            o.delay_correction, o.delay_correction));
      }
    }
    if (o.basis_rotation) {
      if (o.kind != "adamw") {
        bad(fmt::format(
            "optimizer.basis_rotation = true: rotates AdamW's second moment; optimizer.kind = "
            "\"{}\" keeps none (SGD's step does not depend on the basis)",
            o.kind));
      }
      if (correction.needs_weight_change()) {
        bad(
            fmt::format("optimizer.basis_rotation = true: not with optimizer.delay_correction = "
                        "\"{}\" (its compensation acts element by element in the coordinates); "
                        "use none or nesterov",
                        o.delay_correction));
      }
      if (p.device != "cpu") {
        bad(
            fmt::format("optimizer.basis_rotation = true: computed by the CPU kernels only (here "
                        "pipeline.device = \"{}\")",
                        p.device));
      }
    }
    const bool cpu_only = correction.compensation == DelayCorrectionChoice::Compensation::secant ||
                          (correction.needs_weight_change() && correction.lookahead);
    if (cpu_only && p.device == "cuda") {
      bad(
          fmt::format("optimizer.delay_correction = \"{}\": computed by the CPU kernels only; with "
                      "pipeline.device = \"cuda\" use none, nesterov or dc",
                      o.delay_correction));
    }
  }

  const TrainOptions& t = c.train;
  if (t.steps < 1) bad(fmt::format("train.steps = {}: must be >= 1", t.steps));
  if (t.log_every < 0)
    bad(fmt::format("train.log_every = {}: must be >= 0 (0 = never)", t.log_every));
  if (t.max_restarts < 0 || t.max_restarts > 1000) {
    bad(fmt::format("train.max_restarts = {}: must be in [0, 1000]", t.max_restarts));
  } else if (t.max_restarts > 0 && c.checkpoint.dir.empty()) {
    bad(fmt::format("train.max_restarts = {}: restarts resume from checkpoint.dir, which is empty",
                    t.max_restarts));
  }
  if (t.nonfinite != "stop" && t.nonfinite != "skip") {
    bad(fmt::format("train.nonfinite = \"{}\": unknown policy (allowed: stop, skip)", t.nonfinite));
  } else if (t.nonfinite == "skip" && from_string(p.mode, mode) && !is_synchronous(mode)) {
    bad(fmt::format(
        "train.nonfinite = \"skip\": pipeline.mode = \"{}\" overlaps its steps, so no step can be "
        "skipped on every stage consistently (skip needs gpipe or 1f1b)",
        p.mode));
  }
  if (t.stop != "step" && t.stop != "run")
    bad(fmt::format("train.stop = \"{}\": unknown choice (allowed: step, run)", t.stop));
  if (!(t.restart_backoff >= 0.0 && t.restart_backoff <= 3600.0)) {
    bad(fmt::format("train.restart_backoff = {}: must be in [0, 3600] seconds", t.restart_backoff));
  }

  const CheckpointOptions& k = c.checkpoint;
  if (k.every < 0) {
    bad(fmt::format("checkpoint.every = {}: must be >= 0 (0 = only the final checkpoint)",
                    k.every));
  } else if (k.every > 0 && k.dir.empty()) {
    bad(fmt::format("checkpoint.every = {}: periodic checkpoints need checkpoint.dir", k.every));
  }
  if (e.empty()) return {};
  return Error{join(e, "\n")};
}

std::vector<std::string> config_keys() {
  std::vector<std::string> out;
  for (const auto& s : internal::option_table()) out.push_back(s.name());
  return out;
}

std::string config_reference_markdown() {
  auto cell = [](std::string s) {
    std::string out;
    for (char ch : s) {
      if (ch == '|') {
        out += "\\|";
      } else if (ch == '<') {
        out += "&lt;";  // <dir> would be read as an HTML tag
      } else {
        out += ch;
      }
    }
    return out;
  };
  const Config defaults;
  std::string out;
  std::string section;
  for (const auto& spec : internal::option_table()) {
    if (spec.section != section) {
      section = spec.section;
      out += fmt::format("{}### [{}]\n\n", out.empty() ? "" : "\n", section);
      out += "| key | type | default | allowed | meaning |\n";
      out += "|-----|------|---------|---------|---------|\n";
    }
    out +=
        fmt::format("| `{}` | {} | `{}` | {} | {} |\n", spec.name(), internal::kind_name(spec.kind),
                    cell(internal::to_toml_text(spec.kind, spec.get(defaults), spec.name())),
                    cell(spec.allowed), cell(spec.meaning));
  }
  return out;
}

std::vector<std::string> job_config_lines(const Config& config) {
  static const std::set<std::string> own = {"cluster.bind",    "cluster.tls_certificate",
                                            "cluster.tls_key", "cluster.tls_ca",
                                            "train.metrics",   "train.trace",
                                            "train.log_every"};
  std::vector<std::string> out;
  for (const internal::OptionSpec& spec : internal::option_table()) {
    if (own.count(spec.name()) != 0) continue;
    out.push_back(spec.name() + " = " +
                  internal::to_toml_text(spec.kind, spec.get(config), spec.name()));
  }
  return out;
}

}  // namespace actorpipe
