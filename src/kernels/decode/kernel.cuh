#pragma once
// Fused paged decode attention over the NVFP4 cache.
//
// A thread block owns (split, kv head, sequence): the query heads of one GQA
// group against one range of the sequence's block table. It is warp-specialized:
// a producer warp streams pages into shared-memory stages several stages ahead
// (by bulk copies when the layout's (page, head) planes are dense and aligned, one
// copy per page when its four planes lie back to back as in the native layouts,
// else row by row into canonical planes by cp.async), and 8 consumer warps take
// 16 tokens of a stage at a time (a tile; at D 64 two tiles share one softmax
// update), keeping everything of them in registers. The two sides meet on a
// full and an empty barrier per stage slot, never on a block barrier per stage.
// A tile:
//  - S = K Q^T on FP16 tensor cores (m16n8k16): M = the tile's 16 tokens, N = 8
//    query heads, K = 16 columns of D. A lane's K operand is 4 E2M1 values of one
//    token; they become FP16 by bit placement (attention/dequant.cuh: e2m1 * 2^-14, exact)
//    times the token's block scale in FP16 (exact: <= 6 significant bits,
//    >= 2^-24), so each K element is dequantized once per block and serves every
//    query head of the group. A side the layout holds in FP8 E4M3 goes through its
//    own dequantize part (two bytes to an FP16 pair by one conversion, no block
//    scale): the format policies of attention/dequant.cuh, one per side.
//  - online softmax in base 2 on the FP32 accumulators: a lane holds two heads'
//    logits for two tokens; the FP32 global scales and the query's power-of-two
//    prescale fold into one multiplier per head.
//  - P^T by transposing the FP16 probabilities in registers (movmatrix), then
//    O^T += V^T P^T: M = 16 rows of D, K = the 16 tokens, N = 8 heads. A V operand
//    register pairs one element of two tokens: lane g owns D / 8 consecutive
//    elements of every token (one block scale per token up to D = 128), and the
//    two tokens' bytes are interleaved by byte permutes before the placement.
// The consumers' partial (max, sum, O) are combined in shared memory; with one
// split that is the output, else a partial in the workspace, and the split that
// finishes last merges its group's heads (merge_group). Inside one MMA the reduction over D runs
// in a fixed permutation of D, the same for Q and K; O^T's rows are a fixed
// permutation of D, undone when O is written.
//
// This header holds the kernel and its launch templates; decode_d64.cu,
// decode_d128.cu and decode_d256.cu instantiate one head dim each (instances.hpp),
// so the instances compile in parallel, and decode.cu holds the host side.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "../attention/dequant.cuh"
#include "../attention/epilogue.cuh"
#include "../attention/mma.cuh"
#include "../attention/options.cuh"
#include "../attention/query.cuh"
#include "../attention/softmax.cuh"
#include "../attention/split.cuh"
#include "../common/device.cuh"
#include "../common/dispatch.cuh"
#include "instances.hpp"
#include "nvfp4kv/core/layout.hpp"
#include "smem.cuh"

namespace nvfp4kv::kernels::decode {

// A token position relative to a span's first token, in 32 bits: clamped to
// +-2^30, far past any stage (the mask compares it with stage offsets only).
__device__ __forceinline__ int clamp_rel(int64_t x) { return int(min(max(x, int64_t(-(1 << 30))), int64_t(1 << 30))); }

using attention::fast_exp2, attention::hmul2, attention::kLog2e, attention::kNegInf, attention::mma_16816,
    attention::pack_half2, attention::transpose_8x8;

// Byte offset, inside a token's data row, of K data word w (8 elements) of lane
// column c: lanes 0-3 of a row split the row's 16-byte chunks between them.
template <int kD>
__device__ __forceinline__ int word_offset(int c, int w) {
  if constexpr (kD == 64) return 8 * c + 4 * w;
  else return 16 * c + 64 * (w / 4) + 4 * (w % 4);
}


// Who a thread is and what its block owns.
struct DecodeThread {
  int tid, warp, lane;
  int64_t split, kv_head, seq;
};

// The block's share of its sequence: entries [first, last) of the block table,
// tokens [window_start, length) of the sequence.
struct Span {
  int64_t length, window_start, first, last;
  bool bad_length;
};

// Which tokens of a stage count: [lo, hi) in stage order, on loaded pages. On the
// short-query route [lo, hi) is what some row sees, [lo_all, hi_all) what every row
// sees (a tile inside it needs no mask), and a row's own bounds are in shared
// memory, counted from the span's first token, which is t0 tokens before the stage.
struct StageMask {
  int lo, hi;
  unsigned long long ok;  // bit p: page slot p was loaded
  bool all_ok;            // every page slot was
  int lo_all, hi_all, t0;
};

// kShort: the short-query route, a block's rows (query token, head) pairs with a
// causal limit per token (core/decode_plan.hpp, short_query_fits); else one query
// token per sequence, the rows its group's heads. kSteps: the layer's format rotates
// smooths or channel-scales K (common/format_view.hpp), so the query and output steps are compiled in;
// without it the instance has no instruction for them (an option that is off costs
// nothing: with the steps in every instance, plain caches ran 1-7 % slower, runs 64-66).
template <int kD, int kGroupRows, ElementType kType, bool kSoftcap, bool kShort, bool kSteps, class Formats>
struct DecodeBlock {
  // The dequantize part of each side (attention/dequant.cuh): its element format and, for
  // NVFP4, the layout's code order.
  using KFormat = typename Formats::K;
  using VFormat = typename Formats::V;
  using Logits = attention::Logits<kSoftcap>;
  const DecodeParams& p;
  const Smem& s;
  const DecodeThread& th;
  const Span& span;
  int64_t n;           // tokens per page
  int stage_tokens;    // pages_per_stage * n
  int tiles;           // per stage
  int64_t q_row0;      // the sequence's first query row of args.q (and out, lse)
  int rows;            // query rows of the block that exist: q length x group

  static constexpr int kNT = kGroupRows / 8;      // n-tiles of 8 query heads
  static constexpr int kKSteps = kD / 16;
  static constexpr int kWords = kD / 32;          // K groups of 8 elements per lane per token (an NVFP4 data word each)
  static constexpr int kKGroups = kWords / 2;     // K block scales per lane per token (two groups each)
  static constexpr int kKW = KFormat::kWordsPer8;  // data words per group of 8 K elements
  static constexpr int kE = kD / 8;               // V elements per lane per token
  static constexpr int kVWords = kE / 8;          // V groups of 8 elements per lane per token
  static constexpr int kVW = VFormat::kWordsPer8;  // data words per group of 8 V elements
  static constexpr int kVGroups = kE >= 16 ? kE / 16 : 1;
  static constexpr int kMTiles = kD / 16;         // O^T tiles of 16 rows of D
  // The query's MMA fragments stay in registers only at D 64 with one n-tile: at
  // D 128 their 16 registers made ptxas spill inside the tile loop under the
  // 96-register budget (run 38: from shared memory, 8 more loads per tile and no
  // spill, -6 % time).
  static constexpr bool kQInRegisters = kD * kNT <= 64;

