// Quantize-and-store: one thread per 16-element block (token, side, head, group).
// Consecutive threads take consecutive groups of one row, so the input is read
// in contiguous 32-byte pieces and each (token, head) row is written contiguously.
// Every address comes from the validated LayoutView; the block quantization is
// core's quantize_block, the same code the CPU reference runs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels.hpp"

namespace nvfp4kv::kernels {
namespace {

constexpr int kThreads = 256;

template <ElementType kType>
__device__ __forceinline__ void load_block(const void* base, int64_t index, float (&x)[kBlockSize]) {
  const uint4* p = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + index);
  const uint4 lo = __ldg(p), hi = __ldg(p + 1);
  const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if constexpr (kType == ElementType::kBFloat16) {
      x[2 * i] = bits_float(w[i] << 16);
      x[2 * i + 1] = bits_float(w[i] & 0xFFFF0000u);
    } else {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
      x[2 * i] = f.x;
      x[2 * i + 1] = f.y;
    }
  }
}

template <ElementType kType, ScaleRule kRule>
__device__ void store_device(const StoreParams& p, int64_t item) {
  const CacheDims& d = p.layout.dims();
  const int64_t groups = d.scale_bytes();
  const int64_t g = item % groups;
  const int64_t h = (item / groups) % d.heads;
  const int side = int((item / (groups * d.heads)) % 2);
  const int64_t token = item / (groups * d.heads * 2);
  const int64_t slot = p.slots_are_int64 ? static_cast<const int64_t*>(p.slots)[token]
                                         : int64_t(static_cast<const int32_t*>(p.slots)[token]);
  const bool counter = (g == 0 && h == 0 && side == 0);
  if (slot < 0 || slot >= d.pages * d.tokens_per_page) {
    if (counter && p.status)
      atomicAdd(slot < 0 ? &p.status->padding : &p.status->out_of_range, 1ull);
    return;
  }
  if (counter && p.status) atomicAdd(&p.status->stored, 1ull);
  float x[kBlockSize];
  load_block<kType>(side == 0 ? p.rows.k : p.rows.v, token * p.rows.token_stride + h * d.head_dim + g * kBlockSize, x);
  const float gs = side == 0 ? *p.k_global_scale : *p.v_global_scale;
  const QuantizedBlock q = quantize_block(x, gs, kRule);
  if (q.non_finite && p.status) atomicAdd(&p.status->non_finite, (unsigned long long)q.non_finite);
  const Region data = side == 0 ? Region::kKData : Region::kVData;
  const Region scale = side == 0 ? Region::kKScale : Region::kVScale;
  Coord c{p.layer, slot / d.tokens_per_page, slot % d.tokens_per_page, h, g};
  p.buffers.ptr[p.layout.region(scale).buffer][p.layout.offset(scale, c)] = q.scale;
  uint8_t* dst = p.buffers.ptr[p.layout.region(data).buffer];
  c.column = g * (kBlockSize / 2);
  if (p.layout.vector_bytes(data) >= 8) {
    uint2 v;
    v.x = uint32_t(q.packed[0]) | uint32_t(q.packed[1]) << 8 | uint32_t(q.packed[2]) << 16 | uint32_t(q.packed[3]) << 24;
    v.y = uint32_t(q.packed[4]) | uint32_t(q.packed[5]) << 8 | uint32_t(q.packed[6]) << 16 | uint32_t(q.packed[7]) << 24;
    *reinterpret_cast<uint2*>(dst + p.layout.offset(data, c)) = v;
  } else {
    for (int j = 0; j < kBlockSize / 2; ++j, ++c.column) dst[p.layout.offset(data, c)] = q.packed[j];
  }
}

template <ElementType kType, ScaleRule kRule>
__global__ void __launch_bounds__(kThreads) store_kernel(const __grid_constant__ StoreParams p, int64_t items) {
  const int64_t item = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (item < items) store_device<kType, kRule>(p, item);
}

template <ElementType kType, ScaleRule kRule>
cudaError_t launch(const StoreParams& p, cudaStream_t stream) {
  const CacheDims& d = p.layout.dims();
  const int64_t items = p.rows.tokens * 2 * d.heads * d.scale_bytes();
  if (items == 0) return cudaSuccess;
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks > int64_t(INT32_MAX)) return cudaErrorInvalidValue;
  store_kernel<kType, kRule><<<unsigned(blocks), kThreads, 0, stream>>>(p, items);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_store(const StoreParams& p, ElementType type, ScaleRule rule, cudaStream_t stream) {
  const bool bf16 = type == ElementType::kBFloat16;
  if (rule == ScaleRule::kStandard)
    return bf16 ? launch<ElementType::kBFloat16, ScaleRule::kStandard>(p, stream)
                : launch<ElementType::kFloat16, ScaleRule::kStandard>(p, stream);
  return bf16 ? launch<ElementType::kBFloat16, ScaleRule::kFourOverSix>(p, stream)
              : launch<ElementType::kFloat16, ScaleRule::kFourOverSix>(p, stream);
}

}  // namespace nvfp4kv::kernels
