// The headers nearly every test's own source parses: doctest, fmt and the standard library.
// Precompiled once per build when ACTORPIPE_TEST_PCH is on (scripts/build.sh turns it on) and
// reused by every test source compiled at -O0; each test still includes what it uses, so a build
// without the precompiled header compiles the same sources.
#pragma once

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>
