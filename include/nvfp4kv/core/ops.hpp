#pragma once
// The operations on a cache, each described once: the GPU API, its kernels and
// the CPU reference take the same argument structs (device pointers for the GPU,
// host pointers for the reference) and are checked by the same rules
// (*_problem below). Built by field name, never by position.
#include <string>

#include "nvfp4kv/core/batch.hpp"
#include "nvfp4kv/core/cache_buffers.hpp"
#include "nvfp4kv/core/format.hpp"
#include "nvfp4kv/core/half.hpp"
#include "nvfp4kv/core/status.hpp"

namespace nvfp4kv {

class ValidLayout;

// K and V rows: (tokens, heads, D) elements with a free token stride (elements
// between consecutive tokens, >= heads * D).
struct KvRows {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t tokens = 0;
  int64_t token_stride = 0;
  NVFP4KV_HD const void* side(Side s) const { return s == Side::kK ? k : v; }
};

// Quantize K and V rows into the cache through a slot mapping (slot = page * N + token).
struct StoreArgs {
  KvRows rows;
  ElementType type = ElementType::kBFloat16;  // bf16 or fp16 (the reference also takes fp32)
  const void* slots = nullptr;                // (tokens) int32 or int64; < 0 = padding
  bool slots_are_int64 = false;
  int64_t layer = 0;
  const float* k_global_scale = nullptr;      // dequant multipliers; device memory for the GPU (graph capture)
  const float* v_global_scale = nullptr;
  ScaleRule rule = ScaleRule::kStandard;      // a layout without a format: both sides; with one, the
                                              // format's rules apply (this may only repeat them)
  DeviceStatus* status = nullptr;             // optional counters
  // The layer format's K smoothing vector for the GPU: a device copy of the layout's
  // format.k_mean (layers x kv heads x D floats, the same values), required exactly when
  // the format smooths K. The CPU reference reads the format itself and ignores it.
  const float* k_mean = nullptr;
  // The same for K's channel scale: a device copy of format.k_channel_scale (layers x kv
  // heads x D floats), required exactly when the format has one.
  const float* k_channel_scale = nullptr;

  NVFP4KV_HD int64_t slot(int64_t i) const {
    return slots_are_int64 ? static_cast<const int64_t*>(slots)[i] : int64_t(static_cast<const int32_t*>(slots)[i]);
  }
  NVFP4KV_HD const float* global_scale(Side s) const { return s == Side::kK ? k_global_scale : v_global_scale; }
};

// Dequantize the pages of a batch to dense rows: sequence i fills rows
// [cu_seqlens[i], cu_seqlens[i+1]) of (rows, heads, D) outputs.
struct GatherArgs {
  BatchDescriptor batch;  // offsets form
  int64_t layer = 0;
  const float* k_global_scale = nullptr;
  const float* v_global_scale = nullptr;
  ElementType out_type = ElementType::kBFloat16;  // bf16 or fp16 (the reference also writes fp32)
  void* k_out = nullptr;
  void* v_out = nullptr;
  DeviceStatus* status = nullptr;
  // With a format that rotates or smooths: false gives the original values (rotation
  // undone, mu added back), true the values as stored (rotated, mu subtracted).
  bool stored_values = false;
  // The layer format's K smoothing vector for the GPU: a device copy of the layout's
  // format.k_mean (layers x kv heads x D floats, the same values), required exactly when
  // the format smooths K. The CPU reference reads the format itself and ignores it.
  const float* k_mean = nullptr;
  // The same for K's channel scale: a device copy of format.k_channel_scale (layers x kv
  // heads x D floats), required exactly when the format has one.
  const float* k_channel_scale = nullptr;

  NVFP4KV_HD const float* global_scale(Side s) const { return s == Side::kK ? k_global_scale : v_global_scale; }
  NVFP4KV_HD void* out(Side s) const { return s == Side::kK ? k_out : v_out; }
};

// Paged decode attention: one query token per sequence against that sequence's
// pages. out[b, h] = sum_t p_t V[t, kv(h)] with p = softmax over the sequence's
// tokens (and the sink logit, when given) of logit_t = softcap(softmax_scale *
// Q[b, h] . K[t, kv(h)]); kv(h) = h / (q_heads / kv heads). K and V are the
// dequantized cache (e2m1 * block scale * global scale), taken back to the original values
// where the layout's format rotates or smooths them (cache_format.hpp).
struct DecodeArgs {
  const void* q = nullptr;        // (batch, q_heads, D) rows of q_type; batch rows q_token_stride elements apart
  ElementType q_type = ElementType::kBFloat16;  // bf16 or fp16; the output has the same type
  int64_t q_heads = 0;            // a multiple of the layout's kv heads, at most 16 per kv head
  int64_t q_token_stride = 0;     // elements between batch rows (0: q_heads * D)
  BatchDescriptor batch;          // block tables and kv lengths (lengths or offsets form)
  int64_t layer = 0;
  float softmax_scale = 0;        // e.g. 1 / sqrt(D); > 0
  const float* k_global_scale = nullptr;  // dequant multipliers; device memory for the GPU
  const float* v_global_scale = nullptr;
  int64_t window = 0;             // > 0: attend to the last `window` tokens of each sequence only
  float softcap = 0;              // > 0: logits become softcap * tanh(logits / softcap)
  const float* sinks = nullptr;   // optional (q_heads): a logit per head that joins the softmax
                                  // denominator only (no value); device memory for the GPU
  void* out = nullptr;            // (batch, q_heads, D) of q_type, contiguous
  float* lse = nullptr;           // optional (batch, q_heads): natural log of the softmax denominator
  DeviceStatus* status = nullptr; // optional counters (bad pages, bad lengths, bad global scales)
  void* workspace = nullptr;      // GPU: decode_workspace_bytes(...) bytes, 256-byte aligned
  size_t workspace_bytes = 0;
  // The layer format's K smoothing vector for the GPU: a device copy of the layout's
  // format.k_mean (layers x kv heads x D floats, the same values), required exactly when
  // the format smooths K. The CPU reference reads the format itself and ignores it.
  const float* k_mean = nullptr;
  // The same for K's channel scale: a device copy of format.k_channel_scale (layers x kv
  // heads x D floats), required exactly when the format has one.
  const float* k_channel_scale = nullptr;

