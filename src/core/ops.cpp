// The argument rules the GPU API and the CPU reference share.
#include "nvfp4kv/core/ops.hpp"

#include <cstdint>

#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv {

std::string batch_problem(const BatchDescriptor& b, BatchForm form) {
  if (b.batch < 0 || b.batch > 65535) return "batch must be in [0, 65535], got " + std::to_string(b.batch);
  if (b.cu_seqlens && b.seq_lens) return "give either cu_seqlens (offsets) or seq_lens (lengths), not both";
  if (form == BatchForm::kOffsets && b.seq_lens)
    return "this operation places each sequence's rows by offset: give cu_seqlens (batch + 1 offsets), not seq_lens";
  if (b.batch == 0) return "";
  if (!b.block_table) return "the block table is required";
  if (!b.cu_seqlens && !b.seq_lens)
    return form == BatchForm::kOffsets ? "cu_seqlens (batch + 1 offsets) is required"
                                       : "sequence lengths are required: seq_lens (batch) or cu_seqlens (batch + 1)";
  if (b.block_table_stride < 1 || b.block_table_stride > INT32_MAX)
    return "block table stride must be in [1, 2^31), got " + std::to_string(b.block_table_stride);
  return "";
}

std::string buffers_problem(const ValidLayout& layout, const CacheBuffers& buffers, int64_t layer) {
  const Layout& l = layout.layout();
  if (buffers.count != int(l.buffers.size()))
    return "layout \"" + l.name + "\" has " + std::to_string(l.buffers.size()) + " buffers, got " +
           std::to_string(buffers.count);
  for (int b = 0; b < buffers.count; ++b)
    if (!buffers.ptr[b]) return "buffer \"" + l.buffers[size_t(b)].name + "\" is null";
  if (layer < 0 || layer >= l.dims.layers)
    return "layer " + std::to_string(layer) + " outside [0, " + std::to_string(l.dims.layers) + ")";
  return "";
}

namespace {

std::string scales_problem(const float* k, const float* v) {
  return (k && v) ? "" : "the K and V global scales (pointers to float) are required";
}

}  // namespace

std::string store_problem(const ValidLayout& layout, const CacheBuffers& buffers, const StoreArgs& a) {
  if (std::string p = buffers_problem(layout, buffers, a.layer); !p.empty()) return p;
  if (std::string p = scales_problem(a.k_global_scale, a.v_global_scale); !p.empty()) return p;
  const CacheDims& d = layout.layout().dims;
  if (a.rows.tokens < 0) return "negative token count " + std::to_string(a.rows.tokens);
  // A format fixes the scale rules; the call's rule may only repeat them (or stay at the default).
  if (const CacheFormat& f = layout.format(); !f.implicit() && a.rule != ScaleRule::kStandard) {
    const LayerFormat lf = f.layer(a.layer);
    for (Side s : {Side::kK, Side::kV})
      if (lf.side(s).rule != a.rule)
        return std::string("rule: the call asks for ") + scale_rule_name(a.rule) + " but the layout's format stores " +
               (s == Side::kK ? "K" : "V") + " of layer " + std::to_string(a.layer) + " with " +
               scale_rule_name(lf.side(s).rule) + " (the format's rules apply; leave the call's rule at standard)";
  }
  // Without a format the call's rule applies to the NVFP4 sides: one side at least must be NVFP4.
  if (layout.format().implicit() && a.rule != ScaleRule::kStandard && d.fp8(Side::kK) && d.fp8(Side::kV))
    return std::string("rule: ") + scale_rule_name(a.rule) +
           " is NVFP4's block rule, and this layout holds K and V as fp8_e4m3 (no blocks); leave it at standard";
  if (a.rows.tokens == 0) return "";
  if (!a.rows.k || !a.rows.v || !a.slots) return "K rows, V rows and slots are required";
  if (a.rows.token_stride < d.heads * d.head_dim)
    return "token stride " + std::to_string(a.rows.token_stride) + " is smaller than heads * head dim = " +
           std::to_string(d.heads * d.head_dim) + " (rows must be (tokens, heads, D) with D contiguous)";
  return "";
}

