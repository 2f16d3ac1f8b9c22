// Checkpoint: a directory <dir>/step-<N>/ (or <dir>/final/) of three safetensors files and a
// checksummed JSON manifest, written under a temporary name and renamed into place whole.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/checkpoint/safetensors.hpp"
#include "engine/expected.hpp"
#include "engine/options.hpp"

namespace actorpipe {

/// The manifest format this build writes and reads.
inline constexpr int kCheckpointFormatVersion = 1;

/// Everything a checkpoint records besides its tensors (manifest.json).
struct CheckpointInfo {
  int format_version = kCheckpointFormatVersion;
  bool final = false;               // written to <dir>/final rather than <dir>/step-<N>
  int64_t step = 0;                 // optimizer steps completed
  uint64_t data_position = 0;       // DataLoader::position() to seek to when resuming
  std::vector<uint64_t> rng_state;  // the run's generator state (opaque words)
  std::string mode;                 // pipeline.mode of the run that wrote it
  int stages = 1;                   // pipeline.stages of that run (a resume may use another)
  std::vector<int> partition;       // layers per stage of that run; empty = even
  ModelOptions model;
  OptimizerOptions optimizer;
  std::map<std::string, std::string> extra;  // free-form fields, e.g. {"loss", "2.31"}
};

/// A loaded checkpoint. Tensor names are layer-granular, independent of the stage that held them.
struct CheckpointContents {
  CheckpointInfo info;
  std::vector<NamedTensor> model;      // parameters: "layers.3.attn.qkv.weight"
  std::vector<NamedTensor> optimizer;  // optimizer state: "layers.3.attn.qkv.weight.adam_m"
  std::vector<NamedTensor> versions;   // extra live weight versions: "layers.3.attn.qkv.weight@v7"
  std::string path;                    // the directory it was loaded from (set by load)
  /// Loaded from a directory of checkpoints: why each newer one did not load, newest first,
  /// each naming its file (set by load).
  std::vector<std::string> skipped;
};

/// Tensors to save, as views of caller-owned host memory (no copy is made), or of `held`.
struct CheckpointRefs {
  std::vector<TensorRef> model;
  std::vector<TensorRef> optimizer;
  std::vector<TensorRef> versions;
  /// f32 values that exist nowhere else on the host, which refs point into
  /// (pipeline_checkpoint_refs: a stashed version's weights kept in bf16, widened; the tensors
  /// of a stage off the host, copied out); shared by copies of the refs.
  std::shared_ptr<std::vector<std::vector<float>>> held;
};

/// The file names inside a checkpoint directory.
inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kVersionsFile = "versions.safetensors";
inline constexpr const char* kManifestFile = "manifest.json";

/// "step-<N>" or "final".
std::string checkpoint_name(const CheckpointInfo& info);

/// Writes <dir>/<checkpoint_name(info)>/ and returns its path. Creates `dir` if needed. The three
/// safetensors files and then manifest.json (with the size and CRC-32 of each file) go into a
/// temporary sibling directory, each fsynced; the directory is then renamed into place (an
/// existing checkpoint of the same name is swapped out atomically and removed) and `dir` is
/// fsynced. A crash leaves either no checkpoint of that name, the old one, or the complete new
/// one, plus at most an ignored "<name>.tmp-*" directory. Older checkpoints are kept.
Expected<std::string> save_checkpoint(const std::string& dir, const CheckpointInfo& info,
                                      const CheckpointRefs& tensors);

/// As above, from loaded tensors (e.g. to re-save a checkpoint).
Expected<std::string> save_checkpoint(const std::string& dir, const CheckpointContents& contents);

/// What the processes of a job say to each other while they write one checkpoint: each
/// contributes a text and gets every process's, by rank (an all-gather over the job).
using GatherTexts = std::function<Expected<std::vector<std::string>>(std::string mine)>;

/// The tensors of one stage, as pipeline_checkpoint_refs gives them for that stage alone.
struct StageRefs {
  int stage = 0;
  CheckpointRefs refs;
};

/// save_checkpoint for a pipeline whose stages live in several processes: every process calls it
/// with the same `dir` and `info`, its `rank` and its own stages' tensors; the files are those
/// save_checkpoint writes for every stage's tensors in stage order, byte for byte. Each process
/// writes its own tensors into them at their offsets (the header is computed alike by all from
/// everyone's names and shapes); rank 0 creates the temporary directory, then, after every
/// process has written and fsynced its part, writes manifest.json last and renames the directory
/// into place. `dir` must be one directory for all processes (one host, or a shared file system).
/// Every process gets the checkpoint's path, or the first error of any process (naming its
/// rank); a failed checkpoint leaves no directory of that name.
Expected<std::string> save_checkpoint_shared(const std::string& dir, const CheckpointInfo& info,
                                             const std::vector<StageRefs>& mine, int rank,
                                             const GatherTexts& gather);

/// The bytes of every tensor in `refs` (what the safetensors files hold besides their headers).
uint64_t tensor_bytes(const CheckpointRefs& refs);

/// Views of loaded tensors, for save_checkpoint.
std::vector<TensorRef> tensor_refs(const std::vector<NamedTensor>& tensors);

/// The checkpoints in `dir` ("final" and "step-<N>" directories, complete or not), by name;
/// temporaries and other entries are not listed.
std::vector<std::string> checkpoints_in(const std::string& dir);

/// Finds the checkpoint `path` names: a checkpoint directory (it has a manifest.json), or a
/// directory of checkpoints, meaning the complete one with the highest step in it ("final" wins
/// a tie). Temporaries and incomplete checkpoints (no or unreadable manifest, a file missing or
/// of the wrong size) are skipped; the error lists what was skipped and why.
Expected<std::string> resolve_checkpoint(const std::string& path);

/// Reads and checks only manifest.json of a checkpoint directory (no file checksums).
Expected<CheckpointInfo> read_checkpoint_info(const std::string& checkpoint_dir);

/// As read_checkpoint_info, with the text of a manifest.json given directly (every field and
/// file record checked alike); errors name it `name`.
Expected<CheckpointInfo> checkpoint_info_from_string(std::string_view manifest,
                                                     const std::string& name = "<string>");

/// Loads a checkpoint, verifying the manifest (format and version), that every file it lists
/// exists with its recorded size and CRC-32, and every safetensors file. `path` names one
/// checkpoint (a directory with a manifest, or named final or step-<N>): it loads or the error
/// names the file and what does not match. Or `path` is a directory of checkpoints: the newest
/// that loads whole is taken (by step; final first at a tie), and every newer one that did not
/// (damaged, incomplete, a checksum that does not match) is listed in `skipped` with the reason;
/// none loading is an error listing each.
Expected<CheckpointContents> load_checkpoint(const std::string& path);

/// Refuses a checkpoint whose model differs from `model` in a key that changes the parameters
/// (arch, vocab_size, context, width, depth, heads, segments, tied); the error names each such
/// key with the checkpoint's value and the config's value. init_seed may differ.
Status check_compatible(const CheckpointInfo& info, const ModelOptions& model);

}  // namespace actorpipe