  // ---- loading (the producer warp) ----------------------------------------------
  // Stage j (its entries j * pages_per_stage .. of the span) into stage slot
  // `slot`, whose consumers are done with it. Lane 0 records which page slots get
  // a page. Dense modes: the lanes issue one bulk copy per loaded page (its span)
  // or four (its planes) on the slot's full barrier, which expects the stage's
  // bytes. Row mode: the lanes copy the rows into the canonical planes by
  // cp.async, 16 bytes per copy at most.
  __device__ void issue(int j, int slot) const {
    const DecodeGeometry& g = p.geometry;
    uint8_t* const dst = s.stage + size_t(slot) * g.pages_per_stage * g.slot_bytes;
    const int e0 = j * g.pages_per_stage, entries = int(span.last - span.first);
    unsigned long long ok = 0;
    for (int q0 = 0; q0 < g.pages_per_stage; q0 += 32) {
      const int q = q0 + th.lane;
      const bool loaded = q < g.pages_per_stage && e0 + q < entries && s.pages[e0 + q] >= 0;
      ok |= (unsigned long long)__ballot_sync(0xFFFFFFFFu, loaded) << q0;
    }
    if (th.lane == 0) s.page_ok[slot] = ok;
    if (g.dense) {
      // Every loaded page brings slot_bytes (its span, or four planes that add up to it).
      if (th.lane == 0) arrive_expect_bytes(&s.full[slot], unsigned(__popcll(ok)) * unsigned(g.slot_bytes));
      __syncwarp();
      for (int q = th.lane; q < g.pages_per_stage; q += 32) {
        if (((ok >> q) & 1ull) == 0) continue;
        const int64_t page = s.pages[e0 + q];
        uint8_t* const slot_start = dst + q * g.slot_bytes;
        if (g.span) {
          copy_bulk(slot_start, s.plane_base[0] + page * p.layout.region(Region::kKData).page, unsigned(g.slot_bytes),
                    &s.full[slot]);
        } else {
          for (int ri = 0; ri < kRegionCount; ++ri) {
            const Region r = Region(ri);
            if (stage_row(r) == 0) continue;  // an FP8 side's scales: no plane
            copy_bulk(slot_start + g.plane_offset[ri], s.plane_base[ri] + page * p.layout.region(r).page,
                      unsigned(plane_bytes(r)), &s.full[slot]);
          }
        }
      }
    }
    if (g.dense) return;
    if (g.tensor_rows) {
      // One tensor copy per region and loaded page: its (page, head) rows, each
      // row_pitch bytes wide (zeros past a row's columns, or the next head's bytes
      // where the heads share a row), onto the full barrier like the dense copies.
      // A page brings its boxes' bytes, N rows of row_pitch per region: less than
      // slot_bytes where the planes are padded to 128 bytes (run 40: expecting
      // slot_bytes hung odd page sizes, the barrier never completing).
      const CacheDims& d = p.layout.dims();
      const unsigned page_bytes = unsigned(d.tokens_per_page) * unsigned(g.row_pitch[0] + g.row_pitch[1] + g.row_pitch[2] + g.row_pitch[3]);
      if (th.lane == 0) arrive_expect_bytes(&s.full[slot], unsigned(__popcll(ok)) * page_bytes);
      __syncwarp();
      for (int q = th.lane; q < g.pages_per_stage; q += 32) {
        if (((ok >> q) & 1ull) == 0) continue;
        const int page = s.pages[e0 + q];
        uint8_t* const slot_start = dst + q * g.slot_bytes;
        for (int ri = 0; ri < kRegionCount; ++ri) {
          const Region r = Region(ri);
          if (stage_row(r) == 0) continue;
          const bool flat = tensor_rows_flat(p.layout.region(r).head, d.heads);
          copy_tensor_4d(slot_start + g.plane_offset[ri], &p.rows[ri],
                         flat ? int(th.kv_head * d.columns(r)) - tensor_row_shift(th.kv_head, d.columns(r)) : 0, 0,
                         flat ? 0 : int(th.kv_head), page, &s.full[slot]);
        }
      }
      return;
    }
    for (int q = 0; q < g.pages_per_stage; ++q) {
      if (e0 + q >= entries) break;
      const int64_t page = s.pages[e0 + q];
      if (page < 0) continue;
      uint8_t* const to = dst + size_t(q) * g.slot_bytes;
      for (int ri = 0; ri < kRegionCount; ++ri)
        if (stage_row(Region(ri)) > 0) copy_rows(Region(ri), page, to + g.plane_offset[ri]);
    }
    // Each lane arrives twice: once its cp.async copies have landed, and at once
    // for its plain stores (narrow rows' byte copies; lane 0's page_ok).
    barrier_arrive_after_copies(&s.full[slot]);
    barrier_arrive(&s.full[slot]);
  }

  // The block's page ids into shared memory, read in parallel once: the producer
  // never waits on the block table. A bad entry is counted (by kv head 0's
  // blocks, so once per sequence) and flags the block.
  __device__ void load_pages() const {
    const CacheDims& d = p.layout.dims();
    for (int64_t e = span.first + th.tid; e < span.last; e += kThreads) {
      const int64_t page = page_of(p.args.batch, th.seq, e, d.pages);
      s.pages[e - span.first] = int32_t(page);
      if (page < 0) {
        s.flags[0] = 1;
        const int64_t tokens = min(n, span.length - e * n);
        if (th.kv_head == 0 && p.args.status && tokens > 0)
          atomicAdd(&p.args.status->bad_pages, (unsigned long long)tokens);
      }
    }
  }

  // A canonical row of region r in a stage: its side's element format at the instance's D.
  __host__ __device__ static constexpr int stage_row(Region r) {
    return side_of(r) == Side::kK ? (is_scale(r) ? KFormat::scale_row(kD) : KFormat::data_row(kD))
                                  : (is_scale(r) ? VFormat::scale_row(kD) : VFormat::data_row(kD));
  }
  __device__ int plane_bytes(Region r) const { return int(n) * stage_row(r); }

  // One page's rows of region r into its canonical plane (row t at t * row bytes),
  // as wide as the layout's alignment allows.
  __device__ void copy_rows(Region r, int64_t page, uint8_t* plane) const {
    const CacheDims& d = p.layout.dims();
    const int cols = int(d.columns(r));
    const int row = stage_row(r);
    int width = p.layout.vector_bytes(r);
    while (width > 1 && (cols % width != 0 || row % width != 0)) width /= 2;
    // The (page, head) tile once; one warp issues every row copy of the block, so
    // the per-chunk work is what row mode costs (run 33: a 64-bit division and a
    // whole coordinate per 16-byte chunk, 0.06x native; run 38: a 32-bit division
    // per chunk and the width switch, 0.07x).
    const TileMap tile = p.layout.tile(r, p.args.layer, page, th.kv_head);
    const uint8_t* const src0 = p.cache.ptr[p.layout.region(r).buffer] + tile.base;
    const int chunks = cols / width;
    switch (width) {
      case 16: return copy_chunks<16>(tile, src0, plane, row, chunks);
      case 8: return copy_chunks<8>(tile, src0, plane, row, chunks);
      case 4: return copy_chunks<4>(tile, src0, plane, row, chunks);
      default: return copy_chunks<1>(tile, src0, plane, row, chunks * width);
    }
  }

