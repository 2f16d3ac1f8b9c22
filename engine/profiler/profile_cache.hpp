// Profile cache: a measured layer profile kept as a small JSON file per model and machine, keyed
// by what the times depend on; a file for another key, or one that does not read back, is ignored.
#pragma once

#include <optional>
#include <string>

#include "engine/expected.hpp"
#include "engine/options.hpp"
#include "engine/profiler/profiler.hpp"

namespace actorpipe {

/// What a profile's times depend on, and so what a cached profile must match to be used: the
/// model's shape (not its init_seed), the optimizer kind, the microbatch (B, T), the stage's
/// thread count, and the machine (its CPU model and core count, and in fp32 the OpenBLAS kernels).
struct ProfileKey {
  ModelOptions model;
  std::string optimizer = "adamw";
  int B = 0;
  int T = 0;
  int threads = 1;
  std::string precision = "fp32";  ///< pipeline.precision (in the key text only when not fp32)
  std::string cpu;                 ///< cpu_model()
  /// fp32: the OpenBLAS kernels its products ran on (blas_core().name; in the key text only when
  /// set); bf16: empty (no product runs on OpenBLAS)
  std::string blas;
  int cores = 0;  ///< std::thread::hardware_concurrency()

  /// The key as canonical JSON text (what a cache file stores and is compared by).
  std::string text() const;
  /// "layer-profile-<16 hex digits of a hash of text()>.json".
  std::string file_name() const;
};

/// The key of `config`'s profile on this machine: model.*, optimizer.kind,
/// pipeline.microbatch_size, the sequence length (pipeline.seq_len, or model.context),
/// pipeline.threads_per_stage and pipeline.precision.
ProfileKey profile_key(const Config& config);

/// The CPU's "model name" from /proc/cpuinfo, or "unknown".
std::string cpu_model();

/// Where profiles are cached: $ACTORPIPE_CACHE_DIR, else $XDG_CACHE_HOME/actorpipe, else
/// $HOME/.cache/actorpipe; empty when none of these variables is set (nothing is cached).
std::string default_profile_cache_dir();

/// A cache look-up: the profile when a file for the key was there and read back whole.
struct CachedProfile {
  std::optional<LayerProfile> profile;
  std::string path;  ///< the file looked at
  /// Why there is no profile: "no cached profile", or "ignored: <reason>" (another key, a
  /// format it does not know, a malformed file, a wrong layer count, a negative or non-finite
  /// time).
  std::string note;
};

/// Reads the cached profile of `key` for a model of `num_layers` layers from `dir`. Never
/// fails: whatever does not match or read back is ignored, with the reason in the note.
CachedProfile read_cached_profile(const std::string& dir, const ProfileKey& key, int num_layers);

/// Writes `profile` for `key` into `dir` (created when missing), atomically (a temporary file
/// renamed over the old one); returns the file's path. Errors name the file.
Expected<std::string> write_cached_profile(const std::string& dir, const ProfileKey& key,
                                           const LayerProfile& profile);

}  // namespace actorpipe
