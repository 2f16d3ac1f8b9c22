#include "kernels/blas_core.hpp"

#include <cblas.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <optional>
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
  if (picked_at_load.empty()) return fmt::format("OpenBLAS {} kernels", name);
  return fmt::format(
      "OpenBLAS {} kernels (chosen at start: OpenBLAS picked {}, narrower than this CPU)", name,
      picked_at_load);
}

namespace {
std::mutex g_switch_mutex;
std::string g_picked_at_load;  // the core before the first switch (under g_switch_mutex)

std::string current_core_name() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "unknown";
}
}  // namespace

BlasCore blas_core() {
  BlasCore c;
  c.name = current_core_name();
  {
    std::lock_guard lock(g_switch_mutex);
    if (!g_picked_at_load.empty() && !same_name(g_picked_at_load, c.name))
      c.picked_at_load = g_picked_at_load;
  }
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
}

namespace {
// The cores a switch may ask for: x86-64 cores whose kernel table a DYNAMIC_ARCH build of
// OpenBLAS 0.3 fills (Debian's has them all). gotoblas_dynamic_init ends the process when the
// table of the name it is given is missing or empty (the 32-bit cores' are), so nothing else is
// asked for.
constexpr std::array<std::string_view, 7> kSwitchable{
    "Prescott", "Core2", "Nehalem", "Sandybridge", "Haswell", "SkylakeX", "Zen"};
}  // namespace

bool switchable_blas_core(std::string_view core) {
  return std::any_of(kSwitchable.begin(), kSwitchable.end(),
                     [&](std::string_view n) { return same_name(n, core); });
}

std::string switch_blas_core(std::string_view core) {
  const CoreIsa isa = blas_core_isa(core);
  if (!isa.known) return fmt::format("'{}' is not an OpenBLAS x86-64 core this knows", core);
  const auto* name = std::find_if(kSwitchable.begin(), kSwitchable.end(),
                                  [&](std::string_view n) { return same_name(n, core); });
  if (name == kSwitchable.end())
    return fmt::format(
        "'{}' is not a core this switches to (one of Prescott, Core2, Nehalem, "
        "Sandybridge, Haswell, SkylakeX, Zen)",
        core);
  if (isa.isa > cpu_vector_isa())
    return fmt::format("{}'s kernels use {}, which this CPU lacks", core, isa_name(isa.isa));
  using Fn = void (*)();
  auto* quit = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
  auto* init = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
  if (quit == nullptr || init == nullptr)
    return "this OpenBLAS has no gotoblas_dynamic_init (built without DYNAMIC_ARCH): its "
           "kernels are fixed";
  std::string table = "gotoblas_";
  for (const char c : *name)
    table += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (dlsym(RTLD_DEFAULT, table.c_str()) == nullptr)
    return fmt::format("this OpenBLAS has no {} kernels ({} is missing)", *name, table);
  std::lock_guard lock(g_switch_mutex);
  const std::string before = current_core_name();
  if (same_name(before, core)) return {};
  // gotoblas_dynamic_init reads OPENBLAS_CORETYPE (an unknown name would make it exit: only
  // names of the table above get here); the environment is left as it was found
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  const std::optional<std::string> saved =
      env != nullptr ? std::optional<std::string>(env) : std::nullopt;
  ::setenv("OPENBLAS_CORETYPE", std::string(*name).c_str(), 1);
  quit();
  init();
  if (saved) {
    ::setenv("OPENBLAS_CORETYPE", saved->c_str(), 1);
  } else {
    ::unsetenv("OPENBLAS_CORETYPE");
  }
  const std::string after = current_core_name();
  if (g_picked_at_load.empty()) g_picked_at_load = before;
  if (!same_name(after, core))
    return fmt::format("OpenBLAS runs its {} kernels after being asked for {}", after, core);
  return {};
}

std::string fitting_blas_core(const BlasCore& now, bool coretype_set) {
  return coretype_set ? std::string() : now.suggested;
}

std::string use_fitting_blas_core() {
  const BlasCore now = blas_core();
  const std::string core = fitting_blas_core(now, std::getenv("OPENBLAS_CORETYPE") != nullptr);
  if (core.empty()) return {};
  if (!switch_blas_core(core).empty()) return {};
  return fmt::format("OpenBLAS picked its {} kernels ({}) on a CPU with {}; running {}'s", now.name,
                     isa_name(blas_core_isa(now.name).isa), isa_name(cpu_vector_isa()), core);
}

}  // namespace actorpipe
