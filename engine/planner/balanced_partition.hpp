// Balanced partition: contiguous layer counts per stage minimising the largest per-stage sum of
// one cost, by dynamic programming; ties go to the plan whose last stages are shortest.
#pragma once

#include <span>
#include <vector>

#include "engine/expected.hpp"

namespace actorpipe {

/// Layer counts per stage (contiguous, each >= 1) minimising the largest per-stage sum of
/// `cost`; among partitions with the same largest sum, the one whose last stage is shortest, then
/// the stage before it, and so on (layers go early: the last stage holds the loss).
/// Errors: stages < 1, more stages than layers, a negative or non-finite cost.
Expected<std::vector<int>> balanced_partition(std::span<const double> cost, int stages);

}  // namespace actorpipe
