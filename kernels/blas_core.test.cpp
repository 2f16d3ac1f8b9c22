#include "kernels/blas_core.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/gemm.hpp"

using namespace actorpipe;

namespace {
bool same_isa_name(const std::string& a, const std::string& b) {
  return blas_core_isa(a).known && blas_core_isa(b).known && a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}
}  // namespace

TEST_CASE("an OpenBLAS core narrower than the CPU gets the core to set, in any letter case") {
  CHECK(suggested_blas_core("Prescott", VectorIsa::avx512) == "SkylakeX");
  CHECK(suggested_blas_core("PRESCOTT", VectorIsa::avx512) == "SkylakeX");
  CHECK(suggested_blas_core("Haswell", VectorIsa::avx512) == "SkylakeX");
  CHECK(suggested_blas_core("Sandybridge", VectorIsa::avx2) == "Haswell");
  CHECK(suggested_blas_core("Nehalem", VectorIsa::avx) == "Sandybridge");
}

TEST_CASE("a core that fits the CPU, or one not in the table, gets no suggestion") {
  CHECK(suggested_blas_core("SkylakeX", VectorIsa::avx512).empty());
  CHECK(suggested_blas_core("Cooperlake", VectorIsa::avx512).empty());
  CHECK(suggested_blas_core("Zen", VectorIsa::avx2).empty());
  CHECK(suggested_blas_core("Haswell", VectorIsa::avx).empty());  // wider than the CPU
  CHECK(suggested_blas_core("Prescott", VectorIsa::sse).empty());
  CHECK(suggested_blas_core("SomeFutureCore", VectorIsa::avx512).empty());
  CHECK_FALSE(blas_core_isa("SomeFutureCore").known);
}

TEST_CASE("this process's core: named, in the table, and a warning exactly when one is suggested") {
  const BlasCore core = blas_core();
  CAPTURE(core.name);
  CHECK(blas_core_isa(core.name).known);
  CHECK(core.describe() == "OpenBLAS " + core.name + " kernels");
  CHECK(core.suggested == suggested_blas_core(core.name, cpu_vector_isa()));
  if (core.suggested.empty()) {
    CHECK(core.warning().empty());
  } else {
    CHECK(core.warning().find("OPENBLAS_CORETYPE=" + core.suggested) != std::string::npos);
  }
}

TEST_CASE("the core to switch to: the suggested one, unless OPENBLAS_CORETYPE is set") {
  BlasCore narrow;
  narrow.name = "Prescott";
  narrow.suggested = "SkylakeX";
  CHECK(fitting_blas_core(narrow, false) == "SkylakeX");
  CHECK(fitting_blas_core(narrow, true).empty());  // the user's choice stands
  BlasCore fits;
  fits.name = "SkylakeX";
  CHECK(fitting_blas_core(fits, false).empty());
}

TEST_CASE("a switch of OpenBLAS's kernels in the running process, and back") {
  const BlasCore start = blas_core();
  CAPTURE(start.name);
  // an SSE core runs on every x86-64 CPU, and differs from whatever OpenBLAS picked here unless
  // it picked Prescott itself; then the CPU's own core is the other one
  const std::string other = same_isa_name(start.name, "Prescott")
                                ? suggested_blas_core("Prescott", cpu_vector_isa())
                                : std::string("Prescott");
  if (other.empty()) {
    MESSAGE("this CPU has no core but Prescott's: nothing to switch to");
    return;
  }
  if (!switchable_blas_core(start.name)) {
    MESSAGE("OpenBLAS picked " << start.name << ", which a switch could not return to");
    return;
  }
  auto product = [] {  // a 64x64x64 sgemm of small integers: exact in any kernel
    std::vector<float> a(64 * 64), b(64 * 64), c(64 * 64, -1.0f);
    for (int i = 0; i < 64 * 64; ++i) {
      a[i] = static_cast<float>(i % 7 - 3);
      b[i] = static_cast<float>(i % 5 - 2);
    }
    gemm_serial(false, false, 64, 64, 64, 1.0f, a.data(), 64, b.data(), 64, 0.0f, c.data(), 64);
    return c;
  };
  const std::vector<float> before = product();
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  const std::string env_before = env != nullptr ? env : "(unset)";

  REQUIRE(switch_blas_core(other).empty());
  CHECK(blas_core().name == other);
  CHECK(blas_core().picked_at_load == start.name);
  CHECK(blas_core().describe().find("OpenBLAS picked " + start.name) != std::string::npos);
  CHECK(product() == before);
  env = std::getenv("OPENBLAS_CORETYPE");
  CHECK((env != nullptr ? env : "(unset)") == env_before);  // the environment as it was

  REQUIRE(switch_blas_core(start.name).empty());
  CHECK(blas_core().name == start.name);
  CHECK(blas_core().picked_at_load.empty());
  CHECK(product() == before);
}

TEST_CASE("a switch to a core the CPU cannot run, or one not in the table, is refused by name") {
  CHECK(switch_blas_core("SomeFutureCore").find("'SomeFutureCore'") != std::string::npos);
  // a 32-bit core's table is empty in a 64-bit OpenBLAS: asking for it would end the process
  CHECK(switch_blas_core("Katmai").find("not a core this switches to") != std::string::npos);
  CHECK(switch_blas_core("Cooperlake").find("not a core this switches to") != std::string::npos);
  CHECK(switchable_blas_core("skylakex"));
  CHECK_FALSE(switchable_blas_core("Katmai"));
  if (cpu_vector_isa() < VectorIsa::avx512)
    CHECK(switch_blas_core("SkylakeX").find("AVX-512") != std::string::npos);
  CHECK(blas_core_isa(blas_core().name).known);
}
