#pragma once
// A computation split over thread blocks and merged inside the same kernel: each
// split writes its partial (O / l and its log-sum-exp) to the split workspace
// (core/attention.hpp), counts itself finished on its merge group's ticket, and
// the split that finishes last merges the group's rows. No second launch, no
// memset: the ticket resets itself.
#include <cstdint>

#include "epilogue.cuh"
#include "nvfp4kv/core/attention.hpp"
#include "softmax.cuh"

namespace nvfp4kv::kernels::attention {

// A ticket counts finished splits as kTicketTag << 16 | count; any other value
// reads as zero finished, and the last split leaves the count at 0: so the ticket
// resets itself for the next call (graph replays need no memset) and a workspace
// fresh from cudaMalloc needs no clearing either (a stray value would have to
// carry the 48-bit tag to be misread).
constexpr unsigned long long kTicketTag = kSplitTicketTag;  // core/attention.hpp

struct SplitWorkspace {
  float* partial;               // (rows x splits, head_dim) O / l of each split, in the family's row order
  float* lse2;                  // (rows x splits) max + log2(l) of each split
  unsigned long long* tickets;  // (tickets)

  __device__ static SplitWorkspace at(void* base, int64_t rows, int64_t splits, int64_t tickets, int head_dim) {
    size_t tickets_at = 0;
    attention_split_workspace_bytes(rows, splits, tickets, head_dim, &tickets_at);
    char* const b = static_cast<char*>(base);
    float* const partial = reinterpret_cast<float*>(b);
    return {partial, partial + size_t(rows) * size_t(splits) * size_t(head_dim),
            reinterpret_cast<unsigned long long*>(b + tickets_at)};
  }
};

// Counts this split as finished; true for the split that finished last (which
// leaves the ticket at kTicketTag << 16, "tagged, none finished"). One thread of
// the block, after the block's partials were written and fenced. A tagged ticket
// takes one atomicAdd (its count sits in the low 16 bits; splits <= 65535); only a
// ticket not yet tagged (a workspace fresh from cudaMalloc, the first call) goes
// through a compare-and-swap loop, whose retries under contention cost an L2 round
// trip each (run 33: the CAS loop on every call cost batch 1 several microseconds).
__device__ inline bool finish_split(unsigned long long* ticket, int splits) {
  constexpr unsigned long long kReset = kSplitTicketAtRest;
  unsigned long long seen = *reinterpret_cast<volatile unsigned long long*>(ticket);
  if ((seen >> 16) == kTicketTag) {
    const unsigned long long was = atomicAdd(ticket, 1ull);
    const int done = int(was & 0xFFFFu) + 1;
    if (done < splits) return false;
    atomicExch(ticket, kReset);
    return true;
  }
  for (;;) {
    const int done = (seen >> 16) == kTicketTag ? int(seen & 0xFFFFu) : 0;
    const unsigned long long next = done + 1 == splits ? kReset : (kTicketTag << 16) | unsigned(done + 1);
    const unsigned long long was = atomicCAS(ticket, seen, next);
    if (was == seen) return done + 1 == splits;
    seen = was;
  }
}

// One merge: `rows` output rows whose split k's partial is workspace row
// row0 + k * split_stride + r (r < rows). The rows are per_token heads of one or
// more query tokens: row r is head r % per_token of token r / per_token.
struct MergeJob {
  int64_t row0, split_stride;
  int rows, splits;
  int dim;               // columns written (the head dim)
  int partial_dim;       // floats per partial row (the instance's D, a multiple of 4)
  uint16_t* out;         // row r at out + (r / per_token) * token_out_stride + (r % per_token) * out_stride
  int64_t out_stride;
  float* lse;            // optional: row r's natural-log LSE at lse[(r / per_token) * token_lse_stride + r % per_token]
  const float* sinks;    // optional: row r's sink logit at sinks[r % per_token]
  float out_scale;       // applied to the normalised output (V's global scale, the placement's 2^14)
  int per_token = 1 << 30;  // heads per query token (default: every row one token's)
  int64_t token_out_stride = 0, token_lse_stride = 0;
};

// Shared memory of the merge (carved from whatever the block is done with).
struct MergeSmem {
  float* weight;  // (splits, rows) each split's log-sum-exp, then its weight
  float* total;   // (rows) softmax denominator over the splits (and the sink)
  float* m_all;   // (rows) the maximum the weights are relative to
  int* nan;       // (rows) a split's partial was NaN
  // Floats the four arrays take for `splits` x `rows`.
  __host__ __device__ static constexpr size_t words(int splits, int rows) { return size_t(splits + 3) * rows; }
};

// The job's rows, all at once: the splits' partials weighted by their softmax
// denominators (and the sink), normalised, scaled, written in the query's type; a
// NaN partial makes its row NaN. Weights: a warp per row. Rows: a thread per
// (row, 4 columns), every split's partial loaded through L2 (other blocks wrote
// them; this SM's L1 may hold an earlier call's) without a condition, so the loads
// run back to back; a split of weight 0 adds nothing, even a NaN.
template <int kBlockThreads, ElementType kType>
__device__ void merge_rows(const SplitWorkspace& w, const MergeJob& job, const MergeSmem& m, int tid) {
  const int rows = job.rows, splits = job.splits;
  for (int i = tid; i < splits * rows; i += kBlockThreads)
    m.weight[i] = __ldcg(&w.lse2[job.row0 + (i / rows) * job.split_stride + i % rows]);
  __syncthreads();
  const int warp = tid / 32, lane = tid % 32;
  for (int r = warp; r < rows; r += kBlockThreads / 32) {
    float mx = kNegInf;
    int nan_seen = 0;
    for (int k = lane; k < splits; k += 32) {
      const float v = m.weight[k * rows + r];
      nan_seen |= v != v;
      mx = fmaxf(mx, v);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
    nan_seen = __any_sync(0xFFFFFFFFu, nan_seen);
    const float sink = job.sinks ? job.sinks[r % job.per_token] * kLog2e : kNegInf;
    const float m_all = fmaxf(mx, sink);
    float part = 0;
    for (int k = lane; k < splits; k += 32) {
      const float wk = mx == kNegInf ? 0.0f : exp2f(m.weight[k * rows + r] - m_all);
      m.weight[k * rows + r] = wk;
      part += wk;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xFFFFFFFFu, part, o);
    if (lane == 0) {
      m.total[r] = part + (job.sinks ? exp2f(sink - m_all) : 0.0f);
      m.m_all[r] = m_all;
      m.nan[r] = nan_seen;
    }
  }
  __syncthreads();
  const float nan = quiet_nan();
  const int slots = job.partial_dim / 4;
  const float4* x = reinterpret_cast<const float4*>(w.partial + job.row0 * job.partial_dim);
  const int64_t step = job.split_stride * slots;  // float4s from one split's row to the next split's
  for (int i = tid; i < rows * slots; i += kBlockThreads) {
    const int r = i / slots, c4 = i % slots;
    if (4 * c4 >= job.dim) continue;
    const float4* col = x + r * slots + c4;
    float4 o = make_float4(0, 0, 0, 0);
#pragma unroll 8
    for (int k = 0; k < splits; ++k) {
      const float4 v = __ldcg(col + k * step);
      const float wk = m.weight[k * rows + r];
      const bool use = wk > 0;
      o.x = use ? fmaf(v.x, wk, o.x) : o.x, o.y = use ? fmaf(v.y, wk, o.y) : o.y;
      o.z = use ? fmaf(v.z, wk, o.z) : o.z, o.w = use ? fmaf(v.w, wk, o.w) : o.w;
    }
    const float total = m.total[r];
    const bool poisoned = m.nan[r] != 0;
    const float v4[4] = {o.x, o.y, o.z, o.w};
    uint16_t* out = job.out + (r / job.per_token) * job.token_out_stride + (r % job.per_token) * job.out_stride;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int cc = 4 * c4 + c;
      if (cc >= job.dim) break;
      float value = total > 0 ? v4[c] / total * job.out_scale : 0.0f;
      if (poisoned) value = nan;
      out[cc] = to_half_bits<kType>(value);
    }
  }
  if (job.lse)
    for (int r = tid; r < rows; r += kBlockThreads) {
      const float total = m.total[r];
      job.lse[(r / job.per_token) * job.token_lse_stride + r % job.per_token] =
          m.nan[r] ? nan : total > 0 ? (m.m_all[r] + log2f(total)) / kLog2e : kNegInf;
    }
}

}  // namespace nvfp4kv::kernels::attention
