#pragma once
// Paged prefill / extend attention over the NVFP4 cache (core/ops.hpp
// PrefillArgs says what it computes), and the mixed-batch call an engine's
// forward makes: sequences with one new token go to decode attention, the
// others to prefill, each run of consecutive sequences of one kind one launch.
#include <cuda_runtime_api.h>

#include <cstddef>

#include "nvfp4kv/api/result.hpp"
#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/core/ops.hpp"

namespace nvfp4kv {

// Launches prefill attention on `stream`; no host synchronisation, no allocation,
// no workspace. Any q length from 1 (a sequence of q length 1 is decode's
// operation, computed here by the prefill kernel).
Result prefill_attention(const ValidLayout& layout, const CacheBuffers& buffers, const PrefillArgs& args,
                         cudaStream_t stream);

// One forward's attention over a batch of mixed q lengths: `args` as for
// prefill_attention (max_q_len is taken from q_lens), and the host's copy of the
// q lengths, which must agree with args.cu_seqlens_q (the scheduler knows them).
// Runs of q length 1 go to decode_attention (their query rows are consecutive,
// so they read q, out and lse in place), the other runs to prefill_attention.
struct MixedBatch {
  PrefillArgs args;
  const int32_t* q_lens = nullptr;  // host (args.batch.batch)
  void* workspace = nullptr;        // decode's split workspace: mixed_workspace_bytes(...)
  size_t workspace_bytes = 0;
};

// The workspace a mixed call of this shape needs, on the current device: a region for
// each decode and short-query run that splits, in run order, so that no run's partials
// land on another's tickets.
Result mixed_workspace_bytes(const ValidLayout& layout, const int32_t* q_lens, int64_t batch, int64_t q_heads,
                             int64_t block_table_stride, size_t* bytes);

Result mixed_attention(const ValidLayout& layout, const CacheBuffers& buffers, const MixedBatch& batch,
                       cudaStream_t stream);

}  // namespace nvfp4kv
