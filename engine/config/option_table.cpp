// Option table: one row per config key (section, key, type, allowed values, meaning) with
// accessors into Config; the TOML parser, to_toml, the docs and checkpoint manifests use it.
#include "engine/config/option_table.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace actorpipe::internal {

namespace {

template <class T>
constexpr OptKind kind_of() {
  if constexpr (std::is_same_v<T, int>)
    return OptKind::integer;
  else if constexpr (std::is_same_v<T, uint64_t>)
    return OptKind::uinteger;
  else if constexpr (std::is_same_v<T, float>)
    return OptKind::real32;
  else if constexpr (std::is_same_v<T, double>)
    return OptKind::real64;
  else if constexpr (std::is_same_v<T, bool>)
    return OptKind::boolean;
  else if constexpr (std::is_same_v<T, std::string>)
    return OptKind::string;
  else if constexpr (std::is_same_v<T, std::vector<int>> || std::is_same_v<T, PartitionSpec>)
    return OptKind::int_list;
  else if constexpr (std::is_same_v<T, RecomputeSpec>)
    return OptKind::layer_set;
  else {
    static_assert(std::is_same_v<T, Arch>, "unsupported option type");
    return OptKind::arch;
  }
}

template <class T>
OptValue to_value(const T& v) {
  if constexpr (std::is_same_v<T, int>)
    return int64_t{v};
  else if constexpr (std::is_same_v<T, uint64_t>)
    return static_cast<int64_t>(v);
  else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
    return static_cast<double>(v);
  else if constexpr (std::is_same_v<T, bool>)
    return v;
  else if constexpr (std::is_same_v<T, std::string>)
    return v;
  else if constexpr (std::is_same_v<T, std::vector<int>>)
    return std::vector<int64_t>(v.begin(), v.end());
  else if constexpr (std::is_same_v<T, PartitionSpec>) {
    if (v.automatic) return std::string("auto");
    return std::vector<int64_t>(v.counts.begin(), v.counts.end());
  } else if constexpr (std::is_same_v<T, RecomputeSpec>) {
    switch (v.kind) {
      case RecomputeSpec::Kind::none:
        return std::string("none");
      case RecomputeSpec::Kind::all:
        return std::string("all");
      case RecomputeSpec::Kind::automatic:
        return std::string("auto");
      case RecomputeSpec::Kind::layers:
        break;
    }
    return std::vector<int64_t>(v.layers.begin(), v.layers.end());
  } else
    return std::string(v == Arch::gpt ? "gpt" : "bert");
}

template <class T>
T from_value(const OptValue& v) {
  if constexpr (std::is_same_v<T, int>)
    return static_cast<int>(std::get<int64_t>(v));
  else if constexpr (std::is_same_v<T, uint64_t>)
    return static_cast<uint64_t>(std::get<int64_t>(v));
  else if constexpr (std::is_same_v<T, float>)
    return static_cast<float>(std::get<double>(v));
  else if constexpr (std::is_same_v<T, double>)
    return std::get<double>(v);
  else if constexpr (std::is_same_v<T, bool>)
    return std::get<bool>(v);
  else if constexpr (std::is_same_v<T, std::string>)
    return std::get<std::string>(v);
  else if constexpr (std::is_same_v<T, std::vector<int>>) {
    const auto& xs = std::get<std::vector<int64_t>>(v);
    std::vector<int> out;
    for (int64_t x : xs) out.push_back(static_cast<int>(x));
    return out;
  } else if constexpr (std::is_same_v<T, PartitionSpec>) {
    // the only string a partition holds is "auto" (the parser turns "even" into no counts)
    PartitionSpec p;
    if (std::holds_alternative<std::string>(v)) {
      p.automatic = true;
    } else {
      p.counts = from_value<std::vector<int>>(v);
    }
    return p;
  } else if constexpr (std::is_same_v<T, RecomputeSpec>) {
    // strings are "none", "all" or "auto" (the parser checks); an array lists layers
    RecomputeSpec r;
    if (const auto* word = std::get_if<std::string>(&v)) {
      r.kind = *word == "all"    ? RecomputeSpec::Kind::all
               : *word == "auto" ? RecomputeSpec::Kind::automatic
                                 : RecomputeSpec::Kind::none;
    } else {
      r.kind = RecomputeSpec::Kind::layers;
      r.layers = from_value<std::vector<int>>(v);
    }
    return r;
  } else
    return std::get<std::string>(v) == "bert" ? Arch::bert : Arch::gpt;
}

template <class S, class T>
OptionSpec row(const char* section, const char* key, S Config::*sec, T S::*field,
               const char* allowed, const char* meaning) {
  OptionSpec s;
  s.section = section;
  s.key = key;
  s.kind = kind_of<T>();
  s.allowed = allowed;
  s.meaning = meaning;
  s.get = [sec, field](const Config& c) { return to_value<T>(c.*sec.*field); };
  s.set = [sec, field](Config& c, const OptValue& v) { c.*sec.*field = from_value<T>(v); };
  return s;
}

std::vector<OptionSpec> build_table() {
  using C = Config;
  std::vector<OptionSpec> t;
  // [model]
  t.push_back(row("model", "arch", &C::model, &ModelOptions::arch, "gpt | bert",
                  "Architecture: GPT (causal attention, next-token loss) or BERT (bidirectional "
                  "attention, masked-language-model loss)."));
  t.push_back(row("model", "vocab_size", &C::model, &ModelOptions::vocab_size, ">= 2",
                  "Vocabulary size V: token ids are 0 .. V-1 (BERT reserves V-1 as [MASK])."));
  t.push_back(row("model", "context", &C::model, &ModelOptions::context, ">= 1",
                  "Maximum sequence length: the size of the position-embedding table."));
  t.push_back(row("model", "width", &C::model, &ModelOptions::width, ">= 1, a multiple of heads",
                  "Hidden width C (embedding size); the MLP is 4C wide."));
  t.push_back(row("model", "depth", &C::model, &ModelOptions::depth, ">= 1",
                  "Transformer blocks L; the model has L + 2 layers (embedding, L blocks, head)."));
  t.push_back(row("model", "heads", &C::model, &ModelOptions::heads, ">= 1, divides width",
                  "Attention heads NH; each head has C / NH channels."));
  t.push_back(row("model", "segments", &C::model, &ModelOptions::segments, ">= 1",
                  "BERT segment (token-type) vocabulary; unused for GPT."));
  t.push_back(row("model", "tied", &C::model, &ModelOptions::tied, "true | false",
                  "The output head (GPT LM head, BERT MLM decoder) shares the token-embedding "
                  "matrix."));
  t.push_back(row("model", "init_seed", &C::model, &ModelOptions::init_seed, "0 .. 2^63-1",
                  "Seed of the deterministic parameter initialisation."));
  // [data]
  t.push_back(row("data", "kind", &C::data, &DataOptions::kind, "synthetic | text | tokens",
                  "Source of the training sequences: a synthetic Markov corpus with a known "
                  "entropy rate, a UTF-8 text file (byte-level tokens), or a uint16 token file "
                  "(raw, or with the llm.c header)."));
  t.push_back(row("data", "path", &C::data, &DataOptions::path,
                  "a file path; required for text and tokens",
                  "The text or token file; ignored by the synthetic source."));
  t.push_back(row("data", "seed", &C::data, &DataOptions::seed, "0 .. 2^63-1",
                  "Seed of the order of sequences and of BERT masking."));
  t.push_back(row("data", "holdout", &C::data, &DataOptions::holdout, "[0, 0.5]",
                  "text, tokens: the fraction of the file, at its end, kept out of training for "
                  "held-out evaluation ([eval]); 0 = training reads the whole file. The synthetic "
                  "corpus needs none: its held-out sequences come from a stream of their own."));
  t.push_back(row("data", "synthetic_branching", &C::data, &DataOptions::synthetic_branching,
                  ">= 1 and at most the number of chain states",
                  "Synthetic corpus: successors per state of the random Markov chain."));
  t.push_back(row("data", "synthetic_seed", &C::data, &DataOptions::synthetic_seed, "0 .. 2^63-1",
                  "Synthetic corpus: seed of the chain itself."));
  t.push_back(row("data", "mask_prob", &C::data, &DataOptions::mask_prob, "(0, 1]",
                  "BERT: fraction of positions selected for the masked-LM loss."));
  // [pipeline]
  t.push_back(row("pipeline", "mode", &C::pipeline, &PipelineOptions::mode,
                  "gpipe | 1f1b | 2bw | pipedream | xpipe",
                  "Training mode: synchronous (gpipe, 1f1b) or asynchronous (2bw, pipedream, "
                  "xpipe); docs/modes.md gives each update rule."));
  t.push_back(row("pipeline", "stages", &C::pipeline, &PipelineOptions::stages,
                  ">= 1, at most model.depth + 2", "Pipeline stages d."));
  t.push_back(row("pipeline", "microbatches", &C::pipeline, &PipelineOptions::microbatches,
                  "1 .. 65536; 2bw needs >= stages", "Microbatches m per optimizer step."));
  t.push_back(row("pipeline", "replicas", &C::pipeline, &PipelineOptions::replicas,
                  ">= 0; > 1: dividing microbatches, gpipe, 1f1b or 2bw",
                  "Data-parallel width w: w copies of the pipeline (w·d stages on as many "
                  "processes, or fewer holding several stages); replica r runs microbatches "
                  "r·m/w .. (r+1)·m/w - 1 of every step, and each stage's gradients are summed "
                  "over the replicas in replica order before its update. 0: in a job, the "
                  "planner chooses w and pipeline.stages for its processes (one stage each) and "
                  "the partition; in one process, 1 (docs/replicas.md)."));
  t.push_back(row("pipeline", "microbatch_size", &C::pipeline, &PipelineOptions::microbatch_size,
                  ">= 1", "Sequences B per microbatch."));
  t.push_back(row("pipeline", "seq_len", &C::pipeline, &PipelineOptions::seq_len,
                  "0 .. model.context", "Sequence length T; 0 means model.context."));
  t.push_back(row("pipeline", "partition", &C::pipeline, &PipelineOptions::partition,
                  "\"even\", [], \"auto\" or stages positive integers summing to "
                  "model.depth + 2",
                  "Layers per stage, first stage first; \"even\" (or []) splits the layers as "
                  "evenly as possible; \"auto\" takes the planner's partition for the mode, "
                  "stages and microbatches from a measured (or cached) per-layer profile "
                  "(docs/planner.md)."));
  t.push_back(row("pipeline", "threads_per_stage", &C::pipeline,
                  &PipelineOptions::threads_per_stage, ">= 1", "Compute threads of each stage."));
  t.push_back(row("pipeline", "precision", &C::pipeline, &PipelineOptions::precision,
                  "\"fp32\" | \"bf16\"",
                  "What the matrix products (linear layers, the tied output projection, "
                  "attention's per-head products) compute in. \"bf16\": their operands are "
                  "rounded to bf16 and the products accumulate in f32 (oneDNN); master weights, "
                  "gradients, optimizer state, softmax, layernorm, GELU and the loss stay f32 "
                  "(docs/modes.md, \"Precision\"). Refused on a CPU without bf16 instructions "
                  "(AVX512_BF16 or AMX) unless every stage is on a GPU (pipeline.device = "
                  "\"cuda\": cuBLAS's products)."));
  t.push_back(row("pipeline", "stash_precision", &C::pipeline, &PipelineOptions::stash_precision,
                  "\"fp32\" | \"bf16\"",
                  "What the weight versions a stage keeps besides the newest one (2bw's older "
                  "version, pipedream's stashed ones) hold their linear layers' weights in. "
                  "\"bf16\" (with pipeline.precision = \"bf16\", in 2bw and pipedream, not with "
                  "a dc or secant delay correction): only the bf16 rounding the products "
                  "read, in half the bytes; biases, norms, embeddings and tied weights stay f32. "
                  "Every bit computed is the same as with \"fp32\"; checkpoints hold those "
                  "weights of the older versions as their bf16 values (docs/modes.md, "
                  "\"Precision\")."));
  t.push_back(row("pipeline", "device", &C::pipeline, &PipelineOptions::device,
                  "\"cpu\" | \"cuda\" | \"checked\"",
                  "What the stages compute on, with every weight, gradient, optimizer state and "
                  "stashed activation in its memory. \"cuda\": each stage on a GPU of its own "
                  "(pipeline.device_ids), the CUDA backend (docs/gpu.md); an error where the build "
                  "has no CUDA or no GPU is usable, never a run on the CPU. \"checked\": the CPU "
                  "kernels on memory closed to the host between operations, which stops the "
                  "process at any read or write of a stage's memory that does not go through the "
                  "backend; the CPU's bits, slower (a test of the device path, e.g. of one's own "
                  "layers, without a GPU). Off the CPU: precision = \"bf16\" is the backend's "
                  "own (each product's operands rounded, no weight copies), stash_precision "
                  "fp32 only; layers move between such stages as on the CPU, and --sample runs "
                  "on the first stage's device."));
  t.push_back(row("pipeline", "device_ids", &C::pipeline, &PipelineOptions::device_ids,
                  "[] or pipeline.stages GPU indices >= 0",
                  "With device = \"cuda\": the GPU of each stage, first stage first (as CUDA "
                  "numbers the GPUs this process sees); [] puts stage r on GPU r mod (GPUs "
                  "visible)."));
  t.push_back(row("pipeline", "split_backward", &C::pipeline, &PipelineOptions::split_backward,
                  "true | false",
                  "A stage's backward computes the gradient of its input, hands it to the "
                  "previous stage, then computes its weight gradients (the same results; the "
                  "previous stage starts its backward a weight pass earlier). Costs a copy of "
                  "the stage's linear-layer output gradients for one microbatch; false computes "
                  "both in one pass."));
  t.push_back(row("pipeline", "memory_limit_mb", &C::pipeline, &PipelineOptions::memory_limit_mb,
                  ">= 0",
                  "Memory per stage in MiB (parameters, gradients, optimizer state, extra weight "
                  "versions, in bf16 their copies, stashed activations: the planner's memory "
                  "model) that partition = "
                  "\"auto\" and recompute = \"auto\" must respect; a plan that cannot fit is "
                  "an error naming the stage. 0 = no limit."));
  t.push_back(row("pipeline", "recompute", &C::pipeline, &PipelineOptions::recompute,
                  "\"none\", \"all\", \"auto\" or an array of distinct global layer indices "
                  "0 .. model.depth + 1",
                  "Layers whose activations are recomputed: the forward stashes only the layer's "
                  "input and the backward runs the layer's forward again first (the same bits, "
                  "less stash memory, one more forward per microbatch). \"auto\" takes the "
                  "planner's choice under memory_limit_mb for the partition in use (none without "
                  "a limit); docs/planner.md."));
  // [optimizer]
  t.push_back(row("optimizer", "kind", &C::optimizer, &OptimizerOptions::kind, "adamw | sgd",
                  "AdamW (decoupled weight decay) or SGD with momentum."));
  t.push_back(
      row("optimizer", "lr", &C::optimizer, &OptimizerOptions::lr, "> 0", "Peak learning rate."));
  t.push_back(row("optimizer", "beta1", &C::optimizer, &OptimizerOptions::beta1, "[0, 1)",
                  "AdamW: decay of the first-moment estimate."));
  t.push_back(row("optimizer", "beta2", &C::optimizer, &OptimizerOptions::beta2, "[0, 1)",
                  "AdamW: decay of the second-moment estimate."));
  t.push_back(row("optimizer", "eps", &C::optimizer, &OptimizerOptions::eps, "> 0",
                  "AdamW: added to the root of the second moment."));
  t.push_back(row("optimizer", "weight_decay", &C::optimizer, &OptimizerOptions::weight_decay,
                  ">= 0",
                  "Weight decay: decoupled (times lr) for AdamW, added to the gradient for "
                  "SGD."));
  t.push_back(row("optimizer", "momentum", &C::optimizer, &OptimizerOptions::momentum, "[0, 1)",
                  "SGD: momentum coefficient."));
  t.push_back(row("optimizer", "grad_clip", &C::optimizer, &OptimizerOptions::grad_clip, ">= 0",
                  "Clip the global gradient norm to this value; 0 turns clipping off."));
  t.push_back(row("optimizer", "warmup_steps", &C::optimizer, &OptimizerOptions::warmup_steps,
                  ">= 0", "Linear warm-up of the learning rate from 0 over this many steps."));
  t.push_back(row("optimizer", "decay_steps", &C::optimizer, &OptimizerOptions::decay_steps,
                  "0, or > warmup_steps",
                  "Cosine decay of the learning rate after the warm-up: from lr at step "
                  "warmup_steps to min_lr at this step, min_lr after it (steps are optimizer "
                  "updates: microbatches in pipedream); 0 keeps lr constant."));
  t.push_back(row("optimizer", "min_lr", &C::optimizer, &OptimizerOptions::min_lr, "[0, lr]",
                  "Learning rate at the end of the cosine decay (decay_steps > 0)."));
  t.push_back(row("optimizer", "delay_correction", &C::optimizer,
                  &OptimizerOptions::delay_correction,
                  "none | nesterov | dc | secant | dc+nesterov | secant+nesterov",
                  "Correction of an update whose gradient was computed at stale weights: nesterov "
                  "(a Nesterov look-ahead: NAdam, or Nesterov momentum for SGD; 2bw, pipedream, "
                  "xpipe), dc (delay compensation: the gradient plus a diagonal Hessian estimate "
                  "from the gradient's square times the weights' change since; 2bw, pipedream), "
                  "secant (the same with the Hessian's diagonal estimated from the changes of "
                  "consecutive gradients and their weights; 2bw, pipedream), or a compensation "
                  "with the look-ahead (dc+nesterov, secant+nesterov); none in gpipe and 1f1b. "
                  "With pipeline.device = \"cuda\" only none, nesterov and dc. docs/modes.md, "
                  "\"Delay corrections\"."));
  t.push_back(row("optimizer", "dc_lambda", &C::optimizer, &OptimizerOptions::dc_lambda, ">= 0",
                  "delay_correction = dc: the weight of the compensation term."));
  t.push_back(row("optimizer", "secant_decay", &C::optimizer, &OptimizerOptions::secant_decay,
                  "[0, 1)",
                  "delay_correction = secant: the decay of the running means of dg*dx and dx^2 "
                  "whose ratio estimates the Hessian's diagonal (0.95 weighs about the last 20 "
                  "updates)."));
  t.push_back(row("optimizer", "momentum_decay", &C::optimizer, &OptimizerOptions::momentum_decay,
                  ">= 0",
                  "delay_correction with the look-ahead (nesterov, dc+nesterov, secant+nesterov) "
                  "and adamw: psi of NAdam's momentum schedule "
                  "mu_t = beta1 (1 - 0.5 * 0.96^(t psi)) (torch.optim.NAdam's momentum_decay, "
                  "0.004 there); 0 keeps mu_t = beta1."));
  t.push_back(row("optimizer", "basis_rotation", &C::optimizer, &OptimizerOptions::basis_rotation,
                  "true | false",
                  "adamw: keep each matrix parameter's second moment in the eigenbasis of its "
                  "gradients' covariances (G G^T and G^T G) instead of the coordinates, which "
                  "keeps a late gradient's update useful in 2bw, pipedream and xpipe; applies in "
                  "every mode, with delay_correction none or nesterov, on pipeline.device = "
                  "\"cpu\". docs/modes.md, \"Basis rotation\"."));
  t.push_back(row("optimizer", "rotation_every", &C::optimizer, &OptimizerOptions::rotation_every,
                  ">= 1",
                  "basis_rotation: recompute the eigenvectors every this many updates (at updates "
                  "1, 1 + n, 1 + 2n, ...)."));
  t.push_back(row("optimizer", "rotation_max_dim", &C::optimizer,
                  &OptimizerOptions::rotation_max_dim, ">= 1",
                  "basis_rotation: a side of a matrix (its rows or its columns) rotates when its "
                  "dimension is at most this; the other side stays in the coordinates. Its two "
                  "matrices cost dim^2 floats each and an eigendecomposition of O(dim^3) per "
                  "refresh."));
  t.push_back(row("optimizer", "rotation_block", &C::optimizer, &OptimizerOptions::rotation_block,
                  ">= 0",
                  "basis_rotation: 0 rotates each side whole; b > 0 splits a side longer than b "
                  "into diagonal blocks of b (the last one the rest), each with its own "
                  "covariance and eigenvectors: the diagonal blocks of the whole side's. A side "
                  "of dim then costs about dim*b floats per matrix and dim*b per column of the "
                  "other side in each product, instead of dim^2."));
  // [train]
  t.push_back(row("train", "steps", &C::train, &TrainOptions::steps, ">= 1",
                  "Optimizer steps to run (in total, counting those before a resume)."));
  t.push_back(row("train", "seed", &C::train, &TrainOptions::seed, "0 .. 2^63-1",
                  "Seed of the run's own random generator (saved in checkpoints)."));
  t.push_back(row("train", "log_every", &C::train, &TrainOptions::log_every, ">= 0",
                  "Print progress every this many steps; 0 = never."));
  t.push_back(row("train", "metrics", &C::train, &TrainOptions::metrics, "a file path, or empty",
                  "JSON-lines metrics file; empty = none. A resumed run keeps its lines up to the "
                  "checkpoint's step, drops the rest and writes a \"resumed\" line."));
  t.push_back(row("train", "trace", &C::train, &TrainOptions::trace, "a file path, or empty",
                  "Chrome/Perfetto trace file; empty = none."));
  t.push_back(row("train", "max_restarts", &C::train, &TrainOptions::max_restarts,
                  "0 .. 1000; > 0 needs checkpoint.dir",
                  "After a failed run (an exception in a stage or shard, a non-finite loss, a "
                  "stall, a checkpoint that could not be written) restart from the latest complete "
                  "checkpoint in checkpoint.dir (or from the start) up to this many times, in the "
                  "same process; each restart is a \"restart\" line of train.metrics. A "
                  "failure that repeats the one before the last restart (the same error but for "
                  "its numbers, no step further) is not restarted again. 0 = a failure ends the "
                  "training. One process only: a job of several is restarted by actorpipe-launch "
                  "--max-restarts."));
  t.push_back(row("train", "nonfinite", &C::train, &TrainOptions::nonfinite,
                  "stop | skip; skip needs pipeline.mode gpipe or 1f1b",
                  "A non-finite loss or gradient: stop fails the run naming the step, stage and "
                  "layer (microbatch for a loss); skip drops that step's update on every stage "
                  "(weights and optimizer state stay as they were), counts it and trains on."));
  t.push_back(row("train", "stop", &C::train, &TrainOptions::stop, "step | run",
                  "Where SIGINT, SIGTERM or Trainer::request_stop ends the training. step: after "
                  "the step in flight in every mode; pipedream and xpipe drain their pipeline "
                  "there, so the resumed training equals one whose pipeline run ended at that "
                  "step, not the uninterrupted one. run: gpipe, 1f1b and 2bw the same; pipedream "
                  "and xpipe at the end of their pipeline run (the next multiple of "
                  "checkpoint.every, else train.steps), so the resumed training equals the "
                  "uninterrupted one bit for bit (docs/failures.md)."));
  t.push_back(row("train", "restart_backoff", &C::train, &TrainOptions::restart_backoff,
                  "[0, 3600] seconds",
                  "Wait before the first restart; doubled for each further one, at most 60 s."));
  // [checkpoint]
  t.push_back(row("checkpoint", "dir", &C::checkpoint, &CheckpointOptions::dir,
                  "a directory path, or empty",
                  "Where checkpoints go (<dir>/step-<N>/ and <dir>/final/); empty = none."));
  t.push_back(row("checkpoint", "every", &C::checkpoint, &CheckpointOptions::every,
                  ">= 0; > 0 needs checkpoint.dir",
                  "Steps between periodic checkpoints; 0 = only the final one."));
  t.push_back(row("checkpoint", "resume", &C::checkpoint, &CheckpointOptions::resume,
                  "a checkpoint path, or empty",
                  "Continue from <dir>/step-<N>, <dir>/final, or <dir> (its latest complete "
                  "checkpoint); empty = fresh start."));
  t.push_back(row("checkpoint", "overwrite", &C::checkpoint, &CheckpointOptions::overwrite,
                  "true | false",
                  "A run that does not resume from checkpoint.dir refuses to start when the "
                  "directory holds checkpoints (another run's); true removes them first."));
  // [cluster]
  t.push_back(row("cluster", "placement", &C::cluster, &ClusterOptions::placement,
                  "[] or pipeline.stages ranks in [0, world), each rank holding >= 1 stage",
                  "Rank of the process that runs each stage, first stage first; [] places "
                  "contiguous blocks of stages on the ranks in order (one stage per process "
                  "when there are as many processes as stages). Ignored in a single process."));
  t.push_back(row("cluster", "bind", &C::cluster, &ClusterOptions::bind,
                  "an IPv4 address or host name",
                  "Address rank 0's coordinator listens on; 127.0.0.1 accepts ranks of this "
                  "host only, 0.0.0.0 every interface (ranks on other hosts)."));
  t.push_back(row("cluster", "connect_timeout", &C::cluster, &ClusterOptions::connect_timeout,
                  "> 0", "Seconds a rank keeps trying to reach the coordinator before it fails."));
  t.push_back(row("cluster", "peer_timeout", &C::cluster, &ClusterOptions::peer_timeout, "> 0",
                  "Seconds within which every process stops after a peer process is lost "
                  "(killed, crashed, unreachable)."));
  t.push_back(row("cluster", "tls_certificate", &C::cluster, &ClusterOptions::tls_certificate,
                  "a PEM file, or empty; set together with tls_key and tls_ca",
                  "TLS for the control connections between processes (CAF's OpenSSL module): "
                  "this process's certificate. Every process must present a certificate the CA "
                  "in tls_ca signed; empty = plain TCP (one host or a trusted network)."));
  t.push_back(row("cluster", "tls_key", &C::cluster, &ClusterOptions::tls_key,
                  "a PEM file, or empty", "The private key of tls_certificate (unencrypted)."));
  t.push_back(row("cluster", "tls_ca", &C::cluster, &ClusterOptions::tls_ca, "a PEM file, or empty",
                  "The CA certificate(s) peers' certificates must chain to."));
  t.push_back(row("cluster", "gpu_channel", &C::cluster, &ClusterOptions::gpu_channel,
                  "\"nccl\" | \"ucx\"",
                  "How activations and gradients go between two stages on GPUs in different "
                  "processes (pipeline.device = \"cuda\"): \"nccl\" GPU memory to GPU memory by "
                  "NCCL send/recv, one communicator per channel (an error where the build has "
                  "no NCCL); \"ucx\" through host memory on both sides (host-staged UCX). Tied "
                  "parameters' traffic and every channel of other devices use UCX either way."));
  t.push_back(row("cluster", "shared_memory", &C::cluster, &ClusterOptions::shared_memory,
                  "true | false",
                  "Activations and gradients between two processes on one host: true lends them "
                  "in memory both processes map (UCX shared memory; the receiver reads the "
                  "sender's tensor in place, nothing is copied); false copies them through UCX "
                  "as between hosts. Processes that cannot share memory (other hosts, UCX_TLS "
                  "without shared memory) copy either way."));
  // [migration]
  t.push_back(row("migration", "enabled", &C::migration, &MigrationOptions::enabled, "",
                  "The automatic migration manager: every check_every steps it compares the "
                  "stages' busy time and moves layers to even them out (docs/migration.md). "
                  "In a job of several processes the driver's rank decides for all; not with "
                  "pipeline.replicas > 1."));
  t.push_back(row("migration", "moves", &C::migration, &MigrationOptions::moves,
                  "\"\" or \"<step>: <layers per stage>; ...\" with increasing steps",
                  "Forced moves: after <step> optimizer steps the stages hold these layer "
                  "counts, e.g. \"10: 3, 5; 20: 4, 4\" (the same path as the manager's moves)."));
  t.push_back(row("migration", "check_every", &C::migration, &MigrationOptions::check_every, ">= 1",
                  "Optimizer steps between the manager's checks. A check runs while the "
                  "pipeline does; only one that decides to move ends the run after the step in "
                  "flight (docs/migration.md)."));
  t.push_back(row("migration", "threshold", &C::migration, &MigrationOptions::threshold, "> 0",
                  "A check counts as imbalanced when the busiest stage's busy time exceeds the "
                  "stages' mean by more than this fraction."));
  t.push_back(row("migration", "patience", &C::migration, &MigrationOptions::patience, ">= 1",
                  "Consecutive imbalanced checks before the manager asks the planner for a new "
                  "partition."));
  t.push_back(row("migration", "min_gain", &C::migration, &MigrationOptions::min_gain, ">= 0, < 1",
                  "A move happens only when the planner predicts a step at least this fraction "
                  "faster, and the time saved over check_every steps exceeds the move's cost."));
  // [eval]
  t.push_back(row("eval", "every", &C::eval, &EvalOptions::every, ">= 0",
                  "Evaluate on held-out data every this many steps of train() (a pipeline run "
                  "ends there, as at checkpoint.every) and after the last step; 0 = never "
                  "(Trainer::evaluate() still works)."));
  t.push_back(row("eval", "microbatches", &C::eval, &EvalOptions::microbatches, "1 .. 65536",
                  "Held-out microbatches per evaluation: the first ones of the held-out data, "
                  "the same each time, so evaluations compare."));
  t.push_back(row("eval", "path", &C::eval, &EvalOptions::path,
                  "a file path of data.kind's format, or empty",
                  "Held-out data in a file of its own (text or tokens, as data.kind); empty = "
                  "the held-out part of [data] (data.holdout for a file; the synthetic corpus's "
                  "held-out stream)."));
  return t;
}

}  // namespace

