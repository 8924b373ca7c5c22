#pragma once
// Independent transcriptions of engines' own index arithmetic (issue 13): where
// each engine's writer and reader put one element of an NVFP4 KV cache, written
// from the engine's code in its own terms - tensor shapes and strides, pointer
// offsets, torch reshape/permute - citing the file and version each comes from.
// They share nothing with the presets' JSON. test_engine_formulas.cpp holds every
// preset to them byte for byte; test_conformance.cpp builds foreign writers and
// readers from them to test the conformance kit.
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv::engines {

// Where an engine puts one element: the allocation (named as the preset names
// it) and the byte in it.
struct Place {
  std::string buffer;
  int64_t byte = 0;
  bool operator==(const Place&) const = default;
};

using Transcription = std::function<Place(Region, const Coord&, const CacheDims&)>;

inline bool is_v(Region r) { return r == Region::kVData || r == Region::kVScale; }

// torch's reshape(shape).permute(perm).contiguous() for one element: the flat
// row-major index `flat` of the input lands at the returned flat index.
inline int64_t reshape_permute(int64_t flat, const std::vector<int64_t>& shape, const std::vector<int>& perm) {
  std::vector<int64_t> index(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    index[k] = flat % shape[k];
    flat /= shape[k];
  }
  int64_t out = 0;
  for (int k : perm) out = out * shape[size_t(k)] + index[size_t(k)];
  return out;
}

// ---- vLLM ------------------------------------------------------------------------
// csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu: reshape_and_cache_nvfp4_dispatch
// and reshape_and_cache_nvfp4_kernel. Legacy 5-D cache (B, 2, N, H, F) of
// #37332/#40177; packed 4-D cache (B, 2H, N, F), main as of 2026-07-30; the
// SM12x branch (#46329) adds swizzle_v_sf = major < 12. Readers:
// vllm/utils/torch_utils.py nvfp4_split_data_scale; the V-scale order SM100's
// trtllm-gen reads is FlashInfer's (flashinfer/quantization/fp4_quantization.py,
// nvfp4_quantize_paged_kv_cache).
struct VllmCache {
  bool packed = false;  // (B, 2H, N, F) rather than (B, 2, N, H, F)
  bool hnd = false;     // physical order: heads outside tokens
};

// The K side as the writer's dispatch receives it, key_cache: logical
// [num_blocks, block_size, num_heads, full_dim], with its strides; and where
// value_cache starts relative to it.
struct KeyCacheView {
  int64_t stride0, stride1, stride2, value_offset;
};

inline KeyCacheView key_cache_view(VllmCache c, const CacheDims& d) {
  const int64_t H = d.heads, N = d.tokens_per_page, F = d.head_dim / 2 + d.head_dim / 16;
  if (!c.packed)  // kv_cache[:, 0] and kv_cache[:, 1] of (B, 2, N, H, F), stored (B, 2, H, N, F) for HND
    return c.hnd ? KeyCacheView{2 * H * N * F, F, N * F, H * N * F} : KeyCacheView{2 * H * N * F, H * F, F, N * H * F};
  // kv_cache[:, :H] and kv_cache[:, H:] of (B, 2H, N, F), stored (B, N, 2H, F) for NHD, as [B, N, H, F]
  return c.hnd ? KeyCacheView{2 * H * N * F, F, N * F, H * N * F} : KeyCacheView{2 * H * N * F, 2 * H * F, F, H * F};
}

inline Place vllm_writer(VllmCache cache, bool swizzle_v_sf, Region r, const Coord& c, const CacheDims& d) {
  const int64_t num_heads = d.heads, block_size = d.tokens_per_page;
  const int64_t data_dim = d.head_dim / 2, scale_dim = d.head_dim / 16;
  const KeyCacheView key_cache = key_cache_view(cache, d);
  // reshape_and_cache_nvfp4_dispatch
  const bool is_hnd = key_cache.stride2 > key_cache.stride1;
  const int64_t data_block_stride = key_cache.stride0;
  const int64_t data_head_stride = is_hnd ? block_size * data_dim : data_dim;
  const int64_t data_block_offset_stride = is_hnd ? data_dim : num_heads * data_dim;
  const int64_t data_per_kv = num_heads * block_size * data_dim;
  const int64_t scale_block_stride = data_block_stride;
  const int64_t scale_head_stride = is_hnd ? block_size * scale_dim : scale_dim;
  const int64_t scale_block_offset_stride = is_hnd ? scale_dim : num_heads * scale_dim;
  // reshape_and_cache_nvfp4_kernel, for block_idx = page, block_offset = token
  const int64_t side = is_v(r) ? key_cache.value_offset : 0;
  const int64_t head = c.head, block_offset = c.token;
  if (!is_scale(r)) {
    const int64_t data_dst =
        side + c.page * data_block_stride + head * data_head_stride + block_offset * data_block_offset_stride;
    return {"kv", data_dst + c.column};  // group g's 8 bytes at g*8: byte j of the row
  }
  const int64_t scale_block = side + data_per_kv + c.page * scale_block_stride;
  const int64_t scale_idx = c.column;
  if (!is_v(r) || !swizzle_v_sf)
    return {"kv", scale_block + head * scale_head_stride + block_offset * scale_block_offset_stride + scale_idx};
  // swizzle_scale_offset(t, s, scale_dim), split back into (row, column) by the kernel
  const int64_t s_group = scale_dim / 4;
  const int64_t swizzled_t = (block_offset / 4) * 4 + (scale_idx / s_group);
  const int64_t swizzled_s = (scale_idx % s_group) * 4 + (block_offset % 4);
  const int64_t swizzled_offset = swizzled_t * scale_dim + swizzled_s;
  return {"kv", scale_block + head * scale_head_stride + (swizzled_offset / scale_dim) * scale_block_offset_stride +
                    swizzled_offset % scale_dim};
}

// nvfp4_split_data_scale(kv_side) on the side the attention backend hands it:
// kv_cache[:, 0] / [:, 1] (legacy, dims (N, H)) or kv_cache.split(H, dim=1) (packed, dims (H, N)).
struct SideView {
  int64_t base, page_bytes, stride1, stride2, dim1, dim2;
  bool dim1_is_token;
};

inline SideView side_view(VllmCache c, bool v, const CacheDims& d) {
  const int64_t H = d.heads, N = d.tokens_per_page, F = d.head_dim / 2 + d.head_dim / 16;
  if (!c.packed) {
    const int64_t t_stride = c.hnd ? F : H * F, h_stride = c.hnd ? N * F : F;
    return {v ? H * N * F : 0, 2 * H * N * F, t_stride, h_stride, N, H, true};
  }
  const int64_t h_stride = c.hnd ? N * F : F, t_stride = c.hnd ? F : 2 * H * F;
  return {v ? (c.hnd ? H * N * F : H * F) : 0, 2 * H * N * F, h_stride, t_stride, H, N, false};
}

inline Place vllm_reader(VllmCache cache, bool sm100, Region r, const Coord& c, const CacheDims& d) {
  const SideView s = side_view(cache, is_v(r), d);
  const int64_t full_dim = d.head_dim / 2 + d.head_dim / 16;
  const int64_t data_dim = full_dim * 8 / 9, scale_dim = full_dim - data_dim;
  const int64_t data_per_kv = s.dim1 * s.dim2 * data_dim;
  const int64_t x1 = s.dim1_is_token ? c.token : c.head, x2 = s.dim1_is_token ? c.head : c.token;
  if (!is_scale(r))
    return {"kv", s.base + c.page * s.page_bytes + x1 * (s.stride1 * data_dim / full_dim) +
                      x2 * (s.stride2 * data_dim / full_dim) + c.column};
  const int64_t scale_base = s.base + data_per_kv + c.page * s.page_bytes;
  const int64_t st1 = s.stride1 * scale_dim / full_dim, st2 = s.stride2 * scale_dim / full_dim;
  const int64_t token_stride = s.dim1_is_token ? st1 : st2, head_stride = s.dim1_is_token ? st2 : st1;
  int64_t t = c.token, g = c.column;
  if (sm100 && is_v(r)) {  // trtllm-gen reads the (page, head) plane in FlashInfer's swizzled order
    const int64_t n = d.tokens_per_page;
    const int64_t at = reshape_permute(t * scale_dim + g, {n / 4, 4, 4, scale_dim / 4}, {0, 2, 3, 1});
    t = at / scale_dim;
    g = at % scale_dim;
  }
  return {"kv", scale_base + c.head * head_stride + t * token_stride + g};
}

// The physical rows of the packed NHD tensor (B, N, 2H, F), read literally:
// row (t, slot) of F bytes, data first, then scales; slots H..2H-1 are V.
inline Place vllm_packed_rows(Region r, const Coord& c, const CacheDims& d) {
  const int64_t H = d.heads, N = d.tokens_per_page, dd = d.head_dim / 2, F = dd + d.head_dim / 16;
  const int64_t slot = c.head + (is_v(r) ? H : 0);
  const int64_t row = c.page * 2 * H * N * F + (c.token * 2 * H + slot) * F;
  return {"kv", row + (is_scale(r) ? dd : 0) + c.column};
}

// ---- FlashInfer -------------------------------------------------------------------
// include/flashinfer/page.cuh paged_kv_t and flashinfer/page.py append_paged_kv_cache
// (NVFP4 paged KV as surveyed late 2026): four contiguous tensors, data uint8
// [pages, H, N, dd] (HND) or [pages, N, H, dd] (NHD), scales [.., sd].
// trtllm-gen V scales: flashinfer/quantization/fp4_quantization.py
// nvfp4_quantize_paged_kv_cache, the linear tensor reshaped and permuted.
inline Place flashinfer(bool hnd, bool trtllm_gen, Region r, const Coord& c, const CacheDims& d) {
  const int64_t P = d.pages, H = d.heads, N = d.tokens_per_page, row = d.columns(r);
  const int64_t row_index = hnd ? (c.page * H + c.head) * N + c.token : (c.page * N + c.token) * H + c.head;
  const int64_t linear = row_index * row + c.column;
  if (!(trtllm_gen && r == Region::kVScale)) return {region_name(r), linear};
  const int64_t S = d.head_dim / 16;
  if (hnd) return {"v_scale", reshape_permute(linear, {P, H, N / 4, 4, 4, S / 4}, {0, 1, 2, 4, 5, 3})};
  return {"v_scale", reshape_permute(linear, {P, N / 4, 4, H, 4, S / 4}, {0, 1, 4, 3, 5, 2})};
}

// ---- SGLang -----------------------------------------------------------------------
// python/sglang/srt/mem_cache/memory_pool.py, MHATokenToKVPoolFP4 (its fp4_e2m1
// mode): per layer k_buffer (slots, H, D/2) and k_scale_buffer (slots, H*D/16),
// V alike, one row per slot, slot = page * page_size + token. Its scales are E8M0
// (not NVFP4), so there is no SGLang preset; this checks that its bytes are
// flashinfer-nhd's. (k_buffer, k_scale_buffer, v_buffer, v_scale_buffer) are
// the preset's (k_data, k_scale, v_data, v_scale).
inline Place sglang_fp4_pool(Region r, const Coord& c, const CacheDims& d) {
  const int64_t slot = c.page * d.tokens_per_page + c.token;
  const int64_t width = d.heads * d.columns(r);  // H*D/2 data bytes or H*D/16 scales per slot
  return {region_name(r), slot * width + c.head * d.columns(r) + c.column};
}

// ---- TensorRT-LLM -------------------------------------------------------------------
// cpp/tensorrt_llm/kernels/unfusedAttentionKernels/unfusedAttentionKernels_2_template.h
// (main, late 2026), applyBiasRopeUpdateKVCache and quantizeAndWriteFP4KVCache:
// KVBlockArray's getKVLocalIdx counts 8-value vectors in a block's [H, N, D/8]
// (head, token, vector); each vector is one uint32 of the block's data, every
// second one writes a block scale. Data pool blocks [2, H, N, dd], K then V; the
// block-scale pool has the same block structure, [2, H, N, sd].
inline Place trtllm(Region r, const Coord& c, const CacheDims& d) {
  const int64_t H = d.heads, N = d.tokens_per_page, dd = d.head_dim / 2, sd = d.head_dim / 16;
  const int64_t vecs_per_head = d.head_dim / 8, num_sfs_per_head = vecs_per_head / 2;
  const int64_t block = c.page, side = is_v(r) ? 1 : 0;
  if (!is_scale(r)) {
    const int64_t in_block_idx = (c.head * N + c.token) * vecs_per_head + c.column / 4;  // 4 bytes per vector
    return {"pool", (block * 2 + side) * H * N * dd + in_block_idx * 4 + c.column % 4};
  }
  const int64_t block_scale_idx_dst = (c.head * N + c.token) * num_sfs_per_head + c.column;  // inBlockIdx / 2
  const int64_t scales = (block * 2 + side) * H * N * sd;
  if (side == 0) return {"scale_pool", scales + block_scale_idx_dst};
  const int64_t token_idx_v = block_scale_idx_dst / num_sfs_per_head;
  const int64_t head_dim_idx_v = block_scale_idx_dst % num_sfs_per_head;
  return {"scale_pool",
          scales + (token_idx_v / 4) * 4 * num_sfs_per_head + head_dim_idx_v * 4 + token_idx_v % 4};
}

// ---- attention.rs / xInfer -------------------------------------------------------------
// The reference doc's record of its buffers (nvfp4-kv-reference.md section 2, late
// 2026): K_fp4 [blocks, N, H, dd], K_sf [blocks, N, H, sd], V alike.
inline Place attention_rs(Region r, const Coord& c, const CacheDims& d) {
  static const char* const kNames[] = {"k_fp4", "k_sf", "v_fp4", "v_sf"};
  const int64_t index = ((c.page * d.tokens_per_page + c.token) * d.heads + c.head) * d.columns(r) + c.column;
  return {kNames[int(r)], index};
}

// ---- nvfp4kv native ----------------------------------------------------------------------
// docs/layouts.md, "The native layout": per (page, head) one span of K data, K
// scales, V data, V scales, each plane padded to 16 bytes; layer outermost when
// all layers share one allocation.
inline Place native(bool layers_in_one, Region r, const Coord& c, const CacheDims& d) {
  const int64_t N = d.tokens_per_page, dd = d.head_dim / 2, sd = d.head_dim / 16;
  const auto pad16 = [](int64_t x) { return (x + 15) / 16 * 16; };
  const int64_t data_plane = pad16(N * dd), scale_plane = pad16(N * sd), span = 2 * (data_plane + scale_plane);
  const int64_t plane[] = {0, data_plane, data_plane + scale_plane, 2 * data_plane + scale_plane};
  int64_t byte = (c.page * d.heads + c.head) * span + plane[int(r)] + c.token * d.columns(r) + c.column;
  if (layers_in_one) byte += c.layer * d.pages * d.heads * span;
  return {"kv", byte};
}

inline const std::map<std::string, Transcription>& transcriptions() {
  using namespace std::placeholders;
  const VllmCache legacy_hnd{false, true}, legacy_nhd{false, false}, packed_hnd{true, true}, packed_nhd{true, false};
  static const std::map<std::string, Transcription> all = {
      {"vllm-legacy-hnd-writer-upstream", std::bind(vllm_writer, legacy_hnd, true, _1, _2, _3)},
      {"vllm-legacy-hnd-writer-sm12x", std::bind(vllm_writer, legacy_hnd, false, _1, _2, _3)},
      {"vllm-legacy-hnd-reader-sm100", std::bind(vllm_reader, legacy_hnd, true, _1, _2, _3)},
      {"vllm-legacy-hnd-reader-sm120", std::bind(vllm_reader, legacy_hnd, false, _1, _2, _3)},
      {"vllm-legacy-nhd-writer-upstream", std::bind(vllm_writer, legacy_nhd, true, _1, _2, _3)},
      {"vllm-legacy-nhd-writer-sm12x", std::bind(vllm_writer, legacy_nhd, false, _1, _2, _3)},
      {"vllm-legacy-nhd-reader-sm120", std::bind(vllm_reader, legacy_nhd, false, _1, _2, _3)},
      {"vllm-packed-hnd-writer-upstream", std::bind(vllm_writer, packed_hnd, true, _1, _2, _3)},
      {"vllm-packed-hnd-writer-sm12x", std::bind(vllm_writer, packed_hnd, false, _1, _2, _3)},
      {"vllm-packed-hnd-reader-sm100", std::bind(vllm_reader, packed_hnd, true, _1, _2, _3)},
      {"vllm-packed-hnd-reader-sm120", std::bind(vllm_reader, packed_hnd, false, _1, _2, _3)},
      {"vllm-packed-nhd-writer-upstream", std::bind(vllm_writer, packed_nhd, true, _1, _2, _3)},
      {"vllm-packed-nhd-writer-sm12x", std::bind(vllm_writer, packed_nhd, false, _1, _2, _3)},
      {"vllm-packed-nhd-reader-sm120", std::bind(vllm_reader, packed_nhd, false, _1, _2, _3)},
      {"vllm-packed-nhd-rows", vllm_packed_rows},
      {"flashinfer-hnd", std::bind(flashinfer, true, false, _1, _2, _3)},
      {"flashinfer-nhd", std::bind(flashinfer, false, false, _1, _2, _3)},
      {"flashinfer-trtllm-gen-hnd", std::bind(flashinfer, true, true, _1, _2, _3)},
      {"flashinfer-trtllm-gen-nhd", std::bind(flashinfer, false, true, _1, _2, _3)},
      {"trtllm", trtllm},
      {"attention-rs", attention_rs},
      {"nvfp4kv-native", std::bind(native, false, _1, _2, _3)},
      {"nvfp4kv-native-v1", std::bind(native, false, _1, _2, _3)},  // the same places, the standard code order
      {"nvfp4kv-native-layers", std::bind(native, true, _1, _2, _3)},
      {"nvfp4kv-native-layers-v1", std::bind(native, true, _1, _2, _3)},
  };
  return all;
}

}  // namespace nvfp4kv::engines
