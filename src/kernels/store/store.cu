// Quantize-and-store. A thread owns one 16-element group of one side of one
// token and walks that token's heads, so the per-token work (slot lookup and
// checks, global scales, page/token coordinates, the layout offsets) is done
// once per thread and amortized over the heads; the next head's addresses are
// the layout's head step added on. Consecutive threads take consecutive groups
// of a row: the input is read in contiguous 32-byte pieces per thread.
// Every address comes from the validated LayoutView; the block quantization is
// core's code, shared with the CPU reference: quantize_finite_block
// (packed_block.hpp, proven equal to quantize_block by tests/cpu) for the
// standard rule, quantize_block itself for 4over6 and non-finite inputs. The
// quantizer rounds by explicit operations (format.hpp), so this file builds
// with FMA contraction on and stays bit-exact.
#include "../common/device.cuh"
#include "../common/dispatch.cuh"
#include "../common/token_block.hpp"
#include "../common/row_transforms.cuh"
#include "nvfp4kv/core/packed_block.hpp"
#include "params.hpp"

#include <algorithm>

namespace nvfp4kv::kernels {
namespace {

// quantize_block on the widened floats: 4over6, and blocks holding Inf or NaN.
// Not inlined: the standard rule's loop stays small (registers) and rarely calls it.
template <ElementType kType, ScaleRule kRule>
__device__ __noinline__ PackedBlock quantize_general(uint4 lo, uint4 hi, float gs, DeviceStatus* status) {
  const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  float x[kBlockSize];
#pragma unroll
  for (int i = 0; i < 8; ++i) x[2 * i] = low_element<kType>(w[i]), x[2 * i + 1] = high_element<kType>(w[i]);
  const QuantizedBlock b = quantize_block(x, gs, kRule);
  if (b.non_finite && status) atomicAdd(&status->non_finite, (unsigned long long)b.non_finite);
  PackedBlock q;
  q.scale = b.scale;
#pragma unroll
  for (int i = 0; i < 2; ++i)
    q.data[i] = uint32_t(b.packed[4 * i]) | uint32_t(b.packed[4 * i + 1]) << 8 | uint32_t(b.packed[4 * i + 2]) << 16 |
                uint32_t(b.packed[4 * i + 3]) << 24;
  return q;
}

template <ElementType kType, ScaleRule kRule>
__device__ __forceinline__ PackedBlock quantize(const uint4& lo, const uint4& hi, float gs, DeviceStatus* status) {
  if constexpr (kRule == ScaleRule::kStandard) {
    // Fast path: the standard rule on a block of finite elements (packed_block.hpp).
    const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    const uint32_t amax = packed_amax<kType>(w);
    if (amax < non_finite_floor<kType>()) return quantize_finite_block<kType>(w, amax, gs);
  }
  return quantize_general<kType, kRule>(lo, hi, gs, status);
}

// Whether a token's rows are stored: its slot in the layer and both global scales usable. The
// scales live in device memory (graph capture), so they are checked here: a zero, negative or
// non-finite scale would put NaN block scales in the cache. One thread per token (counter)
// counts it: padding, out of range, a bad global scale, or stored.
__device__ __forceinline__ bool admit_token(const StoreArgs& a, const CacheDims& d, int64_t slot, bool counter) {
  if (slot < 0 || slot >= d.pages * d.tokens_per_page) {
    if (counter && a.status) atomicAdd(slot < 0 ? &a.status->padding : &a.status->out_of_range, 1ull);
    return false;
  }
  if (!global_scale_usable(*a.k_global_scale) || !global_scale_usable(*a.v_global_scale)) {
    if (counter && a.status) atomicAdd(&a.status->bad_global_scale, 1ull);
    return false;
  }
  if (counter && a.status) atomicAdd(&a.status->stored, 1ull);
  return true;
}

// Input rows reach shared memory by cp.async, kStages - 1 heads ahead of the head
// being quantized: the loads in flight cost no registers, so the quantization
// keeps the occupancy it needs. Each thread reads back only what it copied
// itself, so per-thread cp.async groups order everything (no barrier).
constexpr int kStages = 4;
constexpr int kMaxThreads = 128;  // token_block(d, 128) never gives more
// Registers: on sm_90 the standard rule fits 72 without spilling (7 CTAs of 128
// threads per SM, 44 % occupancy); the Blackwell path needs up to 96 (5 CTAs); 4over6
// needs more and is not bandwidth-critical.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
constexpr int kStandardMinBlocks = 5;
#else
constexpr int kStandardMinBlocks = 7;
#endif

struct StoreShared {
  uint4 stage[kStages][2][kMaxThreads];  // (stage, 16-byte half of a group, thread)
};

// Who a thread is: its group of a row, its side, its slot in the CTA, the batch
// row it stores, and which heads it walks (every head_stride-th from first_head).
struct StoreThread {
  int group;
  Side side;
  int slot;
  int64_t token;
  int64_t first_head, head_stride;
};

// A group's two data words into an order other than standard and fp16-split, bit by bit
// (out of line: rare, and it keeps the store's loop registers for the common orders).
__device__ __noinline__ uint2 encode_general(CodeOrder codes, uint32_t a, uint32_t b) {
  return make_uint2(codes.encode_word(a), codes.encode_word(b));
}

// An FP8 side's group: 16 E4M3 codes, each fp8_encode_element of the widened input (core's
// codec, the reference's), non-finite inputs stored as 0 and counted.
template <ElementType kType>
__device__ __forceinline__ uint4 encode_fp8_group(const uint4& lo, const uint4& hi, float inv, DeviceStatus* status) {
  const uint32_t in[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  uint32_t out[4] = {0, 0, 0, 0};
  unsigned non_finite = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float x0 = low_element<kType>(in[i]), x1 = high_element<kType>(in[i]);
    non_finite += (fp8_input_finite(x0) ? 0u : 1u) + (fp8_input_finite(x1) ? 0u : 1u);
    const uint32_t pair = uint32_t(fp8_encode_element(x0, inv)) | uint32_t(fp8_encode_element(x1, inv)) << 8;
    out[i / 2] |= pair << (16 * (i % 2));
  }
  if (non_finite && status) atomicAdd(&status->non_finite, (unsigned long long)non_finite);
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// kFp8: the layout holds a side in FP8 (instances of their own, so that the NVFP4-only ones
// are what they were): that side's threads write 16 E4M3 bytes a group and no scale.
template <ElementType kType, ScaleRule kRule, int kHeadDim, bool kFp8>
__device__ __forceinline__ void store_device(const StoreParams& p, StoreShared& smem, const StoreThread& th) {
  const CacheDims& d = p.layout.dims();
  const StoreArgs& a = p.args;
  if (th.token >= a.rows.tokens) return;
  const int64_t slot = a.slot(th.token);
  if (!admit_token(a, d, slot, th.group == 0 && th.side == Side::kK && th.first_head == 0)) return;
  const float kgs = *a.k_global_scale, vgs = *a.v_global_scale;
  const float gs = th.side == Side::kK ? kgs : vgs;
  const SideRegions reg = side_regions(th.side);
  // capacity < 2^31 is checked on the host, so a 32-bit division suffices.
  const uint32_t n = uint32_t(d.tokens_per_page), s32 = uint32_t(slot);
  Coord c{a.layer, int64_t(s32 / n), int64_t(s32 % n), 0, th.group};
  // Head 0's addresses; head h is h * head_step further (LayoutView::head_step).
  const bool fp8 = kFp8 && d.fp8(th.side);  // an FP8 side: no scale region, a byte per element
  uint8_t* const scale_base = fp8 ? nullptr : element_address(p.layout, p.cache, reg.scale, c);
  c.column = th.group * (fp8 ? kBlockSize : kBlockSize / 2);
  uint8_t* const data_base = element_address(p.layout, p.cache, reg.data, c);
  const int64_t scale_head = p.layout.head_step(reg.scale), data_head = p.layout.head_step(reg.data);
  const bool vector_data = p.layout.vector_bytes(reg.data) >= (fp8 ? 16 : 8);
  // Each data word re-encoded unless the order is standard: fp16-split (the native layout's) in
  // a few operations, another order bit by bit.
  const bool standard_codes = p.layout.codes().is_standard(), split_codes = p.layout.codes().is_fp16_split();
  const int64_t head_dim = kHeadDim ? kHeadDim : d.head_dim;
  // 16-byte aligned rows (checked on the host); head h's group starts h * D elements further.
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.rows.side(th.side)) +
                                                    th.token * a.rows.token_stride + th.group * kBlockSize);
  const int64_t head_chunks = head_dim / 8;  // 16-byte chunks per head of an input row
  const int64_t heads =
      th.first_head < d.heads ? (d.heads - th.first_head + th.head_stride - 1) / th.head_stride : 0;
  // One commit per step, empty or not, so "all but the newest kStages - 1 groups
  // done" always means "step j's copies done".
  const auto issue = [&](int64_t j) {
    if (j < heads) {
      const uint4* from = src + (th.first_head + j * th.head_stride) * head_chunks;
      copy_async<16>(&smem.stage[j % kStages][0][th.slot], from);
      copy_async<16>(&smem.stage[j % kStages][1][th.slot], from + 1);
    }
    commit_copies();
  };
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) issue(j);
#pragma unroll 1
  for (int64_t j = 0; j < heads; ++j) {
    issue(j + kStages - 1);  // into the slot step j - 1 read
    wait_copies<kStages - 1>();
    const uint4 lo = smem.stage[j % kStages][0][th.slot], hi = smem.stage[j % kStages][1][th.slot];
    const int64_t h = th.first_head + j * th.head_stride;
    if constexpr (kFp8) {
      if (fp8) {
        const uint4 w = encode_fp8_group<kType>(lo, hi, __frcp_rn(gs), a.status);  // 1 / scale as the reference
        if (vector_data) {
          *reinterpret_cast<uint4*>(data_base + h * data_head) = w;
        } else {  // rows not 16-byte aligned: byte by byte, each through the layout
          const uint32_t words[4] = {w.x, w.y, w.z, w.w};
          Coord cb = c;
          cb.head = h;
          for (int k = 0; k < kBlockSize; ++k, ++cb.column)
            *element_address(p.layout, p.cache, reg.data, cb) = uint8_t(words[k / 4] >> (8 * (k % 4)));
        }
        continue;
      }
    }
    PackedBlock q = quantize<kType, kRule>(lo, hi, gs, a.status);
    if (split_codes)
      q.data[0] = CodeOrder::split_from_standard(q.data[0]), q.data[1] = CodeOrder::split_from_standard(q.data[1]);
    else if (!standard_codes) {
      const uint2 w = encode_general(p.layout.codes(), q.data[0], q.data[1]);
      q.data[0] = w.x, q.data[1] = w.y;
    }
    scale_base[h * scale_head] = q.scale;
    if (vector_data) {
      *reinterpret_cast<uint2*>(data_base + h * data_head) = make_uint2(q.data[0], q.data[1]);
    } else {  // rows not 8-byte aligned: byte by byte, each through the layout
      Coord cb = c;
      cb.head = h;
      for (int k = 0; k < kBlockSize / 2; ++k, ++cb.column)
        *element_address(p.layout, p.cache, reg.data, cb) = uint8_t(q.data[k / 4] >> (8 * (k % 4)));
    }
  }
  wait_copies<0>();  // nothing may still be writing this CTA's shared memory at exit
}

