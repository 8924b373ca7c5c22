#pragma once
// Attention in double precision: the oracle the GPU decode and prefill kernels
// are compared with (on the same dequantized cache), and the dense baseline the accuracy
// table compares NVFP4 against (on unquantized K/V).
#include <vector>

#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/core/ops.hpp"

namespace nvfp4kv::reference {

struct AttentionOptions {
  double softmax_scale = 1;
  int64_t window = 0;       // > 0: the last `window` tokens only
  double softcap = 0;       // > 0: softcap * tanh(logit / softcap)
  const float* sinks = nullptr;  // (q_heads) or null
  const double* score_bias = nullptr;  // (q_heads) or null: added to each q.k before scaling
                                       // (a smoothed cache's q.mu)
};

// One query row per (sequence, head). q: (q_heads, D); k, v: (tokens, kv_heads, D).
// out: (q_heads, D); lse: (q_heads), natural log of the denominator (sink included).
void attend(const double* q, int64_t q_heads, const double* k, const double* v, int64_t tokens, int64_t kv_heads,
            int64_t head_dim, const AttentionOptions& options, double* out, double* lse);

struct DecodeResult {
  std::vector<double> out;  // (batch, q_heads, D)
  std::vector<double> lse;  // (batch, q_heads)
};

// decode_attention's definition on host pointers. With the layout's format: q is scaled by
// lambda and rotated as K was, scores are q.(k - mu) + q.mu, the output is rotated back as V
// was; so the result
// is attention over the original-domain values (what gather returns) up to fp64 rounding. (DecodeArgs: q, block table,
// lengths, global scales, sinks are read; out, lse, workspace are not used).
// Bad entries are handled as the GPU does: counted in args.status, and the
// sequence's outputs are NaN.
DecodeResult decode_attention(const ValidLayout& layout, const CacheBuffers& buffers, const DecodeArgs& args);

struct PrefillResult {
  std::vector<double> out;  // (rows, q_heads, D), rows = the largest cu_seqlens_q entry; rows of no sequence stay 0
  std::vector<double> lse;  // (rows, q_heads)
};

// prefill_attention's definition on host pointers (PrefillArgs: q, cu_seqlens_q,
// block table, kv lengths, global scales, sinks are read; out, lse are not used).
// Handled as the GPU does: a kv length beyond the table, a q length < 0, above
// max_q_len or above the kv length is a bad length (counted once); a bad
// block-table entry among the tokens the sequence's queries read is counted
// (its tokens); unusable global scales count the kv tokens of a sequence with
// queries; any of these makes every query row of the sequence NaN.
PrefillResult prefill_attention(const ValidLayout& layout, const CacheBuffers& buffers, const PrefillArgs& args);

}  // namespace nvfp4kv::reference
