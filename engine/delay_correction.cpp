// DelayCorrectionChoice: the names of optimizer.delay_correction's values.
#include "engine/delay_correction.hpp"

namespace actorpipe {
namespace {

using Compensation = DelayCorrectionChoice::Compensation;

// delay_correction_names[i] is the choice kChoices[i]
constexpr std::array<DelayCorrectionChoice, delay_correction_names.size()> kChoices = {{
    {Compensation::none, false},
    {Compensation::none, true},
    {Compensation::dc, false},
    {Compensation::secant, false},
    {Compensation::dc, true},
    {Compensation::secant, true},
}};

}  // namespace

bool from_string(std::string_view name, DelayCorrectionChoice& out) {
  for (size_t i = 0; i < kChoices.size(); ++i) {
    if (delay_correction_names[i] == name) {
      out = kChoices[i];
      return true;
    }
  }
  return false;
}

std::string_view to_string(const DelayCorrectionChoice& choice) {
  for (size_t i = 0; i < kChoices.size(); ++i)
    if (kChoices[i] == choice) return delay_correction_names[i];
  return "none";  // unreachable: every combination is named
}

}  // namespace actorpipe