  // Row t's chunk k (kWidth bytes at column k * kWidth) of every row, by the lanes.
  // Where the chunks of a row divide the warp, a lane keeps its chunk and steps
  // rows by 32 / chunks: no division per chunk.
  template <int kWidth>
  __device__ void copy_chunks(const TileMap& tile, const uint8_t* src0, uint8_t* plane, int row, int chunks) const {
    const auto one = [&](int t, int col) {
      const uint8_t* src = src0 + tile.token(t) + tile.column(col);
      uint8_t* to = plane + t * row + col;
      if constexpr (kWidth > 1) copy_async<kWidth>(to, src);
      else *to = *src;
    };
    if (32 % chunks == 0) {
      const int col = (th.lane % chunks) * kWidth, step = 32 / chunks;
      for (int t = th.lane / chunks; t < n; t += step) one(t, col);
    } else {
      for (int i = th.lane; i < int(n) * chunks; i += 32) {
        const int t = i / chunks;
        one(t, (i - t * chunks) * kWidth);
      }
    }
  }

  // ---- tables ----------------------------------------------------------------
  __device__ void build_tables() const {
    const DecodeGeometry& g = p.geometry;
    const int padded = (stage_tokens + kTile - 1) / kTile * kTile;
    const CacheDims& d = p.layout.dims();
    const TileMap kd = p.layout.tile(Region::kKData, 0, 0, 0), ks = p.layout.tile(Region::kKScale, 0, 0, 0);
    const TileMap vd = p.layout.tile(Region::kVData, 0, 0, 0), vs = p.layout.tile(Region::kVScale, 0, 0, 0);
    for (int i = th.tid; i < padded; i += kConsumerThreads) {
      const int slot = i < stage_tokens ? int(i / n) : 0;
      const int64_t t = i < stage_tokens ? i % n : 0;
      const uint32_t base = uint32_t(slot * g.slot_bytes);
      const auto row = [&](Region r, const TileMap& tile) {
        const int64_t at = g.dense ? tile.token(t)
                                   : t * g.row_pitch[int(r)] +
                                         (g.tensor_rows && tensor_rows_flat(p.layout.region(r).head, d.heads)
                                              ? tensor_row_shift(th.kv_head, d.columns(r))
                                              : 0);
        return base + uint32_t(g.plane_offset[int(r)] + at);
      };
      s.krow[i] = make_uint2(row(Region::kKData, kd), row(Region::kKScale, ks));
      s.vrow[i] = make_uint2(row(Region::kVData, vd), row(Region::kVScale, vs));
      s.slot_of[i] = uint8_t(slot);
    }
    for (int c = th.tid; c < kD / 16; c += kConsumerThreads) {
      s.kscale_col[c] = uint32_t(g.dense ? ks.column(c) : c);
      s.vscale_col[c] = uint32_t(g.dense ? vs.column(c) : c);
    }
  }

  // The group's query rows as FP16, each scaled by a power of two that puts its
  // largest element in [2^14, 2^15) (BF16 queries have FP32's range); the
  // logit multiplier of the row undoes it and carries K's FP32 global scale and
  // the 2^14 of the E2M1 placement.
  __device__ void load_query(float k_global_scale) const {
    const CacheDims& d = p.layout.dims();
    const DecodeArgs& a = p.args;
    const int64_t token_stride = a.q_token_stride ? a.q_token_stride : a.q_heads * d.head_dim;
    const int group = p.geometry.group;
    for (int r = th.warp; r < 16; r += kConsumerWarps) {
      // Row r: query token r / group of the sequence, head r % group of the kv head's group.
      const uint16_t* q = r < rows ? static_cast<const uint16_t*>(a.q) + (q_row0 + r / group) * token_stride +
                                         (th.kv_head * group + r % group) * d.head_dim
                                   : nullptr;
      if constexpr (kSteps) {
        // The format's query step: q . mu for K's smoothing, the row times K's channel scale,
        // then K's rotation applied to it.
        const attention::QueryTransform t{p.format.k.rotation, p.format.k.mean_row(th.kv_head, d.head_dim),
                                          p.format.k.channel_scale_row(th.kv_head, d.head_dim)};
        float q_mu = 0;
        const float scale = attention::prescale_query_row<kD, kType, KFormat>(q, d.head_dim, th.lane, s.q + r * kD,
                                                                              a.softmax_scale * k_global_scale, t, &q_mu);
        if (th.lane == 0) {
          s.row_scale[r] = scale;
          s.row_bias[r] = a.softmax_scale * q_mu * attention::kLog2e;
        }
      } else {
        const float scale = attention::prescale_query_row<kD, kType, KFormat>(q, d.head_dim, th.lane, s.q + r * kD,
                                                                              a.softmax_scale * k_global_scale);
        if (th.lane == 0) s.row_scale[r] = scale;
      }
    }
  }

  // Short-query route: the tokens each row sees, relative to the span's first token.
  // Query token t of q_len sits at position length - q_len + t and sees [its window's
  // start, position]; rows past the sequence's rows (q zero, never written) take the
  // union, as decode's unused rows do, so that no row is masked everywhere.
  __device__ void row_bounds(int64_t q_len) const {
    const int64_t base = span.first * n;
    for (int r = th.tid; r < kShortQueryRows; r += kConsumerThreads) {
      int64_t lo = span.window_start, hi = span.length;
      if (r < rows) {
        const int64_t pos = span.length - q_len + r / p.geometry.group;
        lo = attention::window_start(pos, p.args.window), hi = pos + 1;
      }
      s.row_lo[r] = clamp_rel(lo - base), s.row_hi[r] = clamp_rel(hi - base);
    }
  }

  // Short-query route: whether block row r sees stage token i.
  __device__ bool row_sees(int r, int i, const StageMask& mk) const {
    const int at = mk.t0 + i;
    return at >= s.row_lo[r] && at < s.row_hi[r];
  }

  // The query as the B operand of S = K Q^T (K: 16 columns of D, N: 8 heads), in
  // the column order the K operand's placement gives (word_offset, KFormat::place8):
  // k-step ks of lane column c covers columns col, col + 4 (rows 2c, 2c + 1) and
  // col + 1, col + 5 (rows 2c + 8, 2c + 9), col = 2 word_offset(c, ks / 2) + 2 (ks % 2).
  __device__ void store_query_fragments() const {
    const int g = th.lane >> 2, c = th.lane & 3;
    for (int i = th.warp; i < kKSteps * kNT; i += kConsumerWarps) {
      const int ks = i / kNT, nt = i % kNT;
      const int col = 2 * word_offset<kD>(c, ks / 2) + 2 * (ks % 2);
      const __half* row = s.q + (8 * nt + g) * kD + col;
      const __half2 b0 = __halves2half2(row[0], row[4]), b1 = __halves2half2(row[1], row[5]);
      s.qfrag[i * 32 + th.lane] = make_uint2(*reinterpret_cast<const uint32_t*>(&b0), *reinterpret_cast<const uint32_t*>(&b1));
    }
  }

  // ---- per lane, for the whole block ----------------------------------------
  struct QFrags {
    uint2 r[kQInRegisters ? kKSteps : 1][kNT];
  };
  __device__ uint2 query_fragment(const QFrags& q, int ks, int nt) const {
    if constexpr (kQInRegisters) return q.r[ks][nt];
    else return s.qfrag[(ks * kNT + nt) * 32 + th.lane];
  }

