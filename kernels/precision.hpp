// Precision: what the matrix products of a Context compute in. fp32: f32 inputs, f32 products
// (OpenBLAS sgemm). bf16: inputs rounded to bf16, products accumulated in f32 (oneDNN matmul,
// kernels/bf16_gemm.hpp). Every other kernel computes in f32 either way.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace actorpipe {

enum class Precision : uint8_t { fp32, bf16 };

/// "fp32", "bf16".
std::string_view to_string(Precision p);
/// The precision called `name` ("fp32" or "bf16"), or nothing.
std::optional<Precision> parse_precision(std::string_view name);

}  // namespace actorpipe
