// Command-line arguments of actorpipe-bench: the options every command takes, the value after an
// option, comma lists and bounded integers; every error names the option, the value and what is
// allowed.
#include "bench/cli_args.hpp"

#include <algorithm>
#include <charconv>
#include <utility>

namespace actorpipe::bench {

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

Expected<std::vector<int>> parse_int_list(const std::string& option, const std::string& text,
                                          int lo, int hi) {
  std::vector<int> out;
  for (const std::string& t : split_commas(text)) {
    auto n = parse_int(option, t, lo, hi);
    if (!n) return n.error();
    out.push_back(*n);
  }
  return out;
}

Expected<std::string> option_value(std::span<const std::string> args, size_t& i) {
  if (i + 1 >= args.size()) return make_error("{}: missing value", args[i]);
  return args[++i];
}

Expected<int> int_option(std::span<const std::string> args, size_t& i, int lo, int hi) {
  const std::string& option = args[i];
  auto v = option_value(args, i);
  if (!v) return v.error();
  return parse_int(option, *v, lo, hi);
}

Expected<std::vector<int>> int_list_option(std::span<const std::string> args, size_t& i, int lo,
                                           int hi) {
  const std::string& option = args[i];
  auto v = option_value(args, i);
  if (!v) return v.error();
  return parse_int_list(option, *v, lo, hi);
}

Expected<bool> parse_common_option(std::span<const std::string> args, size_t& i, CommonOptions& o) {
  const std::string& a = args[i];
  std::string* path = a == "--python" ? &o.python : a == "--peer-script" ? &o.peer_script : nullptr;
  if (path) {
    auto v = option_value(args, i);
    if (!v) return v.error();
    *path = std::move(*v);
    return true;
  }
  bool* flag = a == "--json" ? &o.json : a == "--help" || a == "-h" ? &o.help : nullptr;
  if (flag) *flag = true;
  if (a == "--no-peer") o.peer = false;
  return flag || a == "--no-peer";
}

Status parse_options(std::span<const std::string> args, CommonOptions& common,
                     const std::function<Status(size_t& i)>& other) {
  for (size_t i = 0; i < args.size(); ++i) {
    auto known = parse_common_option(args, i, common);
    if (!known) return known.error();
    if (*known) continue;
    Status parsed = other(i);
    if (!parsed) return parsed;
  }
  return {};
}

Expected<std::vector<Mode>> parse_mode_list(const std::string& option, const std::string& text) {
  std::vector<Mode> modes;
  for (const std::string& name : split_commas(text)) {
    auto mode = parse_mode(name);
    if (!mode) return make_error("{}: {}", option, mode.error().message);
    for (Mode seen : modes)
      if (seen == *mode) return make_error("{}: '{}' is listed twice", option, name);
    modes.push_back(*mode);
  }
  return modes;
}

Expected<std::vector<Mode>> modes_option(std::span<const std::string> args, size_t& i) {
  const std::string option = args[i];
  auto v = option_value(args, i);
  if (!v) return v.error();
  return parse_mode_list(option, *v);
}

Expected<Mode> mode_option(std::span<const std::string> args, size_t& i) {
  const std::string option = args[i];
  auto v = option_value(args, i);
  if (!v) return v.error();
  auto mode = parse_mode(*v);
  if (!mode) return make_error("{}: {}", option, mode.error().message);
  return *mode;
}

}  // namespace actorpipe::bench
