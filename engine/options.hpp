// Options: the plain structs behind every section of the TOML config, with their defaults.
// engine/config/config.hpp parses a file into them; models, data and trainers take them directly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace actorpipe {

enum class Arch : uint8_t { gpt, bert };

/// [model]
struct ModelOptions {
  Arch arch = Arch::gpt;
  int vocab_size = 256;    // V
  int context = 128;       // maxT: position table size (sequence length T <= context)
  int width = 128;         // C
  int depth = 4;           // L transformer blocks
  int heads = 4;           // NH, divides width
  int segments = 2;        // BERT segment (token type) vocabulary; unused for GPT
  bool tied = true;        // LM head shares the token embedding
  uint64_t init_seed = 1;  // deterministic initialisation
};

/// [data]
struct DataOptions {
  std::string kind = "synthetic";  // synthetic | text | tokens
  std::string path;                // text: UTF-8 file; tokens: uint16 file (raw or llm.c header)
  uint64_t seed = 1234;            // order of sequences and BERT masking
  // synthetic corpus: a random sparse Markov chain over the vocabulary
  int synthetic_branching = 4;   // successors per state
  uint64_t synthetic_seed = 42;  // the chain itself
  double mask_prob = 0.15;       // BERT: fraction of positions selected
  double holdout = 0.0;          // text, tokens: the fraction at the file's end kept for [eval]
};

/// [optimizer]
struct OptimizerOptions {
  std::string kind = "adamw";  // adamw | sgd
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float momentum = 0.9f;   // sgd
  float grad_clip = 1.0f;  // global-norm clip; 0 = off
  int warmup_steps = 0;    // linear warm-up of lr from 0
  int decay_steps = 0;     // cosine decay of lr after warm-up, reaching min_lr here; 0 = none
  float min_lr = 0.0f;     // lr from decay_steps on (with decay_steps > 0)
  // correction of the update for a gradient computed at stale weights (2bw, pipedream, xpipe):
  // none | nesterov | dc | secant | dc+nesterov | secant+nesterov (engine/delay_correction.hpp;
  // docs/modes.md, "Delay corrections")
  std::string delay_correction = "none";
  float dc_lambda = 3000.0f;   // dc: λ, the weight of the delay-compensation term
  float secant_decay = 0.95f;  // secant: decay of the running means of its Hessian estimate
  // nesterov with adamw: ψ of NAdam's momentum schedule μ_t = β1(1 − 0.5·0.96^(t·ψ)) (torch's
  // momentum_decay, 0.004 there); 0 keeps μ_t = β1
  float momentum_decay = 0.0f;
  // adamw: keep each matrix's second moment in the eigenbasis of its gradients' covariances
  // (docs/modes.md, "Basis rotation"), refreshed every rotation_every updates, for the sides of
  // at most rotation_max_dim, each side in diagonal blocks of rotation_block (0: whole)
  bool basis_rotation = false;
  int rotation_every = 10;
  int rotation_max_dim = 1024;
  int rotation_block = 0;
};

/// pipeline.partition: how the model's layers are cut into stages — "even", explicit layer
/// counts, or "auto" (the planner chooses from a measured profile: engine/profiler/, resolved to
/// counts before any stage is built).
struct PartitionSpec {
  bool automatic = false;   // "auto"
  std::vector<int> counts;  // layers per stage; empty (and not automatic) = "even"

  bool even() const { return !automatic && counts.empty(); }
  friend bool operator==(const PartitionSpec&, const PartitionSpec&) = default;
};

/// pipeline.recompute: which layers' backward runs their forward again instead of stashing its
/// activations (only the layer's input is kept) — none, all, "auto" (the planner's choice under
/// pipeline.memory_limit_mb, resolved to layers before any stage is built) or a list of global
/// layer indices.
struct RecomputeSpec {
  enum class Kind : uint8_t { none, all, automatic, layers };
  Kind kind = Kind::none;
  std::vector<int> layers;  // Kind::layers: global layer indices, as given

  friend bool operator==(const RecomputeSpec&, const RecomputeSpec&) = default;
};

