// Paged prefill / extend attention over the NVFP4 cache (warp-specialized; wgmma on sm_90a at
// D <= 128, mma.sync elsewhere).
//
// A thread block owns (query tile, kv head, sequence): tokens_per_tile new tokens
// of one sequence times the query heads of one GQA group, as up to 128 rows (row r:
// token r / group, head r % group), so each dequantized K/V element serves every
// head of the group and 128 rows. It walks the kv tokens its rows attend to in
// tiles of 64 through a ring of stages in shared memory, with two roles that meet
// only on a full and an empty barrier per stage:
//  - two producer warpgroups dequantize each tile into a stage: each thread holds its
//    share of the next tile's raw bytes in registers (data words and block scales of
//    (token, 16-element group) items, read through the validated layout's tile map, so
//    any layout the validator accepts is read; the block-table entries one tile further
//    ahead), and writes K and V as (token, D) FP16 rows (128-byte-swizzled panels for
//    wgmma, padded rows for mma.sync), e2m1 * 2^-14 * block scale
//    (exact; the shared attention/dequant.cuh placement), or for a side the layout holds in
//    FP8 E4M3, e4m3 * 2^-14 (exact: one conversion, one multiply by a power of two whose
//    products FP16 holds, subnormals included), so both sides fold the same 2^-14; tokens
//    outside the rows' range are zeros;
//  - 8 consumer warps own 16 rows each: S = Q K^T, masks (causal, window) only on tiles
//    that need it, the online softmax in base 2, and O += P V with P straight from the S
//    accumulators as A fragments. On sm_90a at D <= 128 they are two warpgroups issuing
//    wgmma from the swizzled tiles (attention/wgmma.cuh), pipelined so that a tile's softmax
//    runs while the previous tile's P V is on the tensor cores; elsewhere mma.sync m16n8k16
//    with Q, K and V fragments by ldmatrix (V's by ldmatrix.trans).
// Global scales, the query's power-of-two prescale and the placement's 2^-14 fold
// into one logit multiplier per row and one output multiplier.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "../attention/dequant.cuh"
#include "../attention/epilogue.cuh"
#include "../attention/mma.cuh"
#include "../attention/options.cuh"
#include "../attention/query.cuh"
#include "../attention/softmax.cuh"
#include "../attention/wgmma.cuh"
#include "../common/device.cuh"
#include "../common/dispatch.cuh"
#include "params.hpp"

