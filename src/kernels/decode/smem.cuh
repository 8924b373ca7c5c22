#pragma once
// The decode kernel's fixed shape and its shared memory, as the host sizes it (the
// planner's smem_bytes) and the kernel carves it (kernel.cuh).
#include <cuda_fp16.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "params.hpp"

namespace nvfp4kv::kernels::decode {

// Warp-specialized: kConsumerWarps warps take the stages' tiles, one producer
// warp fills the stages; they meet only on per-stage barriers (full: the stage
// landed; empty: every consumer thread is done with it), never on a block barrier.
using decode_limits::kConsumerWarps, decode_limits::kTile;
constexpr int kConsumerThreads = kConsumerWarps * 32;
[[maybe_unused]] constexpr int kProducerWarp = kConsumerWarps;
constexpr int kThreads = kConsumerThreads + 32;

// The per-block shared memory: stages (reused for the final combine), per-token
// address tables, the query and its MMA fragments, and the barriers.
struct Smem {
  uint8_t* stage;
  uint2 *krow, *vrow;                 // (stage tokens) byte offsets of a token's data row and scale row in a stage
  uint8_t* slot_of;                   // (stage tokens) page slot of a stage token
  uint32_t *kscale_col, *vscale_col;  // (D / 16) offsets of a group in a scale row
  int32_t* pages;                     // (entries per split) the block's page ids, -1: bad
  __half* q;                          // (16, D) the query rows, prescaled
  float* row_scale;                   // (16) logit multiplier per query row
  float* row_bias;                    // (16) per query row: softmax_scale * q . mu * log2(e), K smoothing's
                                      // logit term (0 where the format smooths no K); carved only for
                                      // the instances with the format's steps (DecodeParams::format_steps)
  uint2* qfrag;                       // (D / 16, 2, 32) the query's B fragments per k-step, n-tile and lane
  unsigned long long* page_ok;        // (stages) bit p: page slot p was loaded
  uint64_t* full;                     // (stages) the stage's copies have landed and page_ok is written
  uint64_t* empty;                    // (stages) every consumer thread is done with the stage
  const uint8_t** plane_base;         // (regions) byte of (page 0, token 0, column 0)
                                      // of this block's layer and kv head
  int* flags;                         // [0]: a bad page was met
  int *row_lo, *row_hi;               // short-query route only (16 each): the tokens block row r may see,
                                      // [row_lo[r], row_hi[r]) counted from the span's first entry's first token
};

struct Carve {
  size_t at = 0;
  template <typename T>
  __host__ __device__ T* take(char* base, size_t count, size_t align = 16) {
    at = (at + align - 1) / align * align;
    T* p = reinterpret_cast<T*>(base + at);
    at += count * sizeof(T);
    return p;
  }
};

// The stage slots, reused at the end for the warps' combine and the split merge.
template <int kD>
__host__ __device__ size_t stage_area(const DecodeGeometry& g) {
  return std::max<size_t>(size_t(g.stages) * g.pages_per_stage * g.slot_bytes,
                          size_t(kConsumerWarps) * 16 * kD * sizeof(float) + 2 * kConsumerWarps * 16 * sizeof(float));
}

template <int kD>
__host__ __device__ size_t carve(char* base, const DecodeGeometry& g, int64_t n, Smem* s, bool row_bias) {
  const int stage_tokens = g.pages_per_stage * int(n);
  const int tokens = (stage_tokens + kTile - 1) / kTile * kTile;
  Carve c;
  Smem m;
  m.stage = c.take<uint8_t>(base, stage_area<kD>(g), 128);
  m.krow = c.take<uint2>(base, tokens);
  m.vrow = c.take<uint2>(base, tokens);
  m.slot_of = c.take<uint8_t>(base, tokens);
  m.kscale_col = c.take<uint32_t>(base, kD / 16);
  m.vscale_col = c.take<uint32_t>(base, kD / 16);
  m.pages = c.take<int32_t>(base, size_t(g.entries_per_split));
  m.q = c.take<__half>(base, 16 * kD);
  m.row_scale = c.take<float>(base, 16);
  m.row_bias = row_bias ? c.take<float>(base, 16) : nullptr;
  m.qfrag = c.take<uint2>(base, size_t(kD / 16) * 2 * 32);
  m.page_ok = c.take<unsigned long long>(base, g.stages, 8);
  m.full = c.take<uint64_t>(base, g.stages, 8);
  m.empty = c.take<uint64_t>(base, g.stages, 8);
  m.plane_base = c.take<const uint8_t*>(base, kRegionCount, 8);
  m.flags = c.take<int>(base, 4);
  m.row_lo = m.row_hi = nullptr;
  if (g.queries > 1) {
    m.row_lo = c.take<int>(base, kShortQueryRows);
    m.row_hi = c.take<int>(base, kShortQueryRows);
  }
  if (s) *s = m;
  return c.at;
}

}  // namespace nvfp4kv::kernels::decode