const std::vector<OptionSpec>& option_table() {
  static const std::vector<OptionSpec> table = build_table();
  return table;
}

const std::vector<std::string>& option_sections() {
  static const std::vector<std::string> sections = {"model",     "data",      "pipeline",
                                                    "optimizer", "train",     "checkpoint",
                                                    "cluster",   "migration", "eval"};
  return sections;
}

const OptionSpec* find_option(std::string_view section, std::string_view key) {
  for (const auto& s : option_table()) {
    if (s.section == section && s.key == key) return &s;
  }
  return nullptr;
}

std::string_view kind_name(OptKind kind) {
  switch (kind) {
    case OptKind::integer:
      return "integer";
    case OptKind::uinteger:
      return "integer";
    case OptKind::real32:
      return "float";
    case OptKind::real64:
      return "float";
    case OptKind::boolean:
      return "boolean";
    case OptKind::string:
      return "string";
    case OptKind::int_list:
      return "array of integers";
    case OptKind::layer_set:
      return "string or array of integers";
    case OptKind::arch:
      return "string";
  }
  return "?";
}

namespace {

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (ch < 0x20 || ch == 0x7F) {
          out += fmt::format("\\u{:04X}", static_cast<unsigned>(ch));
        } else {
          out += static_cast<char>(ch);
        }
    }
  }
  return out + "\"";
}

