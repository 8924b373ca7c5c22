// Quantize-and-store: one thread per 16-element block (token, side, head, group).
// Consecutive threads take consecutive groups of one row, so the input is read
// in contiguous 32-byte pieces and each (token, head) row is written contiguously.
// Every address comes from the validated LayoutView; the block quantization is
// core's code, shared with the CPU reference: quantize_finite_block
// (packed_block.hpp, proven equal to quantize_block by tests/cpu) for the
// standard rule, quantize_block itself for 4over6 and non-finite inputs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels.hpp"

namespace nvfp4kv::kernels {
namespace {

// One CTA per token; threadIdx = (group, head, side), so no thread divides a
// flat index (64-bit division by a runtime size costs ~100 instructions and
// made the first version instruction-bound, see NOTES.md).
template <ElementType kType, ScaleRule kRule>
__device__ void store_device(const StoreParams& p, int64_t token, int64_t g, int64_t h, int side) {
  const CacheDims& d = p.layout.dims();
  const int64_t slot = p.slots_are_int64 ? static_cast<const int64_t*>(p.slots)[token]
                                         : int64_t(static_cast<const int32_t*>(p.slots)[token]);
  const bool counter = (g == 0 && h == 0 && side == 0);
  if (slot < 0 || slot >= d.pages * d.tokens_per_page) {
    if (counter && p.status)
      atomicAdd(slot < 0 ? &p.status->padding : &p.status->out_of_range, 1ull);
    return;
  }
  // The scales live in device memory (graph capture), so they are checked here: a
  // zero, negative or non-finite scale would put NaN block scales in the cache.
  const float kgs = *p.k_global_scale, vgs = *p.v_global_scale;
  if (!global_scale_usable(kgs) || !global_scale_usable(vgs)) {
    if (counter && p.status) atomicAdd(&p.status->bad_global_scale, 1ull);
    return;
  }
  if (counter && p.status) atomicAdd(&p.status->stored, 1ull);
  // The block's 16 input elements as 8 words of two (16-byte aligned, checked on the host).
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(side == 0 ? p.rows.k : p.rows.v) +
                                                    token * p.rows.token_stride + h * d.head_dim + g * kBlockSize);
  const uint4 lo = __ldg(src), hi = __ldg(src + 1);
  const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  const float gs = side == 0 ? kgs : vgs;
  PackedBlock q;
  // Fast path: the standard rule on a block of finite elements (packed_block.hpp).
  // 4over6 and blocks holding Inf or NaN take quantize_block on widened floats.
  const uint32_t amax = kRule == ScaleRule::kStandard ? packed_amax<kType>(w) : non_finite_floor<kType>();
  if (amax < non_finite_floor<kType>()) {
    q = quantize_finite_block<kType>(w, amax, gs);
  } else {
    float x[kBlockSize];
#pragma unroll
    for (int i = 0; i < 8; ++i) x[2 * i] = low_element<kType>(w[i]), x[2 * i + 1] = high_element<kType>(w[i]);
    const QuantizedBlock b = quantize_block(x, gs, kRule);
    if (b.non_finite && p.status) atomicAdd(&p.status->non_finite, (unsigned long long)b.non_finite);
    q.scale = b.scale;
#pragma unroll
    for (int i = 0; i < 2; ++i)
      q.data[i] = uint32_t(b.packed[4 * i]) | uint32_t(b.packed[4 * i + 1]) << 8 | uint32_t(b.packed[4 * i + 2]) << 16 |
                  uint32_t(b.packed[4 * i + 3]) << 24;
  }
  const Region data = side == 0 ? Region::kKData : Region::kVData;
  const Region scale = side == 0 ? Region::kKScale : Region::kVScale;
  // capacity < 2^31 is checked on the host, so a 32-bit division suffices.
  const uint32_t n = uint32_t(d.tokens_per_page), s32 = uint32_t(slot);
  Coord c{p.layer, int64_t(s32 / n), int64_t(s32 % n), h, g};
  p.buffers.ptr[p.layout.region(scale).buffer][p.layout.offset(scale, c)] = q.scale;
  uint8_t* dst = p.buffers.ptr[p.layout.region(data).buffer];
  c.column = g * (kBlockSize / 2);
  if (p.layout.vector_bytes(data) >= 8) {
    *reinterpret_cast<uint2*>(dst + p.layout.offset(data, c)) = make_uint2(q.data[0], q.data[1]);
  } else {
    for (int j = 0; j < kBlockSize / 2; ++j, ++c.column) dst[p.layout.offset(data, c)] = uint8_t(q.data[j / 4] >> (8 * (j % 4)));
  }
}

template <ElementType kType, ScaleRule kRule>
__global__ void store_kernel(const __grid_constant__ StoreParams p) {
  for (int64_t h = threadIdx.y; h < p.layout.dims().heads; h += blockDim.y)
    store_device<kType, kRule>(p, blockIdx.x, threadIdx.x, h, int(threadIdx.z));
}

template <ElementType kType, ScaleRule kRule>
cudaError_t launch(const StoreParams& p, cudaStream_t stream) {
  if (p.rows.tokens == 0) return cudaSuccess;
  store_kernel<kType, kRule><<<unsigned(p.rows.tokens), row_block(p.layout.dims()), 0, stream>>>(p);
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
