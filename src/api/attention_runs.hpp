#pragma once
// The attention launchers split into "prepare" (every argument rule, the GPU's own
// checks and the plan: all that can refuse a call) and the launch, so that
// mixed_attention prepares every run of a batch before it launches the first.
// Internal to the API.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "../kernels/decode/params.hpp"
#include "../kernels/prefill/params.hpp"
#include "nvfp4kv/api/decode.hpp"
#include "nvfp4kv/api/prefill.hpp"

namespace nvfp4kv::api {

// decode_attention's checks and plan into *p (nothing to launch when the batch is empty).
Result prepare_decode(const ValidLayout& layout, const CacheBuffers& buffers, const DecodeArgs& a,
                      kernels::DecodeParams* p, const char* who = "decode_attention");

// The short-query route (core/prefill_plan.hpp) over the run `a` (rows cu_seqlens_q of
// q, out and lse as in PrefillArgs; a.max_q_len >= 2 fits short_query_fits), the split
// workspace given: its checks and plan into *p.
Result prepare_short_query(const ValidLayout& layout, const CacheBuffers& buffers, const PrefillArgs& a,
                           void* workspace, size_t workspace_bytes, kernels::DecodeParams* p,
                           const char* who = "mixed_attention (short-query route)");

// The plan (splits, workspace) of a short-query run of `batch` sequences of at most
// max_q_len (>= 2) query tokens.
Result plan_short_query(const ValidLayout& layout, int64_t batch, int64_t q_heads, int64_t block_table_stride,
                        int64_t max_q_len, DecodePlan* plan);

// prefill_attention's checks and plan into *p (nothing to launch when the batch is empty).
Result prepare_prefill(const ValidLayout& layout, const CacheBuffers& buffers, const PrefillArgs& a,
                       kernels::PrefillParams* p, const char* who = "prefill_attention");

}  // namespace nvfp4kv::api