namespace nvfp4kv::kernels {
namespace prefill {

using namespace attention;
using prefill_limits::kKvTile, prefill_limits::kPad, prefill_limits::kRows, prefill_limits::kWarps,
    prefill_limits::kConsumerWarps;
constexpr int kThreads = kWarps * 32;
constexpr int kConsumerThreads = kConsumerWarps * 32;  // warps 0-7; the producers are warps 8-15
constexpr int kProducerThreads = kThreads - kConsumerThreads;
using Format = Nvfp4Fp16;  // the query's prescale and the output's 2^14 (both placements share them)

// Whether the consumers run warpgroup MMAs (sm_90a, D <= 128: O's 64 x D accumulator per
// warpgroup fits the consumers' registers) on 128-byte-swizzled tiles (attention/wgmma.cuh),
// or mma.sync with ldmatrix on padded rows (D 256, and the targets without wgmma).
template <int kD>
constexpr bool kWgmmaTiles = NVFP4KV_HAS_WGMMA && kD <= 128;

// The block's shared memory, carved in prefill_smem_bytes' order from the first
// 1024-byte boundary.
template <int kD>
struct Smem {
  static constexpr int kStride = kD + kPad;  // halves between rows of Q, K and V (ldmatrix rows on distinct banks)
  static constexpr int kTileBytes = kKvTile * kStride * 2;
  static_assert(kTileBytes % 1024 == 0 && kRows * kStride * 2 % 1024 == 0, "swizzled panels stay 1024-byte aligned");
  __half* q;          // (kRows, kStride) the rows' queries, prescaled (wgmma: swizzled panels, no padding)
  __half* ring;       // per stage: K then V, (kKvTile, kStride) each
  float* row_scale;   // (kRows) logit multiplier per row (base 2)
  float* row_bias;    // (kRows) per row: softmax_scale * q . mu in base 2, K smoothing's logit term (0 without);
                      // carved only with the format's steps (prefill_smem_bytes counts it always)
  int* flags;         // [0]: a bad page among the sequence's tokens
  uint64_t* full;     // per stage: the producers' stores are in it
  uint64_t* empty;    // per stage: the consumers are done with it
  __device__ __half* k(int slot) const { return ring + size_t(slot) * 2 * kKvTile * kStride; }
  __device__ __half* v(int slot) const { return k(slot) + kKvTile * kStride; }
  __device__ static Smem carve(char* base, int stages, bool row_bias) {
    base += (1024u - (shared_address(base) & 1023u)) & 1023u;
    Smem s;
    s.q = reinterpret_cast<__half*>(base);
    s.ring = s.q + kRows * kStride;
    s.row_scale = reinterpret_cast<float*>(s.ring + size_t(stages) * 2 * kKvTile * kStride);
    s.row_bias = row_bias ? s.row_scale + kRows : nullptr;
    s.flags = reinterpret_cast<int*>(s.row_scale + (row_bias ? 2 : 1) * kRows);
    s.full = reinterpret_cast<uint64_t*>(s.flags + 4);
    s.empty = s.full + stages;
    return s;
  }
};

// What a block owns and the sequence it reads.
struct Block {
  int tid, warp, lane;
  int64_t tile, kv_head, seq;
  int64_t q_len, kv_len, row0;  // row0: the sequence's first query row
  int64_t i0;                   // the block's first query token
  int tokens;                   // its query tokens (<= tokens_per_tile)
  int rows;                     // tokens * group
};

// One producer thread's share of a kv tile: the (token, 16-element group) items of
// both sides for kTokens tokens (token pt / kGroups + k * kTokenStep, group pt %
// kGroups, pt the thread's index among the producers), as raw bytes in registers
// until the tile is dequantized.
// kWords: data words an item may hold, 2 (16 NVFP4 elements) or 4 (16 FP8 elements: the
// producer loop of layouts with an FP8 side).
template <int kD, int kWords_ = 2>
struct TileShare {
  static constexpr int kGroups = kD / 16;
  static constexpr int kTokenStep = kProducerThreads / kGroups;  // 64, 32, 16 at D 64, 128, 256
  static constexpr int kTokens = kKvTile / kTokenStep;           // 1, 2, 4
  static constexpr int kWords = kWords_;
  uint32_t w[2][kTokens][kWords];  // (side, token): the group's data words, standard code order for NVFP4
  uint32_t scale[2][kTokens];      // (side, token): its E4M3 block scale (0 for a token that does not count)
};

// Where this thread's tokens of the tile at kv0 live: their pages (-1 for tokens
// outside [lo, hi)) and their places in them.
template <int kD>
struct TilePages {
  int32_t page[TileShare<kD>::kTokens], token[TileShare<kD>::kTokens];
};
template <int kD>
__device__ __forceinline__ TilePages<kD> tile_pages(const PrefillParams& p, const Block& b, int pt, int64_t kv0,
                                                    int64_t lo, int64_t hi, int page_shift) {
  using T = TileShare<kD>;
  const int64_t n = p.layout.dims().tokens_per_page;
  TilePages<kD> tp;
#pragma unroll
  for (int k = 0; k < T::kTokens; ++k) {
    const int64_t t = kv0 + pt / T::kGroups + k * T::kTokenStep;
    // A shift where the page holds a power of two of tokens (page_shift >= 0), else a
    // 32-bit division where the position allows it (tokens per page are below 2^31).
    const int64_t e = page_shift >= 0 ? t >> page_shift : t <= INT32_MAX ? int64_t(uint32_t(t) / uint32_t(n)) : t / n;
    tp.token[k] = int32_t(t - e * n);
    tp.page[k] = t >= lo && t < hi ? int32_t(page_of(p.args.batch, b.seq, e, p.layout.dims().pages)) : -1;
  }
  return tp;
}

// The bytes of one producer thread's column on (page 0, token 0) of the call's layer
// and kv head: its group's first data byte and its block scale, per side. A tile adds
// only the page and token terms (region_offset is affine in the page and the sum of the
// token's and the column's modes).
struct ColumnBase {
  const uint8_t* data[2];
  const uint8_t* scale[2];
};
// kWords: TileShare's (4 only in the FP8 loop, where an FP8 side's group has 16 data bytes).
template <int kWords>
__device__ __forceinline__ ColumnBase column_base(const PrefillParams& p, const Block& b, int g) {
  ColumnBase cb;
  for (int side = 0; side < 2; ++side) {
    const SideRegions reg = side_regions(side ? Side::kV : Side::kK);
    const TileMap td = p.layout.tile(reg.data, p.args.layer, 0, b.kv_head);
    const TileMap ts = p.layout.tile(reg.scale, p.args.layer, 0, b.kv_head);  // an FP8 side's: never read
    const int bytes = kWords == 4 && p.layout.dims().fp8(side ? Side::kV : Side::kK) ? 16 : 8;  // a group's data bytes
    cb.data[side] = p.cache.ptr[p.layout.region(reg.data).buffer] + td.offset(0, bytes * g);
    cb.scale[side] = p.cache.ptr[p.layout.region(reg.scale).buffer] + ts.offset(0, g);
  }
  return cb;
}

// Whether a group's 16 elements (8 data bytes) of region r take one 8-byte load: a column
// stride of 1 and rows the validator proved 8-byte aligned.
__device__ __forceinline__ bool group_loads(const LayoutView& layout, Region r) {
  return layout.vector_bytes(r) >= 8 && layout.region(r).column.is_plain() && layout.region(r).column.stride == 1;
}

// Whether an FP8 group's 16 elements (16 data bytes) take one 16-byte load.
__device__ __forceinline__ bool fp8_group_loads(const LayoutView& layout, Region r) {
  return layout.vector_bytes(r) >= 16 && layout.region(r).column.is_plain() && layout.region(r).column.stride == 1;
}

// An FP8 group's four data words byte by byte (out of line, as gather_words).
__device__ __noinline__ uint4 gather_fp8_words(const PrefillParams& p, Region r, int64_t page, int64_t token, int g,
                                               int64_t kv_head) {
  const TileMap td = p.layout.tile(r, p.args.layer, page, kv_head);
  const uint8_t* const data = p.cache.ptr[p.layout.region(r).buffer];
  uint32_t w[4] = {0, 0, 0, 0};
  for (int h = 0; h < 4; ++h)
    for (int i = 0; i < 4; ++i) w[h] |= uint32_t(data[td.offset(token, 16 * g + 4 * h + i)]) << (8 * i);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// A group's two data words byte by byte, for layouts whose data rows do not allow an
// 8-byte load of the group (out of line: rare, and it keeps the producer's loop small).
__device__ __noinline__ uint2 gather_words(const PrefillParams& p, Region r, int64_t page, int64_t token, int g,
                                           int64_t kv_head) {
  const TileMap td = p.layout.tile(r, p.args.layer, page, kv_head);
  const uint8_t* const data = p.cache.ptr[p.layout.region(r).buffer];
  uint32_t w[2] = {0, 0};
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 4; ++i) w[h] |= uint32_t(data[td.offset(token, 8 * g + 4 * h + i)]) << (8 * i);
  return make_uint2(w[0], w[1]);
}

// Loads this thread's raw bytes of the tile (where tile_pages put its tokens) into sh:
// a token without a page, and the padded groups past the head dim, read as zeros. kFast:
// the layout's data rows take an 8-byte load per group and every region's token mode is a
// plain stride (producer_loop), else any mode and byte gathers where the rows need them.
template <int kD, bool kFast, int kWords>
__device__ __forceinline__ void fetch_tile(const PrefillParams& p, const Block& b, int pt, const ColumnBase& cb,
                                           const TilePages<kD>& tp, TileShare<kD, kWords>& sh) {
  using T = TileShare<kD, kWords>;
  const int g = pt % T::kGroups;
  const bool column = 16 * g < p.layout.dims().head_dim;
#pragma unroll
  for (int side = 0; side < 2; ++side) {
    const SideRegions reg = side_regions(side ? Side::kV : Side::kK);
    const RegionMap& dm = p.layout.region(reg.data);
    const RegionMap& sm = p.layout.region(reg.scale);
    // An FP8 side (only in the loop with room for it): 16 bytes a group, no scale.
    const bool fp8 = kWords == 4 && p.layout.dims().fp8(side ? Side::kV : Side::kK);
#pragma unroll
    for (int k = 0; k < T::kTokens; ++k) {
#pragma unroll
      for (int i = 0; i < kWords; ++i) sh.w[side][k][i] = 0;
      sh.scale[side][k] = 0;
      if (tp.page[k] < 0 || !column) continue;
      const int64_t page = tp.page[k], token = tp.token[k];
      if constexpr (kWords == 4) {
        if (fp8) {
          const uint4 v = fp8_group_loads(p.layout, reg.data)
                              ? *reinterpret_cast<const uint4*>(cb.data[side] + page * dm.page + dm.token(token))
                              : gather_fp8_words(p, reg.data, page, token, g, b.kv_head);
          sh.w[side][k][0] = v.x, sh.w[side][k][1] = v.y, sh.w[side][k][2] = v.z, sh.w[side][k][3] = v.w;
          continue;
        }
      }
      uint2 v;
      if constexpr (kFast) {  // the page term in 64 bits (page >= 0 here), the token term in 32 (producer_loop)
        const uint64_t pg = uint32_t(tp.page[k]);
        v = *reinterpret_cast<const uint2*>(cb.data[side] + pg * uint64_t(dm.page) +
                                            uint32_t(tp.token[k]) * uint32_t(dm.token.stride));
        sh.scale[side][k] = cb.scale[side][pg * uint64_t(sm.page) + uint32_t(tp.token[k]) * uint32_t(sm.token.stride)];
      } else {
        if (group_loads(p.layout, reg.data))
          v = *reinterpret_cast<const uint2*>(cb.data[side] + page * dm.page + dm.token(token));
        else
          v = gather_words(p, reg.data, page, token, g, b.kv_head);
        sh.scale[side][k] = cb.scale[side][page * sm.page + sm.token(token)];
      }
      sh.w[side][k][0] = v.x, sh.w[side][k][1] = v.y;
    }
  }
}

// Dequantizes this thread's share into stage `slot`'s K and V tiles: each item 16
// FP16 values e2m1 * 2^-14 * block scale in element order (zeros for an item read as zeros).
// kFast: the layout keeps the code order Place places (producer_loop: the standard order with
// Nvfp4Fp16, fp16-split with Nvfp4Fp16Split); else any order, decoded to the standard one.
template <int kD, bool kFast, class Place, int kWords>
__device__ __forceinline__ void store_tile(const PrefillParams& p, const Smem<kD>& s, int pt, int slot,
                                           const TileShare<kD, kWords>& sh) {
  using T = TileShare<kD, kWords>;
  const int g = pt % T::kGroups;
  // The general loop: a layout whose data bytes keep their codes in another order goes back
  // to the standard order first (a bit move per byte, amortized over 128 rows).
  const CodeOrder& codes = p.layout.codes();
  const bool reorder = !kFast && !codes.is_standard();
#pragma unroll
  for (int side = 0; side < 2; ++side)
#pragma unroll
    for (int k = 0; k < T::kTokens; ++k) {
      uint32_t out[8];
      if (kWords == 4 && p.layout.dims().fp8(side ? Side::kV : Side::kK)) {
        // FP8: bytes 2j, 2j + 1 are elements 2j, 2j + 1, one conversion a pair, times 2^-14.
        constexpr uint32_t kBias = 0x04000400u;  // (2^-14, 2^-14) in FP16
#pragma unroll
        for (int j = 0; j < 8; ++j) out[j] = hmul2(Fp8E4m3Fp16::pair(sh.w[side][k][j / 2] >> (16 * (j % 2))), kBias);
      } else {
      const uint32_t sf = Format::scale_pair(sh.scale[side][k]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t w = reorder ? codes.decode_word(sh.w[side][k][h]) : sh.w[side][k][h];
        uint32_t r[4];  // pairs (0, 4), (1, 5), (2, 6), (3, 7) of the word's elements
        Place::place(w, r);
        out[4 * h + 0] = hmul2(__byte_perm(r[0], r[1], 0x5410), sf);  // elements 0, 1
        out[4 * h + 1] = hmul2(__byte_perm(r[2], r[3], 0x5410), sf);  // 2, 3
        out[4 * h + 2] = hmul2(__byte_perm(r[0], r[1], 0x7632), sf);  // 4, 5
        out[4 * h + 3] = hmul2(__byte_perm(r[2], r[3], 0x7632), sf);  // 6, 7
      }
      }
      const int j = pt / T::kGroups + k * T::kTokenStep;
      __half* const tile = side ? s.v(slot) : s.k(slot);
      uint4 *lo, *hi;
      if constexpr (kWgmmaTiles<kD>) {  // columns 16g .. 16g + 7 and 16g + 8 .. 16g + 15 of row j
        lo = reinterpret_cast<uint4*>(reinterpret_cast<char*>(tile) + swizzled_offset(kKvTile, j, 16 * g));
        hi = reinterpret_cast<uint4*>(reinterpret_cast<char*>(tile) + swizzled_offset(kKvTile, j, 16 * g + 8));
      } else {
        lo = reinterpret_cast<uint4*>(tile + j * Smem<kD>::kStride + 16 * g);
        hi = lo + 1;
      }
      *lo = make_uint4(out[0], out[1], out[2], out[3]);
      *hi = make_uint4(out[4], out[5], out[6], out[7]);
    }
}

// The block's query rows, prescaled (attention/query.cuh), and their logit multipliers.
template <int kD, ElementType kType, bool kSteps>
__device__ void load_query(const PrefillParams& p, const Smem<kD>& s, const Block& b, float k_global_scale) {
  const PrefillArgs& a = p.args;
  const int64_t dim = p.layout.dims().head_dim, group = p.geometry.group;
  const int64_t stride = a.q_token_stride ? a.q_token_stride : a.q_heads * dim;
  for (int r = b.warp; r < kRows; r += kConsumerWarps) {
    const int64_t token = b.row0 + b.i0 + r / group, head = b.kv_head * group + r % group;
    const uint16_t* const row = r < b.rows ? static_cast<const uint16_t*>(a.q) + token * stride + head * dim : nullptr;
    // The format's query step: K's rotation applied to the row (inline: an out-of-line call
    // saves and restores registers through local memory, which beside the ring lives in L2;
    // run 66 measured rotate-k 6 % slower than smooth-k at 1 x 8K D 128 with the call), q . mu
    // for K's smoothing and q times K's channel scale (none in the instances without the steps).
    const QueryTransform t = kSteps ? QueryTransform{p.format.k.rotation, p.format.k.mean_row(b.kv_head, dim),
                                                     p.format.k.channel_scale_row(b.kv_head, dim)}
                                    : QueryTransform{};
    float scale, q_mu = 0;
    if constexpr (kWgmmaTiles<kD>) {
      char* const q = reinterpret_cast<char*>(s.q);
      scale = prescale_query_row_to<kD, kType, Format, true>(
          row, dim, b.lane, [q, r](int col, __half v) { *reinterpret_cast<__half*>(q + swizzled_offset(kRows, r, col)) = v; },
          a.softmax_scale * k_global_scale, t, &q_mu);
    } else {
      scale = prescale_query_row<kD, kType, Format, true>(row, dim, b.lane, s.q + r * Smem<kD>::kStride,
                                                    a.softmax_scale * k_global_scale, t, &q_mu);
    }
    if (b.lane == 0) {
      s.row_scale[r] = scale;
      if constexpr (kSteps) s.row_bias[r] = a.softmax_scale * q_mu * kLog2e;
    }
  }
}

// One warp's 16 rows: the online-softmax state and O (16 x D as m16n8 tiles).
template <int kD>
struct WarpState {
  float o[kD / 8][4];
  float m[2], l[2];  // rows g and g + 8: running max, this lane's partial sum
};

// The online softmax of this warp's rows g and g + 8 over a tile's logits (acc: S as
// m16n8 accumulators, n-tile nt holding tokens kv0 + 8 nt ..): logits in base 2, masked
// where kMask says the tile needs it, the rows' running max and sum moved on, acc left
// holding the probabilities P (relative to the new max), and alpha the factor O takes
// before P V is added (rescale_o).
template <int kD, bool kSoftcap, bool kSteps, bool kMask>
__device__ __forceinline__ void softmax_scores(const PrefillParams& p, int c, int64_t kv0, const int64_t (&pos)[2],
                                               const float (&rs)[4], float (&acc)[kKvTile / 8][4], WarpState<kD>& st,
                                               float (&alpha)[2]) {
  constexpr int kN = kKvTile / 8;
  const Logits<kSoftcap> logits = Logits<kSoftcap>::make(p.args.softcap);
  int64_t start[2] = {0, 0};
  if constexpr (kMask) start[0] = window_start(pos[0], p.args.window), start[1] = window_start(pos[1], p.args.window);
  float mx[2] = {kNegInf, kNegInf};
#pragma unroll
  for (int nt = 0; nt < kN; ++nt)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int h = k >> 1;
      // rs: the rows' multipliers, then their K smoothing terms, which join each logit before
      // a soft-cap (without one they shift the row, added when the row is finished).
      float x;
      if constexpr (kSoftcap && kSteps) x = logits(fmaf(acc[nt][k], rs[h], rs[2 + h]));
      else x = logits(acc[nt][k] * rs[h]);
      if constexpr (kMask) {
        const int64_t t = kv0 + 8 * nt + 2 * c + (k & 1);
        if (t > pos[h] || t < start[h]) x = kNegInf;
      }
      acc[nt][k] = x;
      mx[h] = fmaxf(mx[h], x);
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xFFFFFFFFu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xFFFFFFFFu, mx[h], 2));
    const float m_new = fmaxf(st.m[h], mx[h]);
    const Rebase rb = rebase(st.m[h], m_new);
    alpha[h] = rb.alpha;
    float sum = 0;
#pragma unroll
    for (int nt = 0; nt < kN; ++nt) {
      acc[nt][2 * h] = fast_exp2(acc[nt][2 * h] - rb.m_use);
      acc[nt][2 * h + 1] = fast_exp2(acc[nt][2 * h + 1] - rb.m_use);
      sum += acc[nt][2 * h] + acc[nt][2 * h + 1];
    }
    st.l[h] = st.l[h] * alpha[h] + sum;
    st.m[h] = m_new;
  }
}
template <int kD>
__device__ __forceinline__ void rescale_o(WarpState<kD>& st, const float (&alpha)[2]) {
#pragma unroll
  for (int dn = 0; dn < kD / 8; ++dn) {
    st.o[dn][0] *= alpha[0], st.o[dn][1] *= alpha[0];
    st.o[dn][2] *= alpha[1], st.o[dn][3] *= alpha[1];
  }
}
template <int kD, bool kSoftcap, bool kSteps, bool kMask>
__device__ __forceinline__ void softmax_tile(const PrefillParams& p, int c, int64_t kv0, const int64_t (&pos)[2],
                                             const float (&rs)[4], float (&acc)[kKvTile / 8][4], WarpState<kD>& st) {
  float alpha[2];
  softmax_scores<kD, kSoftcap, kSteps, kMask>(p, c, kv0, pos, rs, acc, st, alpha);
  rescale_o(st, alpha);
}

