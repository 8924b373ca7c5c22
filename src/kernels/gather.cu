// Gather/dequant. One CTA per (page of a sequence, sequence); threads are
// (group, head, side) of a token row and walk the page's tokens four at a time,
// issuing the four tokens' cache loads before decoding any of them (one
// dependent load chain per thread left the first version latency-bound).
// Every address comes from the validated LayoutView.
// Decoding is core's table decode (packed_block.hpp): per block, the outputs of
// the 8 magnitudes, computed as the reference computes an element; per element,
// byte permutes (Hopper has no E2M1 conversion). tests/cpu checks the table
// decode against the reference's dequantize_element for every scale byte.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels.hpp"

namespace nvfp4kv::kernels {
namespace {

constexpr int kTokensInFlight = 4;

// The 8 data bytes of one block: one 8-byte load where the layout's rows allow it.
__device__ __forceinline__ uint2 load_block_bytes(const GatherParams& p, Region data, Coord c) {
  const uint8_t* src = p.buffers.ptr[p.layout.region(data).buffer];
  if (p.layout.vector_bytes(data) >= 8) return __ldg(reinterpret_cast<const uint2*>(src + p.layout.offset(data, c)));
  uint32_t w[2] = {0, 0};
  for (int k = 0; k < 8; ++k, ++c.column) w[k / 4] |= uint32_t(__ldg(src + p.layout.offset(data, c))) << (8 * (k % 4));
  return make_uint2(w[0], w[1]);
}

template <ElementType kOut>
__device__ void gather_rows(const GatherParams& p, int64_t seq, int64_t page_index, int64_t g, int64_t h, int side) {
  const CacheDims& d = p.layout.dims();
  const int64_t begin = p.cu_seqlens[seq], len = p.cu_seqlens[seq + 1] - begin;
  const int64_t first = page_index * d.tokens_per_page;
  if (first >= len) return;
  const int64_t count = min(d.tokens_per_page, len - first);
  const int64_t page = p.block_table[seq * p.block_table_stride + page_index];
  uint16_t* out_base = static_cast<uint16_t*>(side == 0 ? p.k_out : p.v_out);
  const auto out_row = [&](int64_t t) {
    return reinterpret_cast<uint4*>(out_base + ((begin + first + t) * d.heads + h) * d.head_dim + g * kBlockSize);
  };
  if (page < 0 || page >= d.pages) {  // never read outside the cache; make the rows loudly wrong
    const uint32_t nan2 = kOut == ElementType::kBFloat16 ? 0x7FC07FC0u : 0x7E007E00u;
    for (int64_t t = 0; t < count; ++t) out_row(t)[0] = out_row(t)[1] = make_uint4(nan2, nan2, nan2, nan2);
    if (g == 0 && h == 0 && side == 0 && p.status) atomicAdd(&p.status->bad_pages, (unsigned long long)count);
    return;
  }
  const Region data = side == 0 ? Region::kKData : Region::kVData;
  const Region scale = side == 0 ? Region::kKScale : Region::kVScale;
  const uint8_t* scales = p.buffers.ptr[p.layout.region(scale).buffer];
  const float gs = side == 0 ? *p.k_global_scale : *p.v_global_scale;
  for (int64_t t0 = 0; t0 < count; t0 += kTokensInFlight) {
    uint2 bytes[kTokensInFlight];
    uint8_t sf[kTokensInFlight];
#pragma unroll
    for (int k = 0; k < kTokensInFlight; ++k) {
      if (t0 + k >= count) break;
      const Coord c{p.layer, page, t0 + k, h, g};
      sf[k] = __ldg(scales + p.layout.offset(scale, c));
      bytes[k] = load_block_bytes(p, data, {p.layer, page, t0 + k, h, g * (kBlockSize / 2)});
    }
#pragma unroll
    for (int k = 0; k < kTokensInFlight; ++k) {
      if (t0 + k >= count) break;
      const DecodeTable table = decode_table<kOut>(sf[k], gs);
      uint32_t packed[8];
      decode_eight(table, bytes[k].x, *reinterpret_cast<uint32_t(*)[4]>(packed));
      decode_eight(table, bytes[k].y, *reinterpret_cast<uint32_t(*)[4]>(packed + 4));
      uint4* out = out_row(t0 + k);
      out[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
      out[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
    }
  }
}

template <ElementType kOut>
__global__ void gather_kernel(const __grid_constant__ GatherParams p) {
  for (int64_t h = threadIdx.y; h < p.layout.dims().heads; h += blockDim.y)
    gather_rows<kOut>(p, blockIdx.y, blockIdx.x, threadIdx.x, h, int(threadIdx.z));
}

}  // namespace

cudaError_t launch_gather(const GatherParams& p, ElementType out_type, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  const dim3 grid(unsigned(p.block_table_stride), unsigned(p.batch));
  if (out_type == ElementType::kBFloat16)
    gather_kernel<ElementType::kBFloat16><<<grid, row_block(p.layout.dims()), 0, stream>>>(p);
  else
    gather_kernel<ElementType::kFloat16><<<grid, row_block(p.layout.dims()), 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace nvfp4kv::kernels
