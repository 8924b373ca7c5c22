#pragma once
// Rounding policies: the ways engines' writers round one 16-element block, so
// that check-write can tell "rounds differently" from "put bytes in the wrong
// place". Each is stated in float32 steps (docs/conformance.md, "Rounding").
//   nvfp4kv               docs/format.md: SF = e4m3((amax * (1/gs)) / 6), inv = 1 / (SF * gs), q = e2m1(x * inv)
//   reciprocal-multiply   FlashInfer's, vLLM's and TensorRT-LLM's cvt_warp_fp16_to_fp4, given the quant
//                         multiplier G = 1/gs: SF = e4m3(G * (amax * (1/6))), inv = 1 / (SF * (1/G)),
//                         q = e2m1(x * inv); reciprocals correctly rounded
//   fast-math-division    x / (SF * gs) as --use_fast_math builds it (an approximate reciprocal, then a
//                         multiply): any evaluation whose every quotient is within 2^-20 of the exact
//                         value, and either sign of a zero
// The first two are bit-exact definitions; the third is a tolerance, so it explains
// every difference the other two do, and a block no policy explains is wrong.
#include <cstdint>
#include <optional>

#include "nvfp4kv/core/format.hpp"

namespace nvfp4kv::conformance {

enum class RoundingPolicy : uint8_t { kNvfp4kv = 0, kReciprocalMultiply = 1, kFastMathDivision = 2 };
inline constexpr int kRoundingPolicyCount = 3;

const char* policy_name(RoundingPolicy p);  // "nvfp4kv", "reciprocal-multiply", "fast-math-division"

// The block as a writer following p stores it. kFastMathDivision has no single
// result; it gives one of those it admits: nvfp4kv's scale, and the elements times a
// reciprocal one ulp above the correctly rounded 1 / (SF * gs).
QuantizedBlock quantize_block_as(RoundingPolicy p, const float* x, float global_scale);

// Whether a writer following p could have stored this block as (scale, packed).
bool policy_explains(RoundingPolicy p, const float* x, float global_scale, uint8_t scale, const uint8_t* packed);

// The most specific policy that explains (scale, packed), trying them in order.
std::optional<RoundingPolicy> explaining_policy(const float* x, float global_scale, uint8_t scale, const uint8_t* packed);

// The block's two parts judged apart, for a block no policy explains whole (its scale
// misplaced, say): whether its codes are those a policy stores beside the scale that
// policy computes, and whether the scale byte is one a policy computes.
std::optional<RoundingPolicy> data_explaining_policy(const float* x, float global_scale, const uint8_t* packed);
std::optional<RoundingPolicy> scale_explaining_policy(const float* x, float global_scale, uint8_t scale);

}  // namespace nvfp4kv::conformance
