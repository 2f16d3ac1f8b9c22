// Option table: one row per config key (section, key, type, allowed values, meaning) with
// accessors into Config; the TOML parser, to_toml, the docs and checkpoint manifests use it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/options.hpp"

namespace actorpipe::internal {

/// The value types a key can have.
enum class OptKind : uint8_t {
  integer,    // int: a TOML integer in the 32-bit range
  uinteger,   // uint64_t: a TOML integer >= 0 (TOML integers stop at 2^63 - 1)
  real32,     // float: a TOML float or integer, finite
  real64,     // double: a TOML float or integer, finite
  boolean,    // bool
  string,     // std::string
  int_list,   // pipeline.partition: a TOML array of integers, "even" (empty) or "auto" (a string)
  arch,       // Arch: "gpt" | "bert"
  layer_set,  // pipeline.recompute: "none" | "all" | "auto" (strings) or an array of integers
};

/// A key's value in a type-neutral form: integer and uinteger as int64_t, reals as double,
/// arch as its name.
using OptValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>>;

/// One config key.
struct OptionSpec {
  std::string section;  // "model"
  std::string key;      // "width"
  OptKind kind;
  std::string allowed;  // human-readable constraint, e.g. ">= 1, divides model.width"
  std::string meaning;  // one sentence for the reference
  std::function<OptValue(const Config&)> get;
  std::function<void(Config&, const OptValue&)> set;  // value already of the right kind
  /// "section.key"
  std::string name() const { return section + "." + key; }
};

/// Every key, in section order (model, data, pipeline, optimizer, train, checkpoint).
const std::vector<OptionSpec>& option_table();

/// The section names, in order.
const std::vector<std::string>& option_sections();

/// The row for section.key, or nullptr.
const OptionSpec* find_option(std::string_view section, std::string_view key);

/// "integer", "float", "boolean", "string", "array of integers", "string".
std::string_view kind_name(OptKind kind);

/// A value as TOML text: 128, 0.001, true, "text", [2, 2], "gpt". Floats use the shortest
/// decimal form that reads back to the same bits (1.0e-3 for float32 0.001f). `name`: the key,
/// whose empty list reads "even" for pipeline.partition and [] for the others.
std::string to_toml_text(OptKind kind, const OptValue& value, std::string_view name = {});

/// The candidate closest to `word` by edit distance, if it is close enough to be a likely typo.
std::string closest(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace actorpipe::internal
