#pragma once
// The per-layer global scale. nvfp4kv's convention: global_scale is the DEQUANT
// multiplier, x ~= e2m1 * e4m3_scale * global_scale. Engines in the wild use
// other conventions for the same number; these helpers convert them (see
// docs/format.md for where each one comes from).
#include <cmath>
#include <string>

#include "nvfp4kv/core/error.hpp"
#include "nvfp4kv/core/format.hpp"

namespace nvfp4kv {

// Recommended: amax / (448 * 6). The largest block then gets the largest E4M3
// scale, so blocks use the whole E4M3 range. The amax/448 convention caps block
// scales at 448/6 = 74.7, leaving the top 2.6 binades of E4M3 unused: smaller
// blocks fall into E4M3 subnormals (fewer significant bits) or underflow to 0.
inline float recommend_global_scale(float observed_amax) {
  if (!std::isfinite(observed_amax) || observed_amax < 0.0f)
    throw ArgumentError("recommend_global_scale: amax must be finite and >= 0, got " +
                                std::to_string(observed_amax));
  if (observed_amax == 0.0f) return 1.0f;  // nothing to scale; any positive value works
  const float s = observed_amax / (kE4M3Max * kE2M1Max);
  return s < kMinGlobalScale ? kMinGlobalScale : s > kMaxGlobalScale ? kMaxGlobalScale : s;
}

// vLLM's k_scale / v_scale multiply the stored value back: already a dequant multiplier.
inline float global_scale_from_vllm(float k_or_v_scale) { return k_or_v_scale; }

// FlashInfer's global_sf multiplies the input before quantization: its reciprocal.
inline float global_scale_from_flashinfer(float global_sf) { return 1.0f / global_sf; }

// TensorRT-LLM keeps both directions: kv_scale_orig_quant (original -> quantized,
// a quant multiplier) and kv_scale_quant_orig (quantized -> original, dequant).
inline float global_scale_from_trtllm_orig_quant(float orig_quant) { return 1.0f / orig_quant; }
inline float global_scale_from_trtllm_quant_orig(float quant_orig) { return quant_orig; }

// Throws unless the scale is usable: in [2^-100, 2^100] (format.hpp says why).
inline void require_valid_global_scale(float global_scale, const char* what) {
  if (!global_scale_usable(global_scale))
    throw ArgumentError(std::string(what) + ": global scale must be in [2^-100, 2^100], got " +
                                std::to_string(global_scale));
}

}  // namespace nvfp4kv