/// [pipeline]
struct PipelineOptions {
  std::string mode = "1f1b";  // gpipe | 1f1b | 2bw | pipedream | xpipe
  int stages = 1;             // d
  int microbatches = 4;       // m per optimizer step
  int microbatch_size = 8;    // B sequences per microbatch
  int seq_len = 0;            // T; 0 = model.context
  PartitionSpec partition;    // "even", layer counts per stage, or "auto"
  int threads_per_stage = 1;
  /// What matrix products compute in: "fp32", or "bf16" (bf16 operands, f32 accumulation;
  /// weights, gradients and optimizer state stay f32). kernels/precision.hpp.
  std::string precision = "fp32";
  /// What the weight versions a stage keeps besides the newest (2bw's older one, pipedream's
  /// stashed ones) store their linear layers' weights in: "fp32", or "bf16" (with precision
  /// "bf16": the products' operands exactly, in half the bytes; the same bits).
  std::string stash_precision = "fp32";
  bool split_backward = true;  // a B hands its input gradient on before its weight gradients
  int memory_limit_mb = 0;     // per stage, for partition / recompute = "auto"; 0 = no limit
  RecomputeSpec recompute;     // "none", "all", "auto" or global layer indices
  int replicas = 1;  // w: data-parallel copies of the pipeline; each runs microbatches / w
  /// What the stages compute on: "cpu", "cuda" (a GPU per stage), or "checked" (the CPU
  /// kernels on memory closed to the host between ops: engine/devices/stage_devices.hpp).
  std::string device = "cpu";
  /// With device "cuda": the GPU of each stage; empty = stage r on GPU r mod (GPUs visible).
  std::vector<int> device_ids;
};

/// [train]
struct TrainOptions {
  int steps = 100;
  uint64_t seed = 1;
  int log_every = 1;
  std::string metrics;             // JSON-lines path; empty = none
  std::string trace;               // Chrome/Perfetto trace path; empty = none
  int max_restarts = 0;            // restarts from the latest checkpoint after a failure
  double restart_backoff = 1.0;    // seconds before the first restart; doubles, at most 60
  std::string nonfinite = "stop";  // stop | skip: a non-finite loss or gradient
  std::string stop = "step";       // step | run: where pipedream and xpipe end on a stop request
};

/// [checkpoint]
struct CheckpointOptions {
  std::string dir;         // empty = no checkpoints
  int every = 0;           // steps between periodic checkpoints; 0 = only the final one
  std::string resume;      // checkpoint directory to continue from; empty = fresh start
  bool overwrite = false;  // a fresh run may remove checkpoints of another run found in dir
};

/// [cluster]: how a run's stages are placed on the processes of a multi-process job (rank,
/// world size, coordinator address and secret come from the launcher: docs/cluster.md).
struct ClusterOptions {
  std::vector<int> placement;        // rank of each stage; empty = contiguous blocks per rank
  std::string bind = "127.0.0.1";    // address rank 0's coordinator listens on
  double connect_timeout = 60.0;     // seconds a rank tries to reach the coordinator and its peers
  double peer_timeout = 10.0;        // seconds until a lost peer stops every other process
  std::string tls_certificate;       // PEM certificate of this process; empty = no TLS
  std::string tls_key;               // PEM private key of that certificate
  std::string tls_ca;                // PEM CA certificates a peer's certificate must chain to
  std::string gpu_channel = "nccl";  // between GPU stages of two processes: "nccl" | "ucx"
  bool shared_memory = true;         // tensors between processes of one host: lent in shared memory
};

/// [migration]: moving layers between neighbouring stages while a run trains (docs/migration.md).
struct MigrationOptions {
  bool enabled = false;     // the automatic migration manager
  std::string moves;        // forced moves "<step>: <counts>; ..." (parse_forced_moves); "" = none
  int check_every = 10;     // optimizer steps between the manager's checks
  double threshold = 0.15;  // imbalance (slowest stage's busy time / mean - 1) that counts
  int patience = 2;         // consecutive checks above threshold before a move is considered
  double min_gain = 0.05;   // the planner's predicted step time must drop by this fraction
};

/// [eval]: held-out evaluation, a forward-only pass through the pipeline.
struct EvalOptions {
  int every = 0;         // steps between evaluations during train(); 0 = none
  int microbatches = 8;  // held-out microbatches per evaluation (the same ones each time)
  std::string path;      // a held-out file of data.kind's format; empty = data's held-out part
};

struct Config {
  ModelOptions model;
  DataOptions data;
  OptimizerOptions optimizer;
  PipelineOptions pipeline;
  TrainOptions train;
  CheckpointOptions checkpoint;
  ClusterOptions cluster;
  MigrationOptions migration;
  EvalOptions eval;
};

}  // namespace actorpipe
