// The tiny model of the pipeline tests (4 layers: up to 4 stages), small enough to run every mode
// at every stage count in seconds: its options, a built model, its synthetic data and its config.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/data/loader.hpp"
#include "engine/model/model.hpp"
#include "engine/options.hpp"

namespace actorpipe::testing {

/// Sequences per microbatch (B) and tokens per sequence (T) of every tiny run.
inline constexpr int kB = 2, kT = 6;

/// V=24, maxT=8, C=8, 2 blocks (4 layers), 2 heads, 2 segments; the LM head tied or not.
inline ModelOptions tiny_model(Arch arch, bool tied, uint64_t init_seed) {
  ModelOptions o;
  o.arch = arch;
  o.vocab_size = 24;
  o.context = 8;
  o.width = 8;
  o.depth = 2;  // 4 layers: up to 4 stages
  o.heads = 2;
  o.segments = 2;
  o.tied = tied;
  o.init_seed = init_seed;
  return o;
}

/// The model of `o`; the test stops with the reason if it cannot be built.
inline Model build_model(const ModelOptions& o) {
  auto m = Model::build(o);
  REQUIRE_MESSAGE(m.ok(), (m.ok() ? "" : m.error().message));
  return std::move(m).value();
}

/// AdamW, lr 2e-2, weight decay 0.1, gradients clipped at 0.5: the tiny models' gradient norms
/// are around 1-3, so every step clips.
inline OptimizerOptions clipped_adamw() {
  OptimizerOptions o;
  o.kind = "adamw";
  o.lr = 2e-2f;
  o.weight_decay = 0.1f;
  o.grad_clip = 0.5f;
  return o;
}

/// SGD with momentum 0.9, lr 5e-2, weight decay 0.01, two warm-up steps, gradients clipped at
/// 0.2: every step of the tiny models clips.
inline OptimizerOptions clipped_sgd() {
  OptimizerOptions o;
  o.kind = "sgd";
  o.lr = 5e-2f;
  o.momentum = 0.9f;
  o.weight_decay = 0.01f;
  o.grad_clip = 0.2f;
  o.warmup_steps = 2;
  return o;
}

/// The first `n` kB × kT microbatches of the synthetic corpus over `V` tokens, in the order of
/// data seed `seed`.
inline std::vector<Microbatch> tiny_batches(Arch arch, int V, int64_t n, uint64_t seed) {
  DataOptions d;
  d.seed = seed;
  auto loader = DataLoader::open(d, arch, V, kB, kT);
  REQUIRE(loader.ok());
  std::vector<Microbatch> out;
  for (int64_t i = 0; i < n; ++i) out.push_back((*loader)->next());
  return out;
}

/// A `mode` pipeline of `model` over `stages` stages, `microbatches` kB × kT microbatches a
/// step; every other option at its default.
inline Config tiny_config(const std::string& mode, int stages, int microbatches,
                          const ModelOptions& model) {
  Config c;
  c.model = model;
  c.pipeline.mode = mode;
  c.pipeline.stages = stages;
  c.pipeline.microbatches = microbatches;
  c.pipeline.microbatch_size = kB;
  c.pipeline.seq_len = kT;
  return c;
}

/// The data loader a run of `c` reads.
inline std::unique_ptr<DataLoader> config_loader(const Config& c) {
  auto d = DataLoader::open(c.data, c.model.arch, c.model.vocab_size, c.pipeline.microbatch_size,
                            c.pipeline.seq_len);
  REQUIRE(d.ok());
  return std::move(d).value();
}

}  // namespace actorpipe::testing