// threadIdx = (group, side, token within the CTA's tokens); blockIdx.y picks
// every gridDim.y-th head (more CTAs when a batch has few tokens).
template <ElementType kType, ScaleRule kRule, int kHeadDim, bool kFp8>
__global__ void __launch_bounds__(kMaxThreads, kRule == ScaleRule::kStandard ? kStandardMinBlocks : 4)
    store_kernel(const __grid_constant__ StoreParams p) {
#if NVFP4KV_KERNEL_ARCH_SUPPORTED
  __shared__ StoreShared smem;
  const StoreThread th{int(threadIdx.x), Side(threadIdx.y),
                       int(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)),
                       int64_t(blockIdx.x) * blockDim.z + threadIdx.z, int64_t(blockIdx.y), int64_t(gridDim.y)};
  store_device<kType, kRule, kHeadDim, kFp8>(p, smem, th);
#else
  __trap();  // unreachable: the API refuses devices older than sm_90 (common/arch.hpp)
#endif
}


// ---- a layer whose format transforms its rows or gives its NVFP4 sides different rules
// One warp per (token, side, head) row: the row in shared memory as floats, the format's
// transforms in the writer's order (common/row_transforms.cuh), then NVFP4 blocks by core's
// quantize_block with the side's rule (a lane per block) or FP8 codes by fp8_encode_element
// (a lane per element), every byte placed through the layout. The reference writes the
// same operations in the same order, so the bytes are equal. Not the bandwidth path: a
// format without transforms keeps the vectorized kernel above, FP8 sides included.
constexpr int kRowWarps = 4;

