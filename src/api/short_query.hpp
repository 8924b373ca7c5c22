#pragma once
// The short-query route of mixed_attention (core/prefill_plan.hpp): the decode
// kernel over a run of sequences with a few query tokens each. Internal to the
// API: mixed_attention and mixed_workspace_bytes reach it, after their own checks.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "nvfp4kv/api/decode.hpp"
#include "nvfp4kv/api/prefill.hpp"

namespace nvfp4kv::api {

// The plan (splits, workspace) of a short-query run of `batch` sequences of at
// most max_q_len (>= 2) query tokens.
Result plan_short_query(const ValidLayout& layout, int64_t batch, int64_t q_heads, int64_t block_table_stride,
                        int64_t max_q_len, DecodePlan* plan);

// One launch over the run `a` (rows cu_seqlens_q of q, out and lse as in
// PrefillArgs; a.max_q_len >= 2 fits short_query_fits), the split workspace given.
Result short_query_attention(const ValidLayout& layout, const CacheBuffers& buffers, const PrefillArgs& a,
                             void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace nvfp4kv::api
