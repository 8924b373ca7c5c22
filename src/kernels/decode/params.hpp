#pragma once
// The decode-attention family: one query token per sequence against its pages
// of the NVFP4 cache, split over thread blocks and merged (core/ops.hpp
// DecodeArgs says what it computes; src/kernels/decode/kernel.cuh how).
#include <cuda.h>  // CUtensorMap (a plain struct; the driver is reached through the runtime's entry points)
#include <cuda_runtime_api.h>

#include <string>

#include "../common/format_view.hpp"
#include "nvfp4kv/core/decode_plan.hpp"
#include "nvfp4kv/core/ops.hpp"

namespace nvfp4kv::kernels {

struct DecodeParams {
  LayoutView layout;
  CacheBuffers cache;
  DecodeArgs args;
  DecodeGeometry geometry;
  LayerFormatView format;  // the layer's format: its rotations and K smoothing (common/format_view.hpp)
  // The layout's format rotates or smooths in some layer (CacheFormat::transforms): the
  // kernel instance with the query and output steps, and 16 floats of q . mu in shared
  // memory. From the layout, not the layer, so that plan_decode (which has no layer) and
  // the launch plan the same shared memory; a plain layer of such a cache runs the steps
  // with rotation 0 and mu 0. Without it the instance has no instruction for them.
  bool format_steps = false;
  // The short-query route (a mixed batch's runs of q length 2..16 / group): each
  // sequence's query rows cu_q[s] .. cu_q[s + 1] of args.q / out / lse, at most
  // max_q_len of them (which sizes geometry.rows); null with max_q_len 1: decode.
  const int32_t* cu_q = nullptr;
  int64_t max_q_len = 1;
  // geometry.tensor_rows: each region's (page, head) tiles of this call's layer, as
  // the copy engine reads them (filled by launch_decode from the layout and the buffers).
  CUtensorMap rows[kRegionCount] = {};
};

// Fills p.geometry (core's plan_decode_geometry) from the layout, the args' shape
// and p.max_q_len on the current device, with the kernel's shared memory and occupancy;
// kUnsupported-class problems come back as a message.
cudaError_t plan_decode_geometry(DecodeParams& p, std::string* unsupported);

// Launches the decode kernel (a split call merges inside it); one stream, no sync.
cudaError_t launch_decode(const DecodeParams& p, cudaStream_t stream);

}  // namespace nvfp4kv::kernels