  struct Lane {
    int g, c;
    uint32_t kscol[kKGroups];  // K: scale-row offsets of the lane's groups (word 2q and 2q + 1: group q)
    uint32_t vscol[kVGroups];  // V: of the lane's groups (elements 16q .. 16q + 15 of its D / 8)
    float rs[kNT][2];          // logit multipliers of heads 8 nt + 2c and 8 nt + 2c + 1
  };
  __device__ Lane lane_constants(QFrags& q) const {
    Lane l;
    l.g = th.lane >> 2, l.c = th.lane & 3;
    if constexpr (KFormat::kBlockScales)
#pragma unroll
      for (int k = 0; k < kKGroups; ++k) l.kscol[k] = s.kscale_col[word_offset<kD>(l.c, 2 * k) / 8];
    if constexpr (VFormat::kBlockScales)
#pragma unroll
      for (int k = 0; k < kVGroups; ++k) l.vscol[k] = s.vscale_col[l.g * kE / 16 + k];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) l.rs[nt][0] = s.row_scale[8 * nt + 2 * l.c], l.rs[nt][1] = s.row_scale[8 * nt + 2 * l.c + 1];
    if constexpr (kQInRegisters) {
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) q.r[ks][nt] = s.qfrag[(ks * kNT + nt) * 32 + th.lane];
    }
    return l;
  }

  // ---- one tile of 16 tokens -------------------------------------------------
  // O^T (rows: D in the lane-owned order, columns: query heads) as m16n8 tiles.
  struct State {
    float o[kNT][kMTiles][4];
    float m[kNT][2], l[kNT][2];  // running max and the lane's partial sum of heads 8 nt + 2c + h
  };

  __device__ bool token_valid(int i, const StageMask& mk) const {
    return i >= mk.lo && i < mk.hi && ((mk.ok >> s.slot_of[i]) & 1ull) != 0;
  }

  template <int kBytes>
  __device__ static void load_words(const uint8_t* at, uint32_t* w) {
    if constexpr (kBytes == 4) {
      w[0] = *reinterpret_cast<const uint32_t*>(at);
    } else if constexpr (kBytes == 8) {
      const uint2 v = *reinterpret_cast<const uint2*>(at);
      w[0] = v.x, w[1] = v.y;
    } else {
      const uint4 v = *reinterpret_cast<const uint4*>(at);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    }
  }

  // S = K Q^T for the tile at `first`: this lane's K rows are tokens g and g + 8.
  __device__ void scores(const Lane& ln, const QFrags& qf, const uint8_t* st, int first, float (&sacc)[kNT][4]) const {
    const int c = ln.c, g = ln.g;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) sacc[nt][0] = sacc[nt][1] = sacc[nt][2] = sacc[nt][3] = 0.0f;
    const uint2 r0 = s.krow[first + g], r1 = s.krow[first + g + 8];
    // Group w (8 elements) of the lane at kKW words from w * kKW: an FP8 row has twice the
    // bytes of an NVFP4 one, in the same element order (byte offsets times kKW).
    uint32_t w0[kWords * kKW], w1[kWords * kKW];
    if constexpr (kD == 64) {
      load_words<8 * kKW>(st + r0.x + kKW * word_offset<kD>(c, 0), w0);
      load_words<8 * kKW>(st + r1.x + kKW * word_offset<kD>(c, 0), w1);
    } else {
#pragma unroll
      for (int k = 0; k < kWords / 4; ++k)
#pragma unroll
        for (int h = 0; h < kKW; ++h) {
          load_words<16>(st + r0.x + kKW * word_offset<kD>(c, 4 * k) + 16 * h, w0 + kKW * 4 * k + 4 * h);
          load_words<16>(st + r1.x + kKW * word_offset<kD>(c, 4 * k) + 16 * h, w1 + kKW * 4 * k + 4 * h);
        }
    }
    // Both rows' scales of a group in one conversion; each product takes its half
    // by the HMUL2 operand select (.H0_H0 / .H1_H1), at no cost.
    uint32_t sc[kKGroups];  // (token g's scale, token g + 8's) per group
    if constexpr (KFormat::kBlockScales)
#pragma unroll
      for (int k = 0; k < kKGroups; ++k) sc[k] = KFormat::scale_pair2(st[r0.y + ln.kscol[k]], st[r1.y + ln.kscol[k]]);
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      uint32_t a[4], b[4];
      KFormat::place8(w0 + kKW * w, a);
      KFormat::place8(w1 + kKW * w, b);
      if constexpr (KFormat::kBlockScales)
#pragma unroll
        for (int k = 0; k < 4; ++k) a[k] = attention::hmul2_lo(a[k], sc[w / 2]), b[k] = attention::hmul2_hi(b[k], sc[w / 2]);
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          const uint2 q = query_fragment(qf, 2 * w + u, nt);
          mma_16816(sacc[nt], a[2 * u], b[2 * u], a[2 * u + 1], b[2 * u + 1], q.x, q.y);
        }
    }
  }

  // O^T += V^T P^T for the tile at `first`: this lane's V columns are tokens 2c,
  // 2c + 1, 2c + 8, 2c + 9, its rows elements g * D / 8 + 2 mt (row g of tile mt)
  // and + 1 (row g + 8).
  __device__ void accumulate_v(const Lane& ln, const uint8_t* st, int first, bool full, const StageMask& mk,
                               const uint32_t (&pt)[kNT][2], State& state) const {
    const int g = ln.g, c = ln.c;
    const int t0 = first + 2 * c;
    const uint2 r[4] = {s.vrow[t0], s.vrow[t0 + 1], s.vrow[t0 + 8], s.vrow[t0 + 9]};
    // The lane's kE elements of a token: kE / 2 bytes of NVFP4, kE of FP8 (two loads at D 256).
    constexpr int kRowBytes = kE / 2 * kVW;
    uint32_t dw[4][kVWords * kVW];
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int h = 0; h < (kRowBytes + 15) / 16; ++h)
        load_words<(kRowBytes < 16 ? kRowBytes : 16)>(st + r[k].x + g * kRowBytes + 16 * h, dw[k] + 4 * h);
    bool live[4] = {true, true, true, true};
    if (!full) {
      live[0] = token_valid(t0, mk), live[1] = token_valid(t0 + 1, mk);
      live[2] = token_valid(t0 + 8, mk), live[3] = token_valid(t0 + 9, mk);
    }
    // Tokens that do not count contribute zeros (their P is 0, but their bytes may be
    // anything, NaN included): NVFP4 by a zero block scale, FP8 by zero data words.
    uint32_t sp[2][kVGroups];  // block scales of (2c, 2c + 1) and (2c + 8, 2c + 9)
    if constexpr (VFormat::kBlockScales) {
#pragma unroll
      for (int q = 0; q < kVGroups; ++q) {
        uint32_t b[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) b[k] = live[k] ? uint32_t(st[r[k].y + ln.vscol[q]]) : 0u;
        sp[0][q] = VFormat::scale_pair2(b[0], b[1]);
        sp[1][q] = VFormat::scale_pair2(b[2], b[3]);
      }
    } else if (!full) {
#pragma unroll
      for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int i = 0; i < kVWords * kVW; ++i) dw[k][i] = live[k] ? dw[k][i] : 0u;
    }
#pragma unroll
    for (int j = 0; j < kVWords; ++j) {  // elements 8j .. 8j + 7 of the lane's
      uint32_t A[2][4], B[2][4];  // element 8j + 4h + k of (2c, 2c + 1) and of (2c + 8, 2c + 9)
      VFormat::place_pairs(dw[0] + kVW * j, dw[1] + kVW * j, A);
      VFormat::place_pairs(dw[2] + kVW * j, dw[3] + kVW * j, B);
      if constexpr (VFormat::kBlockScales)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int k = 0; k < 4; ++k) A[h][k] = hmul2(A[h][k], sp[0][j / 2]), B[h][k] = hmul2(B[h][k], sp[1][j / 2]);
