// DelayCorrectionChoice: the value of optimizer.delay_correction, split into the compensation
// of a stale gradient (none, dc, secant) and Nesterov's look-ahead (docs/modes.md, "Delay
// corrections").
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace actorpipe {

struct DelayCorrectionChoice {
  /// How a gradient computed at stale weights is corrected toward the newest weights.
  enum class Compensation : uint8_t {
    none,    ///< used as computed
    dc,      ///< DC-ASGD: λ·g²/√ms, a diagonal Hessian estimate, times Δ
    secant,  ///< a secant estimate of the Hessian's diagonal times Δ
  };
  Compensation compensation = Compensation::none;
  bool lookahead = false;  ///< Nesterov's look-ahead (NAdam; SGD's nesterov=True)

  /// True when an update needs Δ = W_now − W_stale (dc, secant).
  bool needs_weight_change() const { return compensation != Compensation::none; }
  friend bool operator==(const DelayCorrectionChoice&, const DelayCorrectionChoice&) = default;
};

/// The accepted values of optimizer.delay_correction, in the order the docs list them.
inline constexpr std::array<std::string_view, 6> delay_correction_names = {
    "none", "nesterov", "dc", "secant", "dc+nesterov", "secant+nesterov"};

/// Parses a value of optimizer.delay_correction; false (out untouched) for an unknown one.
bool from_string(std::string_view name, DelayCorrectionChoice& out);

/// "none", "nesterov", "dc", "secant", "dc+nesterov" or "secant+nesterov".
std::string_view to_string(const DelayCorrectionChoice& choice);

}  // namespace actorpipe
