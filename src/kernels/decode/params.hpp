#pragma once
// The decode-attention family: one query token per sequence against its pages
// of the NVFP4 cache, split over thread blocks and merged (core/ops.hpp
// DecodeArgs says what it computes; src/kernels/decode/decode.cu how).
#include <cuda_runtime_api.h>

#include <string>

#include "nvfp4kv/core/ops.hpp"

namespace nvfp4kv::kernels {

// How a call runs, fixed by the shape alone (never by the lengths, which live on
// the device): the same inputs give the same geometry, so a graph stays valid.
struct DecodeGeometry {
  int head_dim = 0;         // the instance's D: 64, 128 or 256 (a smaller D is zero-padded up to it)
  int group = 1;            // query heads per kv head
  int splits = 1;           // thread blocks per (sequence, kv head)
  int64_t entries_per_split = 0;  // block-table entries each reads (a multiple of pages_per_stage)
  int pages_per_stage = 1;  // pages copied into one shared-memory stage
  int stages = 2;           // stages in flight
  bool dense = false;       // pages copied as whole planes, 16 bytes per thread and copy (else row by row)
  bool span = false;        // dense, and a (page, head)'s four planes lie back to back as in a page slot:
                            // one contiguous copy per page
  int plane_offset[kRegionCount] = {};  // bytes of each region's plane inside a page slot
  int slot_bytes = 0;       // one page's four planes
  int smem_bytes = 0;       // dynamic shared memory of one thread block
  size_t workspace_bytes = 0;  // split partials (0 when splits == 1)
};

struct DecodeParams {
  LayoutView layout;
  CacheBuffers cache;
  DecodeArgs args;
  DecodeGeometry geometry;
};

// Fills p.geometry from the layout and the args' shape (batch, heads, block-table
// stride) on the current device; kUnsupported-class problems come back as a message.
cudaError_t plan_decode_geometry(DecodeParams& p, std::string* unsupported);

// Launches the decode kernel and, when split, the merge; one stream, no sync.
cudaError_t launch_decode(const DecodeParams& p, cudaStream_t stream);

}  // namespace nvfp4kv::kernels