#pragma unroll
      for (int i = 0; i < 4; ++i)  // tile 4j + i: elements 8j + 2i (row g) and 8j + 2i + 1 (row g + 8)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
          mma_16816(state.o[nt][4 * j + i], A[i / 2][2 * (i % 2)], A[i / 2][2 * (i % 2) + 1], B[i / 2][2 * (i % 2)],
                    B[i / 2][2 * (i % 2) + 1], pt[nt][0], pt[nt][1]);
    }
  }

  // kCount tiles of this warp (1, or 2 at D 64): their scores, one online-softmax
  // update over all their tokens (one max reduction, one rescale of O), then their
  // V products. Two tiles at once also give the scheduler two independent chains
  // through the softmax's shuffles.
  template <int kCount>
  __device__ void take_tiles(const Lane& ln, const QFrags& qf, const uint8_t* st, const int (&first)[kCount],
                             const StageMask& mk, State& state, const Logits& logits) const {
    const int g = ln.g;
    float sacc[kCount][kNT][4];
    bool full[kCount];
#pragma unroll
    for (int i = 0; i < kCount; ++i) {
      if constexpr (kShort) full[i] = mk.all_ok && first[i] >= mk.lo_all && first[i] + kTile <= mk.hi_all;
      else full[i] = mk.all_ok && first[i] >= mk.lo && first[i] + kTile <= mk.hi;
      scores(ln, qf, st, first[i], sacc[i]);
    }

    // Logits in base 2, masked; the online softmax of each head; P^T by transposes.
    uint32_t pt[kCount][kNT][2];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      float x[kCount][4];
#pragma unroll
      for (int i = 0; i < kCount; ++i) {
        const bool v0 = full[i] || token_valid(first[i] + g, mk), v1 = full[i] || token_valid(first[i] + g + 8, mk);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          // K smoothing's q . mu joins each logit before a soft-cap (read from shared memory
          // per tile: as two more lane registers the soft-cap instances spilled); without a
          // soft-cap it is a shift of the row, added once when the row is finished.
          float y;
          if constexpr (kSoftcap && kSteps)
            y = logits(fmaf(sacc[i][nt][k], ln.rs[nt][k & 1], s.row_bias[8 * nt + 2 * ln.c + (k & 1)]));
          else y = logits(sacc[i][nt][k] * ln.rs[nt][k & 1]);
          bool v = k < 2 ? v0 : v1;
          if constexpr (kShort)  // row 8 nt + 2c + (k & 1), token g or g + 8 of the tile
            if (!full[i]) v = v && row_sees(8 * nt + 2 * ln.c + (k & 1), first[i] + g + (k < 2 ? 0 : 8), mk);
          x[i][k] = v ? y : kNegInf;
        }
      }
      float alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = fmaxf(x[0][h], x[0][h + 2]);
#pragma unroll
        for (int i = 1; i < kCount; ++i) mx = fmaxf(mx, fmaxf(x[i][h], x[i][h + 2]));
        mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 16));
        const float m_new = fmaxf(state.m[nt][h], mx);
        const attention::Rebase rb = attention::rebase(state.m[nt][h], m_new);
        alpha[h] = rb.alpha;
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < kCount; ++i) {
          x[i][h] = fast_exp2(x[i][h] - rb.m_use);
          x[i][h + 2] = fast_exp2(x[i][h + 2] - rb.m_use);
          sum += x[i][h] + x[i][h + 2];
        }
        state.l[nt][h] = state.l[nt][h] * alpha[h] + sum;
        state.m[nt][h] = m_new;
      }
      if (__any_sync(0xFFFFFFFFu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          state.o[nt][mt][0] *= alpha[0], state.o[nt][mt][1] *= alpha[1];
          state.o[nt][mt][2] *= alpha[0], state.o[nt][mt][3] *= alpha[1];
        }
      }
#pragma unroll
      for (int i = 0; i < kCount; ++i) {
        pt[i][nt][0] = transpose_8x8(pack_half2(x[i][0], x[i][1]));  // tokens 2c, 2c + 1 of head g
        pt[i][nt][1] = transpose_8x8(pack_half2(x[i][2], x[i][3]));  // tokens 2c + 8, 2c + 9
      }
    }
#pragma unroll
    for (int i = 0; i < kCount; ++i) accumulate_v(ln, st, first[i], full[i], mk, pt[i], state);
  }
};

// The split workspace of a decode call: partials per (sequence, split, kv head,
// block row), a ticket per (sequence, kv head) (core/decode_plan.hpp).
inline __device__ attention::SplitWorkspace split_workspace(const DecodeParams& p) {
  const DecodeArgs& a = p.args;
  return attention::SplitWorkspace::at(a.workspace, a.batch.batch * a.q_heads * p.geometry.queries, p.geometry.splits,
                                       a.batch.batch * p.layout.dims().heads, p.geometry.head_dim);
}

// The short-query route's sequences with a bad q length (negative, above max_q_len
// or above the kv length): every row of the sequence NaN, as prefill marks them,
// written by the split-0 block of each kv head.
template <ElementType kType>
__device__ void poison_rows(const DecodeParams& p, const DecodeThread& th, int64_t q_row0, int64_t q_len) {
  const DecodeArgs& a = p.args;
  const int64_t group = p.geometry.group, dim = p.layout.dims().head_dim;
  const uint16_t nan = attention::to_half_bits<kType>(attention::quiet_nan());
  for (int64_t u = th.tid; u < q_len * group * dim; u += kThreads) {
    const int64_t row = q_row0 + u / (group * dim), head = th.kv_head * group + (u / dim) % group, col = u % dim;
    static_cast<uint16_t*>(a.out)[(row * a.q_heads + head) * dim + col] = nan;
    if (a.lse && col == 0) a.lse[row * a.q_heads + head] = attention::quiet_nan();
  }
}

