#pragma once
// Fused paged decode attention over the NVFP4 cache (core/ops.hpp DecodeArgs
// says what it computes). One query token per sequence; any page order, any
// subset of a sequence's pages; GQA groups of 1 to 16 query heads per kv head.
// Long sequences are split over several thread blocks and merged (split-KV); the
// split is chosen from the batch size, the heads and the block-table stride
// only, never from the lengths, so a call captured in a CUDA graph stays valid
// while the lengths and the block table change between replays.
#include <cuda_runtime_api.h>

#include <cstddef>

#include "nvfp4kv/api/result.hpp"
#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/core/ops.hpp"

namespace nvfp4kv {

// How a decode call of this shape runs: the split of each sequence's block
// table over thread blocks and the workspace the merge needs (0 when unsplit).
struct DecodePlan {
  int splits = 1;              // thread blocks per (sequence, kv head)
  int64_t entries_per_split = 0;  // block-table entries each of them reads
  size_t workspace_bytes = 0;
  bool dense_planes = false;   // pages copied as whole planes (fast path) or row by row
  bool tensor_rows = false;    // not dense: rows come by one tensor copy per (page, head) and region
                               // (else the producer warp copies them piece by piece: slow)
};

// Same inputs as the call itself; the device is the current one.
Result plan_decode(const ValidLayout& layout, int64_t batch, int64_t q_heads, int64_t block_table_stride,
                   DecodePlan* plan);

// Launches the decode (and its merge, when split) on `stream`; no host
// synchronisation, no allocation. args.workspace must hold plan_decode's bytes.
Result decode_attention(const ValidLayout& layout, const CacheBuffers& buffers, const DecodeArgs& args,
                        cudaStream_t stream);

}  // namespace nvfp4kv
