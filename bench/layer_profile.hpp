// Layer profile: the benchmark's names for the engine's profiler (engine/profiler/profiler.hpp),
// which measures each layer alone for one microbatch at a stage's thread count.
#pragma once

#include "engine/profiler/profiler.hpp"

namespace actorpipe::bench {

/// One layer's median times (the engine's LayerTiming).
using LayerCost = actorpipe::LayerTiming;
using actorpipe::LayerProfile;
using actorpipe::profile_layers;
using actorpipe::profile_layers_loaded;

}  // namespace actorpipe::bench
