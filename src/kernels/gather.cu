// Gather/dequant: one thread per 16-element block of one (token, side, head)
// row of a sequence; pages come from the block table, bytes from the
// validated LayoutView. E2M1 is decoded by bit placement (Hopper has no E2M1
// conversion): the 3 magnitude bits under the fp32 exponent/mantissa give
// value * 2^-126 exactly, so (bits * 2^126) * scale is exact and the one
// rounding happens at * global_scale, as in the reference.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels.hpp"

namespace nvfp4kv::kernels {
namespace {

constexpr float kTwo126 = 8.507059173023462e37f;  // 2^126

__device__ __forceinline__ float e2m1_scaled(uint32_t nibble) {
  return bits_float(((nibble & 7u) << 22) | ((nibble & 8u) << 28)) * kTwo126;
}

template <ElementType kOut>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if constexpr (kOut == ElementType::kBFloat16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

template <ElementType kOut>
__device__ void gather_device(const GatherParams& p, int64_t seq, int64_t j, int64_t g, int64_t h, int side) {
  const CacheDims& d = p.layout.dims();
  const int64_t begin = p.cu_seqlens[seq], len = p.cu_seqlens[seq + 1] - begin;
  if (j >= len) return;
  uint4* out = reinterpret_cast<uint4*>(static_cast<uint16_t*>(side == 0 ? p.k_out : p.v_out) +
                                        ((begin + j) * d.heads + h) * d.head_dim + g * kBlockSize);
  const uint32_t n = uint32_t(d.tokens_per_page), j32 = uint32_t(j);  // j < 2^31: one CTA per token
  const int64_t page = p.block_table[seq * p.block_table_stride + j32 / n];
  if (page < 0 || page >= d.pages) {  // never read outside the cache; make the row loudly wrong
    const uint32_t nan2 = kOut == ElementType::kBFloat16 ? 0x7FC07FC0u : 0x7E007E00u;
    out[0] = out[1] = make_uint4(nan2, nan2, nan2, nan2);
    if (g == 0 && h == 0 && side == 0 && p.status) atomicAdd(&p.status->bad_pages, 1ull);
    return;
  }
  const Region data = side == 0 ? Region::kKData : Region::kVData;
  const Region scale = side == 0 ? Region::kKScale : Region::kVScale;
  Coord c{p.layer, page, int64_t(j32 % n), h, g};
  const uint8_t sf = p.buffers.ptr[p.layout.region(scale).buffer][p.layout.offset(scale, c)];
  const float sf_f = e4m3_decode(sf);
  const float gs = side == 0 ? *p.k_global_scale : *p.v_global_scale;
  const uint8_t* src = p.buffers.ptr[p.layout.region(data).buffer];
  c.column = g * (kBlockSize / 2);
  uint32_t bytes[2];
  if (p.layout.vector_bytes(data) >= 8) {
    const uint2 v = *reinterpret_cast<const uint2*>(src + p.layout.offset(data, c));
    bytes[0] = v.x;
    bytes[1] = v.y;
  } else {
    bytes[0] = bytes[1] = 0;
    for (int k = 0; k < 8; ++k, ++c.column) bytes[k / 4] |= uint32_t(src[p.layout.offset(data, c)]) << (8 * (k % 4));
  }
  uint32_t packed[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uint32_t byte = bytes[k / 4] >> (8 * (k % 4));
    const float lo = (e2m1_scaled(byte & 15u) * sf_f) * gs;
    const float hi = (e2m1_scaled((byte >> 4) & 15u) * sf_f) * gs;
    packed[k] = pack2<kOut>(lo, hi);
  }
  out[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  out[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
}

// One CTA per (token of a sequence, sequence); threadIdx = (group, head, side).
template <ElementType kOut>
__global__ void gather_kernel(const __grid_constant__ GatherParams p) {
  for (int64_t h = threadIdx.y; h < p.layout.dims().heads; h += blockDim.y)
    gather_device<kOut>(p, blockIdx.y, blockIdx.x, threadIdx.x, h, int(threadIdx.z));
}

}  // namespace

cudaError_t launch_gather(const GatherParams& p, ElementType out_type, cudaStream_t stream) {
  const CacheDims& d = p.layout.dims();
  if (p.batch == 0) return cudaSuccess;
  const dim3 grid(unsigned(p.block_table_stride * d.tokens_per_page), unsigned(p.batch));
  if (out_type == ElementType::kBFloat16)
    gather_kernel<ElementType::kBFloat16><<<grid, row_block(d), 0, stream>>>(p);
  else
    gather_kernel<ElementType::kFloat16><<<grid, row_block(d), 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace nvfp4kv::kernels
