// custom_layers: the affine successor data source.
#include "data.hpp"

#include <actorpipe/engine/rng.hpp>
#include <cmath>
#include <string>

namespace ap = actorpipe;

namespace custom {
namespace {

constexpr int64_t kA = 5, kC = 3;  // the successor map x -> (5x + 3) mod V

double uniform01(ap::SplitMix64& rng) {
  return static_cast<double>(rng.next() >> 11) * 0x1.0p-53;
}

}  // namespace

AffineSuccessorData::AffineSuccessorData(int B, int T, int vocab_size, uint64_t seed, double noise)
    : B_(B), T_(T), V_(vocab_size), seed_(seed), noise_(noise) {}

ap::Microbatch AffineSuccessorData::microbatch(uint64_t n) const {
  ap::Microbatch mb;
  mb.B = B_;
  mb.T = T_;
  mb.tokens.resize(static_cast<size_t>(B_) * T_);
  mb.targets.resize(mb.tokens.size());
  for (int b = 0; b < B_; ++b) {
    ap::SplitMix64 rng(ap::derive_seed(seed_, n, static_cast<uint64_t>(b)));
    auto draw = [&] { return static_cast<int32_t>(rng.next() % static_cast<uint64_t>(V_)); };
    int32_t x = draw();
    for (int t = 0; t < T_; ++t) {
      const int32_t next =
          uniform01(rng) < noise_ ? draw() : static_cast<int32_t>((kA * x + kC) % V_);
      const size_t i = static_cast<size_t>(b) * T_ + t;
      mb.tokens[i] = x;
      mb.targets[i] = next;
      x = next;
    }
  }
  return mb;
}

std::optional<double> AffineSuccessorData::loss_floor() const {
  // the successor with probability 1 − ε + ε/V, each other token ε/V
  const double hit = 1.0 - noise_ + noise_ / V_, miss = noise_ / V_;
  return -hit * std::log(hit) - (V_ - 1) * miss * std::log(miss);
}

std::string AffineSuccessorData::describe() const {
  return "affine successor x -> (5x + 3) mod " + std::to_string(V_) + " with noise " +
         std::to_string(noise_) + ", B=" + std::to_string(B_) + " T=" + std::to_string(T_) +
         ", seed " + std::to_string(seed_);
}

}  // namespace custom