// The tile at kv0 for this warp's rows (mma.sync). kMask: some token of the tile is
// outside some row's [window start, position] (else every logit counts, and none is compared).
template <int kD, bool kSoftcap, bool kSteps, bool kMask>
__device__ void take_tile(const PrefillParams& p, const Smem<kD>& s, int slot, const Block& b, int64_t kv0,
                          const int64_t (&pos)[2], const float (&rs)[4], WarpState<kD>& st) {
  constexpr int kStride = Smem<kD>::kStride;
  const int c = b.lane & 3;
  const int l8 = b.lane & 7, mi = b.lane >> 3;  // ldmatrix: the lane's row in its matrix, and the matrix
  constexpr int kN = kKvTile / 8;  // n-tiles of 8 tokens
  float acc[kN][4];
#pragma unroll
  for (int nt = 0; nt < kN; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
  // Q's matrices: rows 0-7 / 8-15 (mi & 1) by columns 0-7 / 8-15 (mi >> 1) of the k-step;
  // K's: tokens 8 (2 np + (mi >> 1)) + l8 by columns 0-7 / 8-15 (mi & 1).
  const __half* const qrow = s.q + (16 * b.warp + 8 * (mi & 1) + l8) * kStride + 8 * (mi >> 1);
  const __half* const krow = s.k(slot) + (8 * (mi >> 1) + l8) * kStride + 8 * (mi & 1);
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
    uint32_t a[4];
    ldmatrix_x4(a, qrow + 16 * ks);
#pragma unroll
    for (int np = 0; np < kN / 2; ++np) {
      uint32_t kb[4];
      ldmatrix_x4(kb, krow + 16 * np * kStride + 16 * ks);
      mma_16816(acc[2 * np], a[0], a[1], a[2], a[3], kb[0], kb[1]);
      mma_16816(acc[2 * np + 1], a[0], a[1], a[2], a[3], kb[2], kb[3]);
    }
  }
  softmax_tile<kD, kSoftcap, kSteps, kMask>(p, c, kv0, pos, rs, acc, st);
  // O += P V: P's A fragments are the S accumulators of n-tiles 2kk and 2kk + 1; V's
  // matrices (transposed): tokens 0-7 / 8-15 (mi & 1) by columns 8 (2 dp + (mi >> 1)).
  const __half* const vrow = s.v(slot) + (8 * (mi & 1) + l8) * kStride + 8 * (mi >> 1);
#pragma unroll
  for (int kk = 0; kk < kKvTile / 16; ++kk) {
    const uint32_t a0 = pack_half2(acc[2 * kk][0], acc[2 * kk][1]), a1 = pack_half2(acc[2 * kk][2], acc[2 * kk][3]);
    const uint32_t a2 = pack_half2(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
    const uint32_t a3 = pack_half2(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
#pragma unroll
    for (int dp = 0; dp < kD / 16; ++dp) {
      uint32_t vb[4];
      ldmatrix_x4<true>(vb, vrow + 16 * kk * kStride + 16 * dp);
      mma_16816(st.o[2 * dp], a0, a1, a2, a3, vb[0], vb[1]);
      mma_16816(st.o[2 * dp + 1], a0, a1, a2, a3, vb[2], vb[3]);
    }
  }
}

#if NVFP4KV_HAS_WGMMA
// S (this warpgroup's 64 rows x the tile's 64 tokens) = Q K^T from stage `slot`, issued and
// committed (not waited for).
template <int kD>
__device__ __forceinline__ void issue_scores(const Smem<kD>& s, int slot, int wg, float (&acc)[kKvTile / 8][4]) {
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks)
    wgmma_m64n64k16_ss(acc, kmajor_desc(s.q, kRows, 64 * wg, ks), kmajor_desc(s.k(slot), kKvTile, 0, ks), ks > 0);
  wgmma_commit();
}
// O += P V with P's A fragments pa and V from stage `slot`, issued and committed.
template <int kD>
__device__ __forceinline__ void issue_pv(const Smem<kD>& s, int slot, const uint32_t (&pa)[kKvTile / 16][4], WarpState<kD>& st) {
#pragma unroll
  for (int kk = 0; kk < kKvTile / 16; ++kk) {
    const uint64_t vd = nmajor_desc(s.v(slot), kKvTile, kk);
    if constexpr (kD == 128)
      wgmma_m64n128k16_rs_nmajor(st.o, pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], vd, 1);
    else
      wgmma_m64n64k16_rs_nmajor(st.o, pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], vd, 1);
  }
  wgmma_commit();
}
__device__ __forceinline__ void pack_p(const float (&acc)[kKvTile / 8][4], uint32_t (&pa)[kKvTile / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kKvTile / 16; ++kk) {
    pa[kk][0] = pack_half2(acc[2 * kk][0], acc[2 * kk][1]);
    pa[kk][1] = pack_half2(acc[2 * kk][2], acc[2 * kk][3]);
    pa[kk][2] = pack_half2(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
    pa[kk][3] = pack_half2(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
  }
}

// One step of the pipelined consumer loop: tile j's scores (stage `slot`) and the previous
// tile's P V (stage `pv_slot`, P in pa) issued together, tile j's softmax while P V runs,
// then O rescaled and tile j's P packed into pa. Straight-line between issue and wait.
template <int kD, bool kSoftcap, bool kSteps, bool kMask>
__device__ __forceinline__ void pipelined_step(const PrefillParams& p, const Smem<kD>& s, int wg, int c, int slot,
                                               int pv_slot, int64_t kv0, const int64_t (&pos)[2], const float (&rs)[4],
                                               float (&acc)[kKvTile / 8][4], uint32_t (&pa)[kKvTile / 16][4],
                                               WarpState<kD>& st) {
  wgmma_fence();
  issue_scores<kD>(s, slot, wg, acc);
  issue_pv<kD>(s, pv_slot, pa, st);
  wgmma_wait<1>();  // the scores; P V may still run
  fence_accumulators(acc);
  float alpha[2];
  softmax_scores<kD, kSoftcap, kSteps, kMask>(p, c, kv0, pos, rs, acc, st, alpha);
  wgmma_wait<0>();
  fence_accumulators(st.o);
  rescale_o(st, alpha);
  pack_p(acc, pa);
}

// The tile at kv0 for this warp's warpgroup (64 rows), one tile at a time (the loop for a
// ring of one stage): S = Q K^T, this warp's softmax (masked where the warpgroup's `mask`
// says: every warp of it must issue the same wgmma), then O += P V. Every warp of the
// warpgroup calls it for the same tile.
template <int kD, bool kSoftcap, bool kSteps>
__device__ void take_tile_wgmma(const PrefillParams& p, const Smem<kD>& s, int slot, int wg, int c, int64_t kv0,
                                const int64_t (&pos)[2], const float (&rs)[4], bool mask, WarpState<kD>& st) {
  float acc[kKvTile / 8][4];
  uint32_t pa[kKvTile / 16][4];
  wgmma_fence();
  issue_scores<kD>(s, slot, wg, acc);
  wgmma_wait<0>();
  fence_accumulators(acc);
  if (mask)
    softmax_tile<kD, kSoftcap, kSteps, true>(p, c, kv0, pos, rs, acc, st);
  else
    softmax_tile<kD, kSoftcap, kSteps, false>(p, c, kv0, pos, rs, acc, st);
  pack_p(acc, pa);
  wgmma_fence();
  issue_pv<kD>(s, slot, pa, st);
  wgmma_wait<0>();
  fence_accumulators(st.o);
}
#endif

// Which loop the producers take over NVFP4 pages: a fast one where both sides' data rows allow
// an 8-byte load of a group at a column stride of 1, every region's token mode is a plain
// stride whose largest term fits 31 bits, and the data bytes keep the standard or the
// fp16-split code order (each with its own placement); the general loop otherwise. A layout
// with an FP8 side takes a loop of its own in the instances with the format steps (below).
enum class ProducerLoop { kGeneral, kFastStandard, kFastSplit };
__device__ __forceinline__ ProducerLoop producer_loop(const LayoutView& layout) {
  if (!group_loads(layout, Region::kKData) || !group_loads(layout, Region::kVData)) return ProducerLoop::kGeneral;
  for (int r = 0; r < kRegionCount; ++r) {
    const Mode& token = layout.region(Region(r)).token;
    // A plain stride whose terms over the page fit 31 bits (the fast loop adds them in 32).
    if (!token.is_plain() || token.stride > INT32_MAX / layout.dims().tokens_per_page) return ProducerLoop::kGeneral;
  }
  if (layout.codes().is_standard()) return ProducerLoop::kFastStandard;
  if (layout.codes().is_fp16_split()) return ProducerLoop::kFastSplit;
  return ProducerLoop::kGeneral;
}

// Registers per thread after setmaxnreg (multiples of 8; the block's 512 x 128 in all):
// the mma.sync consumers hold O (D / 2 floats a thread), S (32) and their fragments, so D 256
// takes 8 more from the producers; the wgmma consumers hold O, S and P (16) but no Q, K or V
// fragments (those stay in shared memory), so 168 leave the producers 88 for two tiles in flight.
template <int kD>
constexpr int kConsumerRegs = kWgmmaTiles<kD> ? 168 : kD == 256 ? 200 : 192;
template <int kD>
constexpr int kProducerRegs = (kThreads * 128 - kConsumerThreads * kConsumerRegs<kD>) / kProducerThreads;
static_assert(kProducerRegs<256> == 56 && kProducerRegs<128> == (kWgmmaTiles<128> ? 88 : 64));

// Tiles whose raw bytes a producer thread holds in flight: two where the wgmma consumers leave
// the producers 88 registers (12 a tile at D 128; with mma.sync consumers the producers keep
// 64, where two were never measured), so that a tile's loads have a whole tile's store and
// wait to land in (run 59: -2 % at long prompts, the spills gone).
template <int kD>
constexpr int kFetchAhead = kWgmmaTiles<kD> ? 2 : 1;

// The producers' loop: tile j into stage j % stages once the consumers released its
// previous tile. Tile j + kFetchAhead's bytes are requested right after tile j is stored
// (into the registers tile j came in), so they are in flight while the producers store the
// tiles between and wait for slots; the pages of the tile after that are read one tile
// earlier still. The producers leave without waiting for the consumers' last releases: a
// consumer waits only on full barriers, which complete through the producers' own
// arrivals, so none can be left waiting.
template <int kD, bool kFast, class Place, int kWords = 2>
__device__ void produce(const PrefillParams& p, const Smem<kD>& s, const Block& b, int64_t lo, int64_t hi, int tiles) {
  using Share = TileShare<kD, kWords>;
  // The FP8 loop's items are twice as wide: one tile in flight (two spilled the producers'
  // 88 registers and every instance's plain loops with them).
  constexpr int kAhead = kWords == 4 ? 1 : kFetchAhead<kD>;
  const int stages = p.geometry.stages;
  const int pt = b.tid - kConsumerThreads;
  const int64_t n = p.layout.dims().tokens_per_page;
  const int page_shift = (n & (n - 1)) == 0 ? __ffsll(n) - 1 : -1;
  const ColumnBase cb = column_base<kWords>(p, b, pt % TileShare<kD>::kGroups);
  Share share[kAhead];
#pragma unroll
  for (int u = 0; u < kAhead; ++u)
    if (u < tiles) fetch_tile<kD, kFast>(p, b, pt, cb, tile_pages<kD>(p, b, pt, lo + u * kKvTile, lo, hi, page_shift), share[u]);
  TilePages<kD> pages = tile_pages<kD>(p, b, pt, lo + kAhead * kKvTile, lo, hi, page_shift);
  // The consumers' barrier in prefill_device, from this branch (the non-aligned form):
  // the ring's barriers are initialized.
  sync_threads(0, kThreads);
  // Stage j goes to slot j % stages; from the second round on, it waits for the
  // consumers' release of the slot's previous tile (the empty barrier's phase, flipping
  // each round). The loop is unrolled kAhead times so that each tile's registers are fixed.
  int slot = 0, phase = 0;
  for (int j0 = 0; j0 < tiles; j0 += kAhead) {
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int j = j0 + u;
      if (j >= tiles) break;
      if (j >= stages) barrier_wait_bounded(&s.empty[slot], phase);
      store_tile<kD, kFast, Place>(p, s, pt, slot, share[u]);
      if constexpr (kWgmmaTiles<kD>) fence_shared_to_async();  // the consumers' wgmma read the stores
      barrier_arrive(&s.full[slot]);
      if (j + kAhead < tiles) {
        fetch_tile<kD, kFast>(p, b, pt, cb, pages, share[u]);
        pages = tile_pages<kD>(p, b, pt, lo + int64_t(j + kAhead + 1) * kKvTile, lo, hi, page_shift);
      }
      if (++slot == stages) {
        slot = 0;
        if (j >= stages) phase ^= 1;  // a round of waits done (the first round waits for nothing)
      }
    }
  }
}

// V's rotation undone on a warp's O (m16n8 accumulators: a lane holds columns 8 dn + 2 c + e,
// e = 0, 1, of rows g and g + 8): butterflies of span 1 inside a register pair, of span 2 and
// 4 across the lanes of a row (c), of span 8 and up across dn; then the 1 / sqrt(n). Every
// lane of the warp calls it.
template <int kD>
__device__ __forceinline__ void unrotate_o(float (&o)[kD / 8][4], int n_rot, int c) {
#pragma unroll
  for (int dn = 0; dn < kD / 8; ++dn)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float u = o[dn][2 * h], w = o[dn][2 * h + 1];
      o[dn][2 * h] = u + w, o[dn][2 * h + 1] = u - w;
    }
#pragma unroll
  for (int span = 2; span < 8; span *= 2) {
    if (span >= n_rot) break;
    const bool high = (c & (span / 2)) != 0;
#pragma unroll
    for (int dn = 0; dn < kD / 8; ++dn)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float other = __shfl_xor_sync(0xFFFFFFFFu, o[dn][k], span / 2);
        o[dn][k] = high ? other - o[dn][k] : o[dn][k] + other;
      }
  }
