// Command-line arguments of actorpipe-bench: the options every command takes, the value after an
// option, comma lists and bounded integers; every error names the option, the value and what is
// allowed.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/expected.hpp"
#include "engine/mode.hpp"

namespace actorpipe::bench {

/// The options every command of actorpipe-bench takes: the PyTorch peer, JSON output, help.
struct CommonOptions {
  bool peer = true;                         ///< --no-peer skips the PyTorch peer
  bool json = false;                        ///< --json: JSON lines instead of tables
  bool help = false;                        ///< --help, -h
  std::string python = "/usr/bin/python3";  ///< --python PATH runs the peer
  std::string peer_script;                  ///< --peer-script PATH (default: the source tree's)
};

/// When args[i] is an option of CommonOptions, sets it in `o` (i moves onto its value, if it
/// takes one) and returns true; false for any other argument.
Expected<bool> parse_common_option(std::span<const std::string> args, size_t& i, CommonOptions& o);

/// Walks `args` option by option: parse_common_option takes those of CommonOptions, `other`
/// every other one, given its index (which it moves onto the option's value, if it takes one).
/// Stops at the first error.
Status parse_options(std::span<const std::string> args, CommonOptions& common,
                     const std::function<Status(size_t& i)>& other);

/// The comma-separated entries of `s`, empty ones included: "a,,b" -> {"a", "", "b"}, "" -> {""}.
std::vector<std::string> split_commas(const std::string& s);

/// `text` as an integer in [lo, hi]; the error names `option`, `text` and the range.
Expected<int> parse_int(const std::string& option, const std::string& text, int lo, int hi);

/// Every entry of the comma list `text` as an integer in [lo, hi] (parse_int on each).
Expected<std::vector<int>> parse_int_list(const std::string& option, const std::string& text,
                                          int lo, int hi);

/// The value of the option args[i]: args[i + 1], and i moves onto it.
/// "<option>: missing value" when args[i] is the last argument.
Expected<std::string> option_value(std::span<const std::string> args, size_t& i);

/// The value of the option args[i] as an integer in [lo, hi] (option_value, then parse_int).
Expected<int> int_option(std::span<const std::string> args, size_t& i, int lo, int hi);

/// The comma list `text` of modes (gpipe, 1f1b, 2bw, pipedream, xpipe), each at most once; the
/// error names `option` and the bad or repeated entry.
Expected<std::vector<Mode>> parse_mode_list(const std::string& option, const std::string& text);

/// The value of the option args[i] (e.g. --mode) as one mode; the error names the option.
Expected<Mode> mode_option(std::span<const std::string> args, size_t& i);

/// The value of the option args[i] (e.g. --modes) as a comma list of modes (parse_mode_list).
Expected<std::vector<Mode>> modes_option(std::span<const std::string> args, size_t& i);

/// The value of the option args[i] as a comma list of integers in [lo, hi].
Expected<std::vector<int>> int_list_option(std::span<const std::string> args, size_t& i, int lo,
                                           int hi);

}  // namespace actorpipe::bench
