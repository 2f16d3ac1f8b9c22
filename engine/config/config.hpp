// Config: one TOML file ([model] [data] [pipeline] [optimizer] [train] [checkpoint]) plus
// command-line overrides `--set section.key=value`, parsed into engine/options.hpp and validated.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/expected.hpp"
#include "engine/options.hpp"

namespace actorpipe {

/// The most microbatches a step may have (pipeline.microbatches).
inline constexpr int kMaxMicrobatches = 65536;

/// Parses the TOML file at `path` (an empty path: no file, all defaults), then applies each
/// "section.key=value" of `sets` in order (later ones win), then validate()s the result.
/// Every problem found is reported in one error, one line each, naming the file and line (or
/// the --set argument), the key, the value and what is allowed; unknown keys get a suggestion.
Expected<Config> load_config(const std::string& path, const std::vector<std::string>& sets = {});

/// As load_config, with the TOML text given directly (errors name it "<string>").
Expected<Config> config_from_string(std::string_view toml,
                                    const std::vector<std::string>& sets = {});

/// Applies one override "section.key=value" to `config` without validating the whole. The value
/// is TOML (42, 1e-3, true, "text", [2, 2]); for string keys the quotes may be left out, and
/// pipeline.partition also accepts even and auto.
Status apply_set(Config& config, std::string_view assignment);

/// Collects the overrides of a command line: every `--set k=v` and `--set=k=v`. Other arguments
/// are left to the caller; a --set without a value is an error.
Expected<std::vector<std::string>> collect_sets(int argc, const char* const* argv);

/// The whole config as TOML, every key explicit; config_from_string(to_toml(c)) gives back c.
std::string to_toml(const Config& config);

/// "section.key = value" for every key the processes of one job must agree on, in table order:
/// all but those each process may set for itself (cluster.bind, cluster.tls_certificate,
/// cluster.tls_key, cluster.tls_ca: its own address and files; train.metrics, train.trace,
/// train.log_every: rank 0 reports).
std::vector<std::string> job_config_lines(const Config& config);

/// Checks ranges and combinations: heads divide width, lr > 0, a known mode, 2bw with at least
/// as many microbatches as stages, at most model.depth + 2 stages, a partition of stages
/// positive entries summing to depth + 2, seq_len <= context, a path for text and token data,
/// periodic checkpoints with a directory, ... All violations are reported, one per line.
Status validate(const Config& config);

/// Layers of the model: embedding + depth blocks + head.
int num_layers(const ModelOptions& model);

/// Every key the parser knows, as "section.key", in section order.
std::vector<std::string> config_keys();

/// The key reference of docs/config.md (a Markdown table per section: key, type, default,
/// allowed values, meaning), generated from the same table the parser uses.
std::string config_reference_markdown();

}  // namespace actorpipe
