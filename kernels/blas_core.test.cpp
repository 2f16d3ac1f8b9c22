#include "kernels/blas_core.hpp"

#include <doctest/doctest.h>

using namespace actorpipe;

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
  const BlasCore& core = blas_core();
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