template <int kD, int kGroupRows, ElementType kType, bool kSoftcap, bool kShort, bool kSteps, class Formats>
__device__ void decode_device(const DecodeParams& p, char* smem_raw, const DecodeThread& th) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Block = DecodeBlock<kD, kGroupRows, kType, kSoftcap, kShort, kSteps, Formats>;
  constexpr int kNT = Block::kNT, kMTiles = Block::kMTiles, kE = Block::kE;
  const DecodeGeometry& g = p.geometry;
  const DecodeArgs& a = p.args;
  const CacheDims& d = p.layout.dims();
  const int64_t n = d.tokens_per_page;
  Smem s;
  carve<kD>(smem_raw, g, n, &s, kSteps);
  // The block's span of its sequence.
  const SequenceLength len = sequence_length(a.batch, th.seq, n);
  // The sequence's query tokens: one (decode), or q_len rows from cu_q (short-query
  // route), whose bad lengths are counted and marked as prefill's are.
  int64_t q_row0 = th.seq, q_len = 1;
  bool bad_q = false;
  if constexpr (kShort) {
    q_row0 = p.cu_q[th.seq];
    q_len = int64_t(p.cu_q[th.seq + 1]) - q_row0;
    bad_q = q_len < 0 || q_len > g.queries || (!len.bad && q_len > len.tokens);
  }
  Span span;
  span.length = len.tokens;
  span.bad_length = len.bad;
  span.window_start = attention::window_start(span.length - q_len, a.window);  // the first query's window
  span.first = max(th.split * g.entries_per_split, span.window_start / n);
  span.last = min((th.split + 1) * g.entries_per_split, (span.length + n - 1) / n);
  const float kgs = *a.k_global_scale, vgs = *a.v_global_scale;
  const bool scales_ok = global_scale_usable(kgs) && global_scale_usable(vgs);
  const bool counter = th.tid == 0 && th.kv_head == 0 && th.split == 0;
  if (counter && a.status && (len.bad || bad_q)) atomicAdd(&a.status->bad_lengths, 1ull);
  if constexpr (kShort)
    if (q_len <= 0) return;  // nothing to compute, nothing read (every thread of the block alike)
  if (counter && a.status && !scales_ok) atomicAdd(&a.status->bad_global_scale, (unsigned long long)span.length);
  if constexpr (kShort)
    if (bad_q) {
      if (th.split == 0) poison_rows<kType>(p, th, q_row0, q_len);
      return;
    }
  if (!scales_ok || len.bad) span.last = span.first;  // read nothing; the outputs become NaN below

  const int stage_tokens = g.pages_per_stage * int(n);
  const Block block{p, s, th, span, n, stage_tokens, (stage_tokens + kTile - 1) / kTile, q_row0, int(q_len) * g.group};
  const int stages = span.last > span.first ? int((span.last - span.first + g.pages_per_stage - 1) / g.pages_per_stage) : 0;

  if (th.tid == 0) {
    s.flags[0] = 0;
    // Dense modes: the producer's one arrival carries the stage's bytes; row mode:
    // two per producer lane (issue). Empty: every consumer thread once it has read
    // the slot (each its own release, no warp-level ordering assumed).
    for (int i = 0; i < g.stages; ++i) {
      barrier_init(&s.full[i], g.dense || g.tensor_rows ? 1 : 64);
      barrier_init(&s.empty[i], kConsumerThreads);
    }
    barrier_init_fence();
  }
  if (th.tid < kRegionCount) {
    const Region r = Region(th.tid);
    s.plane_base[th.tid] = p.cache.ptr[p.layout.region(r).buffer] + p.layout.tile(r, a.layer, 0, th.kv_head).base;
  }
  __syncthreads();  // flags zeroed before load_pages may set them; barriers ready
  // Row mode leaves a canonical plane's padding (columns past D) untouched: zero it once.
  if (!g.dense && !g.tensor_rows)
    for (size_t i = th.tid * 16; i < size_t(g.stages) * g.pages_per_stage * g.slot_bytes; i += kThreads * 16)
      *reinterpret_cast<uint4*>(s.stage + i) = make_uint4(0, 0, 0, 0);
  block.load_pages();
  __syncthreads();  // page ids (and row mode's zeroed stages) in place

  // From here the producer warp and the consumer warps run apart, meeting only at
  // block barriers every thread takes (no named barriers): the producer issues the
  // first stages at once (their slots are free), so they land while the consumers
  // prepare the tables and the query, then joins those two barriers and goes on
  // issuing as slots are released. Stage j goes to slot j % stages; a slot's
  // barriers flip phase at each reuse.
  const int stage_bytes = g.pages_per_stage * g.slot_bytes;
  const bool producer = th.warp == kProducerWarp;
  if (producer)
    for (int j = 0; j < min(stages, g.stages); ++j) block.issue(j, j);
  else {
    block.build_tables();
    block.load_query(kgs);
    if constexpr (kShort) block.row_bounds(q_len);
  }
  __syncthreads();
  if (!producer) block.store_query_fragments();
  __syncthreads();
  if (producer) {
    for (int j = g.stages, slot = 0, phase = 0; j < stages; ++j) {
      barrier_wait_bounded(&s.empty[slot], phase);  // the consumers of stage j - stages are done
      block.issue(j, slot);
      if (++slot == g.stages) slot = 0, phase ^= 1;
    }
    // And of the stages still in flight, with the same bound: a stage that never lands
    // (its copies short of the bytes its barrier expects) keeps the consumers waiting
    // for good, and this wait turns that into a trap instead of a hung kernel.
    for (int j = max(stages - g.stages, 0); j < stages; ++j) barrier_wait_bounded(&s.empty[j % g.stages], (j / g.stages) & 1);
    // Every consumer is done with the stages: one block-wide barrier (id 0, all
    // threads) that the producer and the consumers reach from their own branches,
    // in its non-aligned form (sync_threads).
    sync_threads(0, kThreads);  // the consumers' barrier below, from this branch
  } else {
    typename Block::QFrags qf;
    const typename Block::Lane ln = block.lane_constants(qf);
    typename Block::State state;
    const typename Block::Logits logits = Block::Logits::make(a.softcap);
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) state.o[nt][mt][0] = state.o[nt][mt][1] = state.o[nt][mt][2] = state.o[nt][mt][3] = 0.0f;
      state.m[nt][0] = state.m[nt][1] = kNegInf;
      state.l[nt][0] = state.l[nt][1] = 0.0f;
    }
    const unsigned long long all_pages = g.pages_per_stage >= 64 ? ~0ull : (1ull << g.pages_per_stage) - 1;

    // The span's token bounds relative to its first entry's first token, in 32 bits.
    const int64_t base = span.first * n;
    const int rel_lo = clamp_rel(span.window_start - base), rel_hi = clamp_rel(span.length - base);
    // Short-query route: what every row sees, the last query's window start to the
    // first query's position.
    const int rel_lo_all = clamp_rel(attention::window_start(span.length - 1, a.window) - base);
    const int rel_hi_all = clamp_rel(span.length - q_len + 1 - base);
    int slot = 0;
    unsigned phase = 0;
    for (int j = 0; j < stages; ++j) {
      barrier_wait(&s.full[slot], phase);  // the stage's bytes and page_ok
      const uint8_t* st = s.stage + slot * stage_bytes;
      const int t0 = j * block.stage_tokens;
      StageMask mk;
      mk.lo = min(max(rel_lo - t0, 0), block.stage_tokens);
      mk.hi = min(max(rel_hi - t0, 0), block.stage_tokens);
      mk.ok = s.page_ok[slot];
      mk.all_ok = mk.ok == all_pages;
      if constexpr (kShort) {
        mk.lo_all = min(max(rel_lo_all - t0, 0), block.stage_tokens);
        mk.hi_all = min(max(rel_hi_all - t0, 0), block.stage_tokens);
        mk.t0 = t0;
      }
      // At D 64 a warp takes its tiles in pairs (one softmax update per 32 tokens:
      // -3.5 % there, run 29); at D 128 pairs measured no gain and a larger loop body.
      int t = th.warp;
      if constexpr (kD <= 64) {
        for (; t + kConsumerWarps < block.tiles; t += 2 * kConsumerWarps) {
          const int first[2] = {t * kTile, (t + kConsumerWarps) * kTile};
          block.template take_tiles<2>(ln, qf, st, first, mk, state, logits);
        }
      }
      for (; t < block.tiles; t += kConsumerWarps) {
        const int first[1] = {t * kTile};
        block.template take_tiles<1>(ln, qf, st, first, mk, state, logits);
      }
      barrier_arrive(&s.empty[slot]);  // this thread's reads of the slot are done
      if (++slot == g.stages) slot = 0, phase ^= 1;
    }


    // Combine the warps: (max, sum, O) of each query row, in the stage area, once
    // every consumer is done with the stages (every stage issued was consumed, so
    // no copy is in flight).
    sync_threads(0, kThreads);
    float* cm = reinterpret_cast<float*>(s.stage);  // (consumer warps, 16)
    float* cl = cm + kConsumerWarps * 16;           // (consumer warps, 16)
    float* co = cl + kConsumerWarps * 16;           // (consumer warps, 16, D)
    const int gr = ln.g, c = ln.c;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float l = state.l[nt][h];
        l += __shfl_xor_sync(0xFFFFFFFFu, l, 4);
        l += __shfl_xor_sync(0xFFFFFFFFu, l, 8);
        l += __shfl_xor_sync(0xFFFFFFFFu, l, 16);
        const int row = 8 * nt + 2 * c + h;
        if (gr == 0) cm[th.warp * 16 + row] = state.m[nt][h], cl[th.warp * 16 + row] = l;
      }
      // Lane (g, c) holds O^T rows g * D / 8 + 2 mt (+ 1) for heads 8 nt + 2c (+ 1).
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int row = 8 * nt + 2 * c + (k & 1);
          const int col = gr * kE + 2 * mt + (k >> 1);
          co[(th.warp * 16 + row) * kD + col] = state.o[nt][mt][k];
        }
    }
  }
  __syncthreads();  // the producer joins: every warp's partial state is in place
  float* const cm = reinterpret_cast<float*>(s.stage);
  float* const cl = cm + kConsumerWarps * 16;
  float* const co = reinterpret_cast<float*>(s.stage) + 2 * kConsumerWarps * 16;
  const bool poisoned = !scales_ok || span.bad_length || s.flags[0] != 0;
  const int group = g.group;
  const float nan = attention::quiet_nan();
  const float out_scale = Block::VFormat::kUndo * vgs;  // undo V's placement (NVFP4: 2^-14); V's global scale
  // The combined O at (row, col), with the row's maximum and sum. Without the format's steps
  // every element rebases its row's parts itself (the row pass below and its barrier cost
  // plain caches about 1 % at D 64 and 128, run 66).
  const auto combine = [&](int row, int col, float& mx, float& l) {
    mx = kNegInf;
    for (int w = 0; w < kConsumerWarps; ++w) mx = fmaxf(mx, cm[w * 16 + row]);
    l = 0;
    float o = 0;
    if (mx != kNegInf)
      for (int w = 0; w < kConsumerWarps; ++w) {
        const float f = exp2f(cm[w * 16 + row] - mx);
        l += cl[w * 16 + row] * f;
        o += co[(w * 16 + row) * kD + col] * f;
      }
    return o;
  };
  // With them, each row's parts are rebased once per row by one thread, in place: cm[w][row]
  // becomes warp w's factor exp2(max_w - max), cl[0][row] the row's sum and cl[1][row] its
  // maximum (rows are at most 16), K smoothing's q . mu added: without a soft-cap a shift of
  // every logit of the row, so of its maximum (under one it joined each logit). Then V's
  // rotation is undone once per row on the combined O, into warp 0's slice in place (each
  // element read and written by one lane): a warp per row, lane l on columns l + 32 k, the
  // query step's butterflies (attention/query.cuh) in the writer's order, float32; linear, so
  // a split's partial may be taken back before the merge. (Done by every element as above,
  // the rotated rows needed a second combine and a block barrier per butterfly span: rotate-v
  // cost +18.7 % at 1 x 32K, D 128, where this costs +7.4 %, run 66.)
  static_assert(kConsumerWarps >= 2, "the combine keeps a row's sum and maximum in warps 0 and 1's slots");
  const int v_rotation = kSteps ? p.format.v.rotation : 0;
  const auto rebased = [&](int row, int col) {
    float o = 0;
    if (cl[16 + row] != kNegInf)
      for (int w = 0; w < kConsumerWarps; ++w) o += co[(w * 16 + row) * kD + col] * cm[w * 16 + row];
    return o;
  };
  if constexpr (kSteps) {
    for (int row = th.tid; row < block.rows; row += kThreads) {
      float mx = kNegInf;
      for (int w = 0; w < kConsumerWarps; ++w) mx = fmaxf(mx, cm[w * 16 + row]);
      float l = 0;
      for (int w = 0; w < kConsumerWarps; ++w) {
        const float f = mx != kNegInf ? exp2f(cm[w * 16 + row] - mx) : 0.0f;
        l += cl[w * 16 + row] * f;
        cm[w * 16 + row] = f;
      }
      if constexpr (!kSoftcap)
        if (mx != kNegInf) mx += s.row_bias[row];
      cl[row] = l;
      cl[16 + row] = mx;
    }
    __syncthreads();
    if (v_rotation > 0) {
      for (int row = th.warp; row < block.rows; row += kThreads / 32) {
        attention::SpreadRow<kD> o;
#pragma unroll
        for (int k = 0; k < kD / 32; ++k) o.v[k] = rebased(row, th.lane + 32 * k);
        o = attention::rotated_spread_row<kD>(o, v_rotation, th.lane);
#pragma unroll
        for (int k = 0; k < kD / 32; ++k) co[row * kD + th.lane + 32 * k] = o.v[k];
      }
      __syncthreads();
    }
  }
  // Row r of the block: query row q_row0 + r / group, head r % group of the kv head's group.
  for (int idx = th.tid; idx < block.rows * d.head_dim; idx += kThreads) {
    const int row = idx / int(d.head_dim), col = idx % int(d.head_dim);
    float mx, l, o;
    if constexpr (kSteps) {
      l = cl[row], mx = cl[16 + row];
      o = v_rotation > 0 ? co[row * kD + col] : rebased(row, col);
    } else {
      o = combine(row, col, mx, l);
    }
    const int64_t head = th.kv_head * group + row % group, q_row = q_row0 + row / group;
    if (g.splits == 1) {
      const attention::RowTotal t = attention::finish_row(mx, l, attention::sink_logit2(a.sinks, head));
      float value = t.total > 0 ? o * t.factor / t.total * out_scale : 0.0f;
      float lse = t.lse;
      if (poisoned) value = lse = nan;
      uint16_t* out = static_cast<uint16_t*>(a.out) + (q_row * a.q_heads + head) * d.head_dim + col;
      *out = attention::to_half_bits<kType>(value);
      if (a.lse && col == 0) a.lse[q_row * a.q_heads + head] = lse;
    } else {
      // A partial: O / l and log2(l) + max, per (sequence, split, kv head, block row).
      const attention::SplitWorkspace w = split_workspace(p);
      const int64_t part = ((th.seq * g.splits + th.split) * d.heads + th.kv_head) * g.rows + row;
      w.partial[part * kD + col] = poisoned ? nan : (l > 0 ? o / l : 0.0f);
      if (col == 0) w.lse2[part] = poisoned ? nan : (l > 0 ? mx + log2f(l) : kNegInf);
    }
  }
  if (g.splits == 1) return;
  // The split that finishes last merges its group's heads (the partials of every
  // split are written and fenced before each counts itself finished).
  __threadfence();
  __syncthreads();  // every thread's partials written and fenced; the combine area is free
  const attention::SplitWorkspace w = split_workspace(p);
  int* last = s.flags + 1;
  if (th.tid == 0) *last = attention::finish_split(&w.tickets[th.seq * d.heads + th.kv_head], g.splits);
  __syncthreads();
  if (!*last) return;
  __threadfence();  // the other splits' partials, seen through their fences
  Carve c;
  attention::MergeSmem m;
  char* area = reinterpret_cast<char*>(s.stage);  // (splits + 3) x rows words: at most 17 KB
  m.weight = c.take<float>(area, size_t(g.splits) * block.rows);
  m.total = c.take<float>(area, block.rows);
  m.m_all = c.take<float>(area, block.rows);
  m.nan = c.take<int>(area, block.rows);
  const int64_t head0 = th.kv_head * group;
  attention::MergeJob job;
  job.row0 = (th.seq * g.splits * d.heads + th.kv_head) * g.rows;
  job.split_stride = d.heads * g.rows;
  job.rows = block.rows;
  job.splits = g.splits;
  job.dim = int(d.head_dim);
  job.partial_dim = kD;
  job.out = static_cast<uint16_t*>(a.out) + (q_row0 * a.q_heads + head0) * d.head_dim;
  job.out_stride = d.head_dim;
  job.per_token = group;
  job.token_out_stride = a.q_heads * d.head_dim;
  job.lse = a.lse ? a.lse + q_row0 * a.q_heads + head0 : nullptr;
  job.token_lse_stride = a.q_heads;
  job.sinks = a.sinks ? a.sinks + head0 : nullptr;
  job.out_scale = out_scale;
  attention::merge_rows<kThreads, kType>(w, job, m, th.tid);
