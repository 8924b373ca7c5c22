// Quantize-and-store. A thread owns one 16-element group of one side of one
// token and walks that token's heads, so the per-token work (slot lookup and
// checks, global scales, page/token coordinates, the layout offsets) is done
// once per thread and amortized over the heads; the next head's addresses are
// the layout's head strides added on. Consecutive threads take consecutive
// groups of a row: the input is read in contiguous 32-byte pieces per thread.
// Every address comes from the validated LayoutView; the block quantization is
// core's code, shared with the CPU reference: quantize_finite_block
// (packed_block.hpp, proven equal to quantize_block by tests/cpu) for the
// standard rule, quantize_block itself for 4over6 and non-finite inputs.
#include "kernels.hpp"

namespace nvfp4kv::kernels {
namespace {

constexpr int kHeadsInFlight = 4;  // input loads issued before any quantization

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

// threadIdx = (group, side, token within the CTA's tokens).
template <ElementType kType, ScaleRule kRule>
__global__ void store_kernel(const __grid_constant__ StoreParams p) {
  const CacheDims& d = p.layout.dims();
  const int64_t token = int64_t(blockIdx.x) * blockDim.z + threadIdx.z;
  if (token >= p.rows.tokens) return;
  const int g = int(threadIdx.x), side = int(threadIdx.y);
  const int64_t slot = p.slots_are_int64 ? static_cast<const int64_t*>(p.slots)[token]
                                         : int64_t(static_cast<const int32_t*>(p.slots)[token]);
  const bool counter = (g == 0 && side == 0);
  if (slot < 0 || slot >= d.pages * d.tokens_per_page) {
    if (counter && p.status) atomicAdd(slot < 0 ? &p.status->padding : &p.status->out_of_range, 1ull);
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
  const float gs = side == 0 ? kgs : vgs;
  const Region data = side == 0 ? Region::kKData : Region::kVData;
  const Region scale = side == 0 ? Region::kKScale : Region::kVScale;
  // capacity < 2^31 is checked on the host, so a 32-bit division suffices.
  const uint32_t n = uint32_t(d.tokens_per_page), s32 = uint32_t(slot);
  Coord c{p.layer, int64_t(s32 / n), int64_t(s32 % n), 0, g};
  // Head 0's addresses; head h adds h times the region's head stride (the head
  // term of region_offset is linear for every permutation).
  uint8_t* const scale_base = element_address(p.layout, p.buffers, scale, c);
  c.column = g * (kBlockSize / 2);
  uint8_t* const data_base = element_address(p.layout, p.buffers, data, c);
  const int64_t scale_head = p.layout.region(scale).head, data_head = p.layout.region(data).head;
  const bool vector_data = p.layout.vector_bytes(data) >= 8;
  // 16-byte aligned rows (checked on the host); head h's group starts h * D elements further.
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(side == 0 ? p.rows.k : p.rows.v) +
                                                    token * p.rows.token_stride + g * kBlockSize);
  const int64_t head_step = d.head_dim / 8;  // in uint4
  for (int64_t h0 = 0; h0 < d.heads; h0 += kHeadsInFlight) {
    uint4 in[kHeadsInFlight][2];
#pragma unroll
    for (int k = 0; k < kHeadsInFlight; ++k) {
      if (h0 + k < d.heads) {
        in[k][0] = __ldg(src + (h0 + k) * head_step);
        in[k][1] = __ldg(src + (h0 + k) * head_step + 1);
      }
    }
#pragma unroll
    for (int k = 0; k < kHeadsInFlight; ++k) {
      const int64_t h = h0 + k;
      if (h >= d.heads) break;
      const PackedBlock q = quantize<kType, kRule>(in[k][0], in[k][1], gs, p.status);
      scale_base[h * scale_head] = q.scale;
      if (vector_data) {
        *reinterpret_cast<uint2*>(data_base + h * data_head) = make_uint2(q.data[0], q.data[1]);
      } else {  // rows not 8-byte aligned: byte by byte, each through the layout
        Coord cb = c;
        cb.head = h;
        for (int j = 0; j < kBlockSize / 2; ++j, ++cb.column)
          *element_address(p.layout, p.buffers, data, cb) = uint8_t(q.data[j / 4] >> (8 * (j % 4)));
      }
    }
  }
}

template <ElementType kType, ScaleRule kRule>
cudaError_t launch(const StoreParams& p, cudaStream_t stream) {
  if (p.rows.tokens == 0) return cudaSuccess;
  const dim3 block = token_block(p.layout.dims(), 128);
  const unsigned grid = unsigned((p.rows.tokens + block.z - 1) / block.z);
  store_kernel<kType, kRule><<<grid, block, 0, stream>>>(p);
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