template <ElementType kType>
__device__ __forceinline__ float input_element(const uint16_t* src, int64_t e) {
  return kType == ElementType::kBFloat16 ? bits_float(uint32_t(src[e]) << 16) : fp16_bits_to_float(src[e]);
}

template <ElementType kType>
__device__ void store_row(const StoreParams& p, float* row, int64_t item, int lane) {
  const CacheDims& d = p.layout.dims();
  const StoreArgs& a = p.args;
  const int64_t token = item / (2 * d.heads), h = item % d.heads;
  const Side side = Side((item / d.heads) % 2);
  const int64_t slot = a.slot(token);
  if (!admit_token(a, d, slot, lane == 0 && side == Side::kK && h == 0)) return;
  const float kgs = *a.k_global_scale, vgs = *a.v_global_scale;
  const SideFormatView& f = p.format.side(side);
  const float* const mu = f.mean_row(h, d.head_dim);
  const float* const lambda = f.channel_scale_row(h, d.head_dim);
  const uint16_t* const src =
      static_cast<const uint16_t*>(a.rows.side(side)) + token * a.rows.token_stride + h * d.head_dim;
  unsigned long long non_finite = 0;
  for (int64_t e = lane; e < d.head_dim; e += 32) {
    float x = input_element<kType>(src, e);
    if (f.transformed()) {  // a NaN rotated would spread over its whole block
      if (!fp8_input_finite(x)) x = 0.0f, ++non_finite;
      if (mu) x = __fsub_rn(x, mu[e]);
      if (lambda) x = __fdiv_rn(x, lambda[e]);
    }
    row[e] = x;
  }
  if (f.rotation > 0) hadamard_row(row, d.head_dim, f.rotation, lane);
  __syncwarp();
  const float gs = side == Side::kK ? kgs : vgs;
  const SideRegions reg = side_regions(side);
  const Coord at{a.layer, slot / d.tokens_per_page, slot % d.tokens_per_page, h, 0};
  if (d.fp8(side)) {  // one E4M3 code per byte, column = element
    const float inv = __frcp_rn(gs);  // 1 / scale, correctly rounded, as the reference divides
    for (int64_t e = lane; e < d.head_dim; e += 32) {
      const float x = row[e];
      non_finite += fp8_input_finite(x) ? 0 : 1;
      Coord c = at;
      c.column = e;
      *element_address(p.layout, p.cache, reg.data, c) = fp8_encode_element(x, inv);
    }
  } else {
    for (int64_t g = lane; g < d.scale_bytes(); g += 32) {
      const QuantizedBlock q = quantize_block(row + g * kBlockSize, gs, f.rule);
      non_finite += q.non_finite;
      Coord c = at;
      c.column = g;
      *element_address(p.layout, p.cache, reg.scale, c) = q.scale;
      for (int j = 0; j < kBlockSize / 2; ++j) {
        c.column = g * (kBlockSize / 2) + j;
        *element_address(p.layout, p.cache, reg.data, c) = p.layout.codes().encode(q.packed[j]);
      }
    }
  }
  if (non_finite && a.status) atomicAdd(&a.status->non_finite, non_finite);
  __syncwarp();  // the row's shared memory is free for the warp's next item
}