#endif
}


// The registers by __launch_bounds__: 96 for two blocks of 9 warps per SM (registers
// are allocated for warps in pairs, so 112 with __maxnreg__ left one block per SM
// and 220 at D 256 / group 16 could not launch: run 32).
template <int kD, int kGroupRows, ElementType kType, bool kSoftcap, bool kShort, bool kSteps, class Formats>
__global__ void __launch_bounds__(kThreads, decode_blocks_per_sm(kD, kGroupRows)) decode_kernel(const __grid_constant__ DecodeParams p) {
#if NVFP4KV_KERNEL_ARCH_SUPPORTED
  extern __shared__ __align__(128) char smem[];
  const DecodeThread th{int(threadIdx.x), int(threadIdx.x) / 32, int(threadIdx.x) % 32, int64_t(blockIdx.x),
                        int64_t(blockIdx.y), int64_t(blockIdx.z)};
  decode_device<kD, kGroupRows, kType, kSoftcap, kShort, kSteps, Formats>(p, smem, th);
#else
  __trap();  // unreachable: the API refuses devices older than sm_90 (common/arch.hpp)
#endif
}

template <int kD, int kGroupRows, ElementType kType, bool kSoftcap, bool kShort, bool kSteps, class Formats>
cudaError_t launch(const DecodeParams& p, cudaStream_t stream) {
  const auto kernel = decode_kernel<kD, kGroupRows, kType, kSoftcap, kShort, kSteps, Formats>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, p.geometry.smem_bytes);
  if (e != cudaSuccess) return e;
  const dim3 grid{unsigned(p.geometry.splits), unsigned(p.layout.dims().heads), unsigned(p.args.batch.batch)};
  kernel<<<grid, kThreads, p.geometry.smem_bytes, stream>>>(p);
  return cudaGetLastError();
}