#pragma unroll
  for (int m = 1; m < kD / 8; m *= 2) {
    if (8 * m >= n_rot) break;
#pragma unroll
    for (int dn = 0; dn < kD / 8; ++dn)
      if ((dn & m) == 0)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float u = o[dn][k], w = o[dn + m][k];
          o[dn][k] = u + w, o[dn + m][k] = u - w;
        }
  }
  const float norm = hadamard_scale(n_rot);
#pragma unroll
  for (int dn = 0; dn < kD / 8; ++dn)
#pragma unroll
    for (int k = 0; k < 4; ++k) o[dn][k] *= norm;
}

// The same out of line and by value, as the kernel calls it at D 256: inline, the butterflies over
// every accumulator raised ptxas' spills (D 256: 612 to 928 bytes, sm_90a); by value the
// caller's accumulators keep their registers (their address is never taken).
template <int kD>
struct OTile {
  float o[kD / 8][4];
};
template <int kD>
__device__ __noinline__ OTile<kD> unrotated(OTile<kD> t, int n_rot, int c) {
  unrotate_o<kD>(t.o, n_rot, c);
  return t;
}

// kSteps: the layer's format rotates, smooths or channel-scales K (common/format_view.hpp): the query and output
// steps are compiled in; without it the instance has no instruction for them (in every
// instance, they cost plain caches up to 7 % at D 128, runs 64-66). kFp8: the layout holds a
// side in FP8 (with kSteps only): the producers' FP8 loop is the instance's one loop.
template <int kD, ElementType kType, bool kSoftcap, bool kSteps, bool kFp8>
__device__ void prefill_device(const PrefillParams& p, char* smem_raw, Block b) {
  const PrefillArgs& a = p.args;
  const CacheDims& d = p.layout.dims();
  const int64_t n = d.tokens_per_page, group = p.geometry.group, dim = d.head_dim;
  const Smem<kD> s = Smem<kD>::carve(smem_raw, p.geometry.stages, kSteps);
  const SequenceLength len = sequence_length(a.batch, b.seq, n);
  b.q_len = a.raw_q_length(b.seq);
  b.kv_len = len.tokens;
  b.row0 = a.cu_seqlens_q[b.seq];
  const bool bad_q = b.q_len < 0 || b.q_len > a.max_q_len || (!len.bad && b.q_len > len.tokens);
  const bool counter = b.tid == 0 && b.tile == 0 && b.kv_head == 0;
  if (counter && a.status && (len.bad || bad_q)) atomicAdd(&a.status->bad_lengths, 1ull);
  if (b.q_len <= 0) return;  // nothing to compute, nothing read
  const float kgs = *a.k_global_scale, vgs = *a.v_global_scale;
  const bool scales_ok = global_scale_usable(kgs) && global_scale_usable(vgs);
  if (counter && a.status && !scales_ok) atomicAdd(&a.status->bad_global_scale, (unsigned long long)b.kv_len);
  bool poisoned = len.bad || bad_q || !scales_ok;

  // Every block checks the block-table entries of every token the sequence's
  // queries read (a bad one poisons the whole sequence, as in the reference);
  // the (tile 0, kv head 0) block counts them.
  // The flags, and the ring's barriers (used only once the roles split, after the block
  // barrier that follows load_query; initialized here so that no divergent branch sits
  // before the warp-aligned setmaxnreg).
  if (b.tid == 0) {
    s.flags[0] = 0;
    for (int i = 0; i < p.geometry.stages; ++i)
      barrier_init(&s.full[i], kProducerThreads), barrier_init(&s.empty[i], kConsumerThreads);
    barrier_init_fence();
  }
  __syncthreads();
  if (!poisoned) {
    const int64_t first = prefill_first_token(b.q_len, b.kv_len, a.window);
    for (int64_t e = first / n + b.tid; e * n < b.kv_len; e += kThreads)
      if (page_of(a.batch, b.seq, e, d.pages) < 0) {
        s.flags[0] = 1;
        if (b.tile == 0 && b.kv_head == 0 && a.status)
          atomicAdd(&a.status->bad_pages, (unsigned long long)min(n, b.kv_len - e * n));
      }
  }
  __syncthreads();
  poisoned = poisoned || s.flags[0] != 0;

  const int tpt = p.geometry.tokens_per_tile;
  if (poisoned) {  // every query row of the sequence NaN, this block's tiles of it (all of them past max_q_len too)
    const uint16_t nan = to_half_bits<kType>(quiet_nan());
    for (int64_t i = b.tile * tpt; i < b.q_len; i += int64_t(gridDim.x) * tpt)
      for (int64_t u = b.tid; u < int64_t(tpt) * group * dim; u += kThreads) {
        const int64_t token = i + u / (group * dim), head = b.kv_head * group + (u / dim) % group, col = u % dim;
        if (token >= b.q_len) break;
        static_cast<uint16_t*>(a.out)[((b.row0 + token) * a.q_heads + head) * dim + col] = nan;
        if (a.lse && col == 0) a.lse[(b.row0 + token) * a.q_heads + head] = quiet_nan();
      }
    return;
  }
  b.i0 = b.tile * tpt;
  if (b.i0 >= b.q_len) return;
  b.tokens = int(min(int64_t(tpt), b.q_len - b.i0));
  b.rows = b.tokens * int(group);

  const int64_t first_pos = b.kv_len - b.q_len + b.i0, last_pos = first_pos + b.tokens - 1;
  const int64_t lo = window_start(first_pos, a.window), hi = last_pos + 1;
  const int stages = p.geometry.stages;
  const int tiles = int((hi - lo + kKvTile - 1) / kKvTile);
  if (b.warp >= kConsumerWarps) {
    // The producers (produce, above). Registers move to the consumers (their O and S
    // accumulators: kConsumerRegs; ptxas allocates each side's code for its count).
    warpgroup_release_registers<kProducerRegs<kD>>();
    // The producers' loop for the common layouts holds only their path: 8-byte group
    // loads, plain token strides, one code order (run 51's profile: instruction fetch
    // stalls in a loop that held every path); the general loop takes any layout.
    // A layout with an FP8 side runs instances of its own (launch_prefill) whose one loop is
    // the FP8 one: its items are twice as wide, and beside the NVFP4 loops it raised ptxas'
    // spills in every instance that held it (D 128: 56 / 148 -> 48 / 540 bytes in all of
    // them; 60 / 156 -> 80 / 560 where only the steps instances held it).
    if constexpr (kFp8) {
      produce<kD, false, Nvfp4Fp16, 4>(p, s, b, lo, hi, tiles);
      return;
    }
    switch (producer_loop(p.layout)) {
      case ProducerLoop::kFastSplit: produce<kD, true, Nvfp4Fp16Split>(p, s, b, lo, hi, tiles); break;
      case ProducerLoop::kFastStandard: produce<kD, true, Nvfp4Fp16>(p, s, b, lo, hi, tiles); break;
      default: produce<kD, false, Nvfp4Fp16>(p, s, b, lo, hi, tiles);
    }
    return;
  }
  warpgroup_take_registers<kConsumerRegs<kD>>();
  load_query<kD, kType, kSteps>(p, s, b, kgs);
  if constexpr (kWgmmaTiles<kD>) fence_shared_to_async();  // Q, read by wgmma
  sync_threads(0, kThreads);  // every row's query and multiplier in place; the ring's barriers initialized

  // This lane's rows: 16 warp + g and + 8; a row's query position and multiplier.
  const int g = b.lane >> 2, c = b.lane & 3;
  int64_t pos[2];
  bool live[2];
  float rs[4];  // the rows' logit multipliers, then their K smoothing terms
  for (int h = 0; h < 2; ++h) {
    const int r = 16 * b.warp + g + 8 * h;
    live[h] = r < b.rows;
    pos[h] = first_pos + r / group;
    rs[h] = s.row_scale[r];
    // Only a soft-cap needs the term per logit; without one it is read when the row is
    // finished (held in registers through the tile loop, it cost 8 % at 1 x 8K, D 128, H100).
    rs[2 + h] = kSoftcap && kSteps ? s.row_bias[r] : 0.0f;
  }
  // The warp's rows see tokens [its first row's window start, its last row's position];
  // a tile inside [the last row's window start, the first row's position] needs no mask.
  const bool warp_live = 16 * b.warp < b.rows;
  const int64_t warp_first_pos = first_pos + (16 * b.warp) / group;
  const int64_t warp_last_pos = first_pos + min(16 * b.warp + 15, b.rows - 1) / group;
  const int64_t unmasked_from = window_start(warp_last_pos, a.window);
  // The warpgroup MMAs run for a tile some row of the warpgroup sees, and choose the mask for
  // the warpgroup (all four warps must issue the same wgmma instructions).
  const int wg = b.warp / 4;
  const bool wg_live = 64 * wg < b.rows;
  const int64_t wg_first_pos = first_pos + (64 * wg) / group;
  const int64_t wg_last_pos = first_pos + min(64 * wg + 63, b.rows - 1) / group;
  const int64_t wg_unmasked_from = window_start(wg_last_pos, a.window);
  WarpState<kD> st;
  for (int dn = 0; dn < kD / 8; ++dn) st.o[dn][0] = st.o[dn][1] = st.o[dn][2] = st.o[dn][3] = 0.0f;
  st.m[0] = st.m[1] = kNegInf;
  st.l[0] = st.l[1] = 0.0f;
  // Every consumer waits for every stage in order and releases it, also a warp that
  // skips it (an early release would count toward the slot's previous fill).
#if NVFP4KV_HAS_WGMMA
  if constexpr (kWgmmaTiles<kD>) {
    if (stages >= 2) {
      // Software-pipelined over tiles (a warpgroup holds two stages at most, so the ring needs
      // two): tile j's scores are issued, then tile j - 1's P V, and tile j's softmax runs while
      // that P V is on the tensor cores; O takes tile j's rescale once it is done, and stage
      // j - 1 is released then. The warpgroup's tiles are a prefix of the block's (their first
      // token at or before its last row's position); the rest are waited for and released.
      // (Broadcast from lane 0, as the mask choice below: ptxas then knows them warp-uniform and
      // keeps the wgmma asynchronous across the branches on them; computed per lane it
      // serialized every wgmma, its C7520 note.)
      const int wg_tiles =
          __shfl_sync(0xFFFFFFFFu, wg_live ? int(min(int64_t(tiles), (wg_last_pos - lo) / kKvTile + 1)) : 0, 0);
      float acc[kKvTile / 8][4];
      uint32_t pa[kKvTile / 16][4];
#pragma unroll
      for (int kk = 0; kk < kKvTile / 16; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0;  // P of "tile -1"
      int prev = 0;
      for (int j = 0, slot = 0, phase = 0; j < tiles; ++j) {
        barrier_wait(&s.full[slot], phase);
        if (j < wg_tiles) {
          const int64_t kv0 = lo + int64_t(j) * kKvTile;
          // No branch while a wgmma is in flight (ptxas would serialize them all): the mask
          // choice takes the whole step, and tile 0 adds a zero P times its own V. The choice is
          // the warpgroup's (a choice per warp made synccheck report mismatched warpgroup
          // instruction addresses, run 61).
          const bool unmasked = __shfl_sync(0xFFFFFFFFu, kv0 >= wg_unmasked_from && kv0 + kKvTile - 1 <= wg_first_pos, 0);
          if (unmasked)
            pipelined_step<kD, kSoftcap, kSteps, false>(p, s, wg, c, slot, j > 0 ? prev : slot, kv0, pos, rs, acc, pa, st);
          else
            pipelined_step<kD, kSoftcap, kSteps, true>(p, s, wg, c, slot, j > 0 ? prev : slot, kv0, pos, rs, acc, pa, st);
          if (j > 0) barrier_arrive(&s.empty[prev]);
          if (j == wg_tiles - 1) {  // the warpgroup's last tile: its P V now
            wgmma_fence();
            issue_pv<kD>(s, slot, pa, st);
            wgmma_wait<0>();
            fence_accumulators(st.o);
            barrier_arrive(&s.empty[slot]);
          }
        } else {
          barrier_arrive(&s.empty[slot]);
        }
        prev = slot;
        if (++slot == stages) slot = 0, phase ^= 1;
      }
    }
  }
#endif
  for (int j = 0, slot = 0, phase = 0; j < tiles && !(kWgmmaTiles<kD> && stages >= 2); ++j) {
    barrier_wait(&s.full[slot], phase);  // round j / stages of the slot
    const int64_t kv0 = lo + int64_t(j) * kKvTile;
    const bool unmasked = kv0 >= unmasked_from && kv0 + kKvTile - 1 <= warp_first_pos;
    if constexpr (kWgmmaTiles<kD>) {
#if NVFP4KV_HAS_WGMMA
      // A warp whose rows see none of the tile takes the masked path: its rows stay as they were.
      if (wg_live && kv0 <= wg_last_pos)
        take_tile_wgmma<kD, kSoftcap, kSteps>(p, s, slot, wg, c, kv0, pos, rs,
                                      !(kv0 >= wg_unmasked_from && kv0 + kKvTile - 1 <= wg_first_pos), st);
#endif
    } else if (warp_live && kv0 <= warp_last_pos) {
      if (unmasked)
        take_tile<kD, kSoftcap, kSteps, false>(p, s, slot, b, kv0, pos, rs, st);
      else
        take_tile<kD, kSoftcap, kSteps, true>(p, s, slot, b, kv0, pos, rs, st);
    }
    barrier_arrive(&s.empty[slot]);
    if (++slot == stages) slot = 0, phase ^= 1;
  }

  // V's rotation undone on O, once per row: in place at D <= 128 (out of line by value, the
  // argument and result went through local memory, which beside the ring's shared memory
  // lives in L2: run 66 measured 15 % more elapsed cycles and 2.5x the L2 traffic at 1 x 8K,
  // D 128), out of line at D 256 (inline there it spilled more).
  if (const int n_rot = kSteps ? p.format.v.rotation : 0; n_rot > 0) {
    if constexpr (kD <= 128) {
      unrotate_o<kD>(st.o, n_rot, c);
    } else {
      OTile<kD> t;
#pragma unroll
      for (int dn = 0; dn < kD / 8; ++dn)
#pragma unroll
        for (int k = 0; k < 4; ++k) t.o[dn][k] = st.o[dn][k];
      t = unrotated<kD>(t, n_rot, c);
#pragma unroll
      for (int dn = 0; dn < kD / 8; ++dn)
#pragma unroll
        for (int k = 0; k < 4; ++k) st.o[dn][k] = t.o[dn][k];
    }
  }
  // The rows' totals (the sink joins the denominator), then O / total in the output type.
  const float out_scale = Format::kUndo * vgs;
  for (int h = 0; h < 2; ++h) {
    float l = st.l[h];
    l += __shfl_xor_sync(0xFFFFFFFFu, l, 1);
    l += __shfl_xor_sync(0xFFFFFFFFu, l, 2);
    if (!live[h]) continue;
    const int r = 16 * b.warp + g + 8 * h;
    const int64_t row = b.row0 + b.i0 + r / group, head = b.kv_head * group + r % group;
    // K smoothing's q . mu: without a soft-cap a shift of the row's logits, so of its maximum.
    float mx = st.m[h];
    if constexpr (!kSoftcap && kSteps)
      if (mx != kNegInf) mx += s.row_bias[r];
    const RowTotal t = finish_row(mx, l, sink_logit2(a.sinks, head));
    const float f = t.total > 0 ? t.factor / t.total * out_scale : 0.0f;
    uint16_t* const out = static_cast<uint16_t*>(a.out) + (row * a.q_heads + head) * dim;
    for (int dn = 0; dn < kD / 8; ++dn) {
      const int col = 8 * dn + 2 * c;
      if (col >= dim) break;
      const uint32_t pair = uint32_t(to_half_bits<kType>(st.o[dn][2 * h] * f)) |
                            uint32_t(to_half_bits<kType>(st.o[dn][2 * h + 1] * f)) << 16;
      *reinterpret_cast<uint32_t*>(out + col) = pair;  // dim is a multiple of 16: col + 1 < dim
    }
    if (a.lse && c == 0) a.lse[row * a.q_heads + head] = t.lse;
  }
}

template <int kD, ElementType kType, bool kSoftcap, bool kSteps, bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) prefill_kernel(const __grid_constant__ PrefillParams p) {
#if NVFP4KV_KERNEL_ARCH_SUPPORTED
  extern __shared__ __align__(128) char smem[];
  Block b{};
  b.tid = int(threadIdx.x), b.warp = b.tid / 32, b.lane = b.tid % 32;
  // The tiles of a (sequence, kv head) in reverse: the last query tokens see the most
  // kv tokens, so the longest blocks start first and the short ones fill the tail.
  b.tile = int64_t(gridDim.x) - 1 - blockIdx.x, b.kv_head = blockIdx.y, b.seq = blockIdx.z;
  prefill_device<kD, kType, kSoftcap, kSteps, kFp8>(p, smem, b);
#else
  __trap();  // unreachable: the API refuses devices older than sm_90 (common/arch.hpp)
#endif
}

}  // namespace prefill