std::string toml_real(double x, bool single) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  std::string s = single ? fmt::format("{}", static_cast<float>(x)) : fmt::format("{}", x);
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

std::string to_toml_text(OptKind kind, const OptValue& value, std::string_view name) {
  switch (kind) {
    case OptKind::integer:
    case OptKind::uinteger:
      return fmt::format("{}", std::get<int64_t>(value));
    case OptKind::real32:
      return toml_real(std::get<double>(value), true);
    case OptKind::real64:
      return toml_real(std::get<double>(value), false);
    case OptKind::boolean:
      return std::get<bool>(value) ? "true" : "false";
    case OptKind::string:
    case OptKind::arch:
      return toml_string(std::get<std::string>(value));
    case OptKind::int_list: {
      // pipeline.partition: "auto", "even" or its counts; the other lists: [] or their values
      if (const auto* s = std::get_if<std::string>(&value)) return toml_string(*s);
      const auto& xs = std::get<std::vector<int64_t>>(value);
      if (xs.empty()) return name == "pipeline.partition" ? "\"even\"" : "[]";
      return fmt::format("[{}]", fmt::join(xs, ", "));
    }
    case OptKind::layer_set: {
      if (const auto* s = std::get_if<std::string>(&value)) return toml_string(*s);
      return fmt::format("[{}]", fmt::join(std::get<std::vector<int64_t>>(value), ", "));
    }
  }
  return "";
}

std::string closest(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = std::string::npos;
  for (const auto& c : candidates) {
    // Levenshtein distance, one row at a time.
    std::vector<std::size_t> prev(c.size() + 1), cur(c.size() + 1);
    for (std::size_t j = 0; j <= c.size(); ++j) prev[j] = j;
    for (std::size_t i = 1; i <= word.size(); ++i) {
      cur[0] = i;
      for (std::size_t j = 1; j <= c.size(); ++j) {
        std::size_t sub = prev[j - 1] + (word[i - 1] == c[j - 1] ? 0 : 1);
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
      }
      std::swap(prev, cur);
    }
    if (prev[c.size()] < best_d) {
      best_d = prev[c.size()];
      best = c;
    }
  }
  // Close enough to be a typo: at most a third of the longer word, and at least 1 edit allowed.
  const std::size_t limit = std::max<std::size_t>(2, std::max(word.size(), best.size()) / 3);
  return best_d <= limit ? best : std::string();
}

}  // namespace actorpipe::internal