// Whether the layout keeps a data byte's codes in the fp16-split order (the native
// layout: decode's placement takes fewer operations); the API lets decode read the
// standard order and this one only.
inline bool split_codes(const LayoutView& layout) { return layout.codes().is_fp16_split(); }

// The dequantize parts of K and V (attention/dequant.cuh) as one template argument.
template <class KFormat, class VFormat>
struct SideFormats {
  using K = KFormat;
  using V = VFormat;
};

// Runs op.run<kD, kGroupRows, kType, kSoftcap, kShort, kSteps, Formats>() for the call's rows
// (decode_instance_rows), type, soft-cap, route, format steps (p.format_steps, the layout's
// format as the planner saw it), element formats and code order at head dim kD; the
// short-query route has instances of 16 rows only.
template <int kD, typename Op>
cudaError_t dispatch_dim(const DecodeParams& p, const Op& op) {
  const bool split = split_codes(p.layout);
  return NVFP4KV_DISPATCH_HALF_TYPE(p.args.q_type, kType, [&] {
    return NVFP4KV_DISPATCH_SOFTCAP(p.args.softcap > 0, kSoftcap, [&] {
      const auto with = [&](auto formats, auto steps) {
        using Formats = decltype(formats);
        constexpr bool kSteps = decltype(steps)::value;
        if (p.geometry.queries > 1) return op.template run<kD, 16, kType, kSoftcap, true, kSteps, Formats>();
        return NVFP4KV_DISPATCH_GROUP_ROWS(decode_instance_rows(p.geometry), kGroupRows, [&] {
          return op.template run<kD, kGroupRows, kType, kSoftcap, false, kSteps, Formats>();
        });
      };
      const auto with_steps = [&](auto formats) {
        return p.format_steps ? with(formats, std::true_type{}) : with(formats, std::false_type{});
      };
      // Each side's element format; an NVFP4 side in the layout's code order. A layout that
      // holds FP8 has instances with the steps only (the API sets format_steps for it) and,
      // beside NVFP4, for the fp16-split order only (the native layouts'; the API refuses
      // the other before a launch).
      using attention::Fp8E4m3Fp16, attention::Nvfp4Fp16, attention::Nvfp4Fp16Split;
      const CacheDims& d = p.layout.dims();
      if (d.fp8(Side::kK) && d.fp8(Side::kV)) return with(SideFormats<Fp8E4m3Fp16, Fp8E4m3Fp16>{}, std::true_type{});
      if (d.fp8(Side::kK)) return with(SideFormats<Fp8E4m3Fp16, Nvfp4Fp16Split>{}, std::true_type{});
      if (d.fp8(Side::kV)) return with(SideFormats<Nvfp4Fp16Split, Fp8E4m3Fp16>{}, std::true_type{});
      return split ? with_steps(SideFormats<Nvfp4Fp16Split, Nvfp4Fp16Split>{}) : with_steps(SideFormats<Nvfp4Fp16, Nvfp4Fp16>{});
    });
  });
}

struct LaunchOp {
  const DecodeParams& p;
  cudaStream_t stream;
  template <int kD, int kGroupRows, ElementType kType, bool kSoftcap, bool kShort, bool kSteps, class Formats>
  cudaError_t run() const {
    return launch<kD, kGroupRows, kType, kSoftcap, kShort, kSteps, Formats>(p, stream);
  }
};

// Blocks of the instance that fit on one SM at the geometry's shared memory.
struct OccupancyOp {
  const DecodeGeometry& g;
  int* per_sm;
  template <int kD, int kGroupRows, ElementType kType, bool kSoftcap, bool kShort, bool kSteps, class Formats>
  cudaError_t run() const {
    const auto kernel = decode_kernel<kD, kGroupRows, kType, kSoftcap, kShort, kSteps, Formats>;
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, g.smem_bytes);
    if (e != cudaSuccess) return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(per_sm, kernel, kThreads, g.smem_bytes);
  }
};

template <int kD>
cudaError_t launch_dim(const DecodeParams& p, cudaStream_t stream) {
  return dispatch_dim<kD>(p, LaunchOp{p, stream});
}

template <int kD>
cudaError_t occupancy_dim(const DecodeParams& p, int* per_sm) {
  return dispatch_dim<kD>(p, OccupancyOp{p.geometry, per_sm});
}

}  // namespace nvfp4kv::kernels::decode