std::string gather_problem(const ValidLayout& layout, const CacheBuffers& buffers, const GatherArgs& a) {
  if (std::string p = buffers_problem(layout, buffers, a.layer); !p.empty()) return p;
  if (std::string p = scales_problem(a.k_global_scale, a.v_global_scale); !p.empty()) return p;
  if (std::string p = batch_problem(a.batch, BatchForm::kOffsets); !p.empty()) return p;
  if (a.batch.batch > 0 && (!a.k_out || !a.v_out)) return "both outputs (K and V rows) are required";
  return "";
}

namespace {

// The rules decode and prefill share: the query's heads and rows, the softmax
// scale and the options.
struct QueryShape {
  int64_t q_heads, q_token_stride;
  float softmax_scale;
  int64_t window;
  float softcap;
};

std::string attention_problem(const ValidLayout& layout, const CacheBuffers& buffers, int64_t layer, const float* kgs,
                              const float* vgs, const BatchDescriptor& batch, const QueryShape& a) {
  if (std::string p = buffers_problem(layout, buffers, layer); !p.empty()) return p;
  if (std::string p = scales_problem(kgs, vgs); !p.empty()) return p;
  if (std::string p = batch_problem(batch, BatchForm::kLengthsOrOffsets); !p.empty()) return p;
  const CacheDims& d = layout.layout().dims;
  if (a.q_heads < 1 || a.q_heads % d.heads != 0)
    return "q_heads must be a positive multiple of the layout's " + std::to_string(d.heads) + " kv heads, got " +
           std::to_string(a.q_heads);
  if (a.q_heads / d.heads > 16)
    return "at most 16 query heads per kv head, got " + std::to_string(a.q_heads / d.heads);
  if (a.q_token_stride != 0 && a.q_token_stride < a.q_heads * d.head_dim)
    return "q_token_stride " + std::to_string(a.q_token_stride) + " is smaller than q_heads * head dim = " +
           std::to_string(a.q_heads * d.head_dim);
  if (!(a.softmax_scale > 0) || !(a.softmax_scale < 3.0e38f))
    return "softmax_scale must be finite and > 0, got " + std::to_string(a.softmax_scale);
  if (a.window < 0) return "window must be >= 0 (0: the whole sequence), got " + std::to_string(a.window);
  if (!(a.softcap >= 0) || !(a.softcap < 3.0e38f))
    return "softcap must be finite and >= 0 (0: off), got " + std::to_string(a.softcap);
  return "";
}

}  // namespace

std::string decode_problem(const ValidLayout& layout, const CacheBuffers& buffers, const DecodeArgs& a) {
  if (std::string p = attention_problem(layout, buffers, a.layer, a.k_global_scale, a.v_global_scale, a.batch,
                                        {a.q_heads, a.q_token_stride, a.softmax_scale, a.window, a.softcap});
      !p.empty())
    return p;
  if (a.batch.batch > 0 && !a.q) return "the query is required";
  return "";
}

DecodeArgs decode_args_of(const PrefillArgs& a) {
  DecodeArgs d;
  d.q = a.q;
  d.q_type = a.q_type;
  d.q_heads = a.q_heads;
  d.q_token_stride = a.q_token_stride;
  d.batch = a.batch;
  d.layer = a.layer;
  d.softmax_scale = a.softmax_scale;
  d.k_global_scale = a.k_global_scale;
  d.v_global_scale = a.v_global_scale;
  d.window = a.window;
  d.softcap = a.softcap;
  d.sinks = a.sinks;
  d.out = a.out;
  d.lse = a.lse;
  d.status = a.status;
  d.k_mean = a.k_mean;
  d.k_channel_scale = a.k_channel_scale;
  return d;
}

std::string prefill_problem(const ValidLayout& layout, const CacheBuffers& buffers, const PrefillArgs& a) {
  if (std::string p = attention_problem(layout, buffers, a.layer, a.k_global_scale, a.v_global_scale, a.batch,
                                        {a.q_heads, a.q_token_stride, a.softmax_scale, a.window, a.softcap});
      !p.empty())
    return p;
  if (a.max_q_len < 0 || a.max_q_len > INT32_MAX)
    return "max_q_len must be in [0, 2^31), got " + std::to_string(a.max_q_len);
  if (a.batch.batch == 0) return "";
  if (!a.cu_seqlens_q) return "cu_seqlens_q (batch + 1 query row offsets) is required";
  if (a.max_q_len > 0 && !a.q) return "the query is required";
  return "";
}

}  // namespace nvfp4kv