cudaError_t plan_prefill_geometry(PrefillParams& p, std::string* unsupported) {
  int device = 0, max_smem = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (e != cudaSuccess) return e;
  *unsupported = nvfp4kv::plan_prefill_geometry(p.layout, p.args, max_smem, &p.geometry);
  return cudaSuccess;
}

cudaError_t launch_prefill(const PrefillParams& p, cudaStream_t stream) {
  using namespace prefill;
  if (p.args.batch.batch == 0) return cudaSuccess;
  return NVFP4KV_DISPATCH_HALF_TYPE(p.args.q_type, kType, [&] {
    return NVFP4KV_DISPATCH_SOFTCAP(p.args.softcap > 0, kSoftcap, [&] {
      return NVFP4KV_DISPATCH_ATTENTION_HEAD_DIM(p.geometry.head_dim, kD, [&] {
        // The layer's own format picks the steps (the shared memory is planned with q . mu
        // either way); a layout with an FP8 side takes instances of its own, with the steps
        // (their few percent beside FP8's bytes, not twice the instances).
        const bool fp8 = p.layout.dims().fp8(Side::kK) || p.layout.dims().fp8(Side::kV);
        const auto kernel = fp8                     ? prefill_kernel<kD, kType, kSoftcap, true, true>
                            : p.format.transformed() ? prefill_kernel<kD, kType, kSoftcap, true, false>
                                                     : prefill_kernel<kD, kType, kSoftcap, false, false>;
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, p.geometry.smem_bytes);
        if (e != cudaSuccess) return e;
        const dim3 grid{unsigned(p.geometry.q_tiles), unsigned(p.layout.dims().heads), unsigned(p.args.batch.batch)};
        kernel<<<grid, kThreads, p.geometry.smem_bytes, stream>>>(p);
        return cudaGetLastError();
      });
    });
  });
}

}  // namespace nvfp4kv::kernels