  NVFP4KV_HD const float* global_scale(Side s) const { return s == Side::kK ? k_global_scale : v_global_scale; }
};

// Paged prefill / extend attention: a varlen batch of new query tokens per
// sequence against that sequence's pages, causally. Sequence s has q_len =
// cu_seqlens_q[s + 1] - cu_seqlens_q[s] new tokens (rows cu_seqlens_q[s] .. of q
// and out) and kv_len tokens in its pages (batch: block table and lengths, the
// new tokens included: they are stored first). Its query i sits at position
// p = kv_len - q_len + i and attends to the tokens t <= p (t > p - window when
// window > 0): out[row, h] = sum_t p_t V[t, kv(h)], p = softmax over those tokens
// (and the sink logit) of softcap(softmax_scale * Q[row, h] . K[t, kv(h)]). With
// q_len 1 this is DecodeArgs' operation; the LSE follows the same convention, so
// partial results merge as decode's splits do.
struct PrefillArgs {
  const void* q = nullptr;        // (rows, q_heads, D) of q_type; rows q_token_stride elements apart
  ElementType q_type = ElementType::kBFloat16;  // bf16 or fp16; the output has the same type
  int64_t q_heads = 0;            // a multiple of the layout's kv heads, at most 16 per kv head
  int64_t q_token_stride = 0;     // elements between query rows (0: q_heads * D)
  const int32_t* cu_seqlens_q = nullptr;  // (batch + 1) row offsets of each sequence's new tokens
  int64_t max_q_len = 0;          // >= every q_len (host-known: it sizes the launch; a longer
                                  // sequence is counted as a bad length and its rows are NaN)
  BatchDescriptor batch;          // block tables and kv lengths (lengths or offsets form)
  int64_t layer = 0;
  float softmax_scale = 0;        // e.g. 1 / sqrt(D); > 0
  const float* k_global_scale = nullptr;  // dequant multipliers; device memory for the GPU
  const float* v_global_scale = nullptr;
  int64_t window = 0;             // > 0: query at p attends to (p - window, p] only
  float softcap = 0;              // > 0: logits become softcap * tanh(logits / softcap)
  const float* sinks = nullptr;   // optional (q_heads): a logit per head in the denominator only
  void* out = nullptr;            // (rows, q_heads, D) of q_type, contiguous
  float* lse = nullptr;           // optional (rows, q_heads): natural log of the softmax denominator
  DeviceStatus* status = nullptr; // optional counters (bad pages, bad lengths, bad global scales)
  // The layer format's K smoothing vector for the GPU: a device copy of the layout's
  // format.k_mean (layers x kv heads x D floats, the same values), required exactly when
  // the format smooths K. The CPU reference reads the format itself and ignores it.
  const float* k_mean = nullptr;
  // The same for K's channel scale: a device copy of format.k_channel_scale (layers x kv
  // heads x D floats), required exactly when the format has one.
  const float* k_channel_scale = nullptr;

  NVFP4KV_HD const float* global_scale(Side s) const { return s == Side::kK ? k_global_scale : v_global_scale; }
  // Raw q length of sequence s (may be negative or above max_q_len: the kernels count it).
  NVFP4KV_HD int64_t raw_q_length(int64_t s) const { return int64_t(cu_seqlens_q[s + 1]) - int64_t(cu_seqlens_q[s]); }
};

// Decode's arguments for the same batch, options and outputs when every q length
// is 1 (the mixed-batch call routes such runs to decode; the reference tests
// compare the two definitions): q rows are taken as the batch's rows.
DecodeArgs decode_args_of(const PrefillArgs& a);

// The tokens sequence s's queries read: [first, kv_len) where the first query's
// window starts (0 without a window). q_len and kv_len as used, 0 <= q_len <= kv_len.
NVFP4KV_HD int64_t prefill_first_token(int64_t q_len, int64_t kv_len, int64_t window) {
  const int64_t first_position = kv_len - q_len;
  return window > 0 ? (first_position - window + 1 > 0 ? first_position - window + 1 : 0) : 0;
}

// Why the arguments cannot be used with this layout ("" when they can), by the
// rules the GPU and the reference share; each names the argument. The GPU API
// adds its own (alignment, supported element types).
std::string buffers_problem(const ValidLayout& layout, const CacheBuffers& buffers, int64_t layer);
std::string store_problem(const ValidLayout& layout, const CacheBuffers& buffers, const StoreArgs& args);
std::string gather_problem(const ValidLayout& layout, const CacheBuffers& buffers, const GatherArgs& args);
std::string decode_problem(const ValidLayout& layout, const CacheBuffers& buffers, const DecodeArgs& args);
std::string prefill_problem(const ValidLayout& layout, const CacheBuffers& buffers, const PrefillArgs& args);

}  // namespace nvfp4kv