template <ElementType kType>
__global__ void __launch_bounds__(kRowWarps * 32) store_rows_kernel(const __grid_constant__ StoreParams p) {
#if NVFP4KV_KERNEL_ARCH_SUPPORTED
  extern __shared__ float rows[];
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const CacheDims& d = p.layout.dims();
  const int64_t items = p.args.rows.tokens * 2 * d.heads;
  for (int64_t item = int64_t(blockIdx.x) * kRowWarps + warp; item < items; item += int64_t(gridDim.x) * kRowWarps)
    store_row<kType>(p, rows + warp * d.head_dim, item, lane);
#else
  __trap();  // unreachable: the API refuses devices older than sm_90 (common/arch.hpp)
#endif
}

}  // namespace

cudaError_t launch_store(const StoreParams& p, cudaStream_t stream) {
  if (p.args.rows.tokens == 0) return cudaSuccess;
  const CacheDims& d = p.layout.dims();
  if (!p.format.vector_store()) {
    const int64_t items = p.args.rows.tokens * 2 * d.heads;
    const unsigned blocks = unsigned(std::min<int64_t>((items + kRowWarps - 1) / kRowWarps, int64_t(1) << 20));
    const size_t smem = size_t(kRowWarps) * size_t(d.head_dim) * sizeof(float);
    return NVFP4KV_DISPATCH_HALF_TYPE(p.args.type, kType, [&] {
      store_rows_kernel<kType><<<blocks, kRowWarps * 32, smem, stream>>>(p);
      return cudaGetLastError();
    });
  }
  StoreParams plain = p;
  plain.args.rule = p.format.nvfp4_rule();  // the format's rule, or the call's where the layout has none
  const bool fp8 = d.fp8(Side::kK) || d.fp8(Side::kV);
  const dim3 block = token_block(d, kMaxThreads);
  const int64_t token_ctas = (plain.args.rows.tokens + block.z - 1) / block.z;
  // Small batches (decode steps) split the heads over more CTAs: aim for about
  // 1024 CTAs, enough to fill any current GPU.
  const int64_t slices = std::min<int64_t>(d.heads, std::max<int64_t>(1, (1024 + token_ctas - 1) / token_ctas));
  const dim3 grid{unsigned(token_ctas), unsigned(slices)};
  return NVFP4KV_DISPATCH_HALF_TYPE(plain.args.type, kType, [&] {
    return NVFP4KV_DISPATCH_SCALE_RULE(plain.args.rule, kRule, [&] {
      return NVFP4KV_DISPATCH_HEAD_DIM(d.head_dim, kHeadDim, [&] {
        if (fp8)
          store_kernel<kType, kRule, kHeadDim, true><<<grid, block, 0, stream>>>(plain);
        else
          store_kernel<kType, kRule, kHeadDim, false><<<grid, block, 0, stream>>>(plain);
        return cudaGetLastError();
      });
    });
  });
}

}  // namespace nvfp4kv::kernels
