#include "kernels/blas_core.hpp"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <utility>

namespace actorpipe {

namespace {

const char* isa_name(VectorIsa isa) {
  switch (isa) {
    case VectorIsa::sse:
      return "SSE";
    case VectorIsa::avx:
      return "AVX";
    case VectorIsa::avx2:
      return "AVX2";
    case VectorIsa::avx512:
      return "AVX-512";
  }
  return "?";
}

bool same_name(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

VectorIsa cpu_vector_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return VectorIsa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return VectorIsa::avx2;
  if (__builtin_cpu_supports("avx")) return VectorIsa::avx;
  return VectorIsa::sse;
}

CoreIsa blas_core_isa(std::string_view core) {
  // OpenBLAS 0.3's x86-64 cores (driver/others/dynamic.c)
  static const std::array<std::pair<std::string_view, VectorIsa>, 20> table{{
      {"Katmai", VectorIsa::sse},        {"Coppermine", VectorIsa::sse},
      {"Northwood", VectorIsa::sse},     {"Prescott", VectorIsa::sse},
      {"Banias", VectorIsa::sse},        {"Atom", VectorIsa::sse},
      {"Core2", VectorIsa::sse},         {"Penryn", VectorIsa::sse},
      {"Dunnington", VectorIsa::sse},    {"Nehalem", VectorIsa::sse},
      {"Opteron", VectorIsa::sse},       {"Barcelona", VectorIsa::sse},
      {"Nano", VectorIsa::sse},          {"Sandybridge", VectorIsa::avx},
      {"Bulldozer", VectorIsa::avx},     {"Haswell", VectorIsa::avx2},
      {"Zen", VectorIsa::avx2},          {"SkylakeX", VectorIsa::avx512},
      {"Cooperlake", VectorIsa::avx512}, {"SapphireRapids", VectorIsa::avx512},
  }};
  for (const auto& [name, isa] : table) {
    if (same_name(name, core)) return {true, isa};
  }
  return {};
}

std::string suggested_blas_core(std::string_view core, VectorIsa cpu) {
  const CoreIsa have = blas_core_isa(core);
  if (!have.known || have.isa >= cpu) return {};
  switch (cpu) {
    case VectorIsa::avx512:
      return "SkylakeX";
    case VectorIsa::avx2:
      return "Haswell";
    case VectorIsa::avx:
      return "Sandybridge";
    case VectorIsa::sse:
      return {};
  }
  return {};
}

std::string BlasCore::describe() const {
  return fmt::format("OpenBLAS {} kernels", name);
}

const BlasCore& blas_core() {
  static const BlasCore core = [] {
    BlasCore c;
    const char* name = openblas_get_corename();
    c.name = name != nullptr ? name : "unknown";
    const VectorIsa cpu = cpu_vector_isa();
    c.suggested = suggested_blas_core(c.name, cpu);
    if (!c.suggested.empty()) {
      const char* set = std::getenv("OPENBLAS_CORETYPE");
      c.warning_text = fmt::format(
          "OpenBLAS picked its {} kernels ({}) on a CPU with {}: fp32 matrix products run "
          "several times slower than they can here; start with OPENBLAS_CORETYPE={}{}",
          c.name, isa_name(blas_core_isa(c.name).isa), isa_name(cpu), c.suggested,
          set != nullptr ? fmt::format(" (it is set to {})", set) : std::string());
    }
    return c;
  }();
  return core;
}

}  // namespace actorpipe
