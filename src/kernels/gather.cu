// Gather/dequant. One CTA per (page of a sequence, sequence); a thread owns one
// 16-element group of one side of one token of the page and walks the token's
// heads, issuing several heads' cache loads before decoding any of them. The
// per-token work (coordinates, layout offsets) is done once per thread; the
// next head's addresses are the layout's head strides added on.
// Every address comes from the validated LayoutView.
// Decoding is core's table decode (packed_block.hpp): per block, the outputs of
// the 8 magnitudes, computed as the reference computes an element; per element,
// byte permutes (Hopper has no E2M1 conversion). tests/cpu checks the table
// decode against the reference's dequantize_element for every scale byte.
#include "kernels.hpp"

namespace nvfp4kv::kernels {
namespace {

constexpr int kHeadsInFlight = 8;

// threadIdx = (group, side, token of the page, strided by blockDim.z).
template <ElementType kOut>
__global__ void gather_kernel(const __grid_constant__ GatherParams p) {
  const CacheDims& d = p.layout.dims();
  const int64_t seq = blockIdx.y, page_index = blockIdx.x;
  const int g = int(threadIdx.x), side = int(threadIdx.y);
  const int64_t begin = p.cu_seqlens[seq], len = p.cu_seqlens[seq + 1] - begin;
  const int64_t first = page_index * d.tokens_per_page;
  if (first >= len) return;
  const int64_t count = min(d.tokens_per_page, len - first);
  const int64_t page = p.block_table[seq * p.block_table_stride + page_index];
  // Token t's group g of head h starts at out_base + (t * heads + h) * D + 16 g.
  uint16_t* const out_base = static_cast<uint16_t*>(side == 0 ? p.k_out : p.v_out) + g * kBlockSize;
  const int64_t head_chunks = d.head_dim / 8;  // 16-byte chunks per head of an input or output row
  if (page < 0 || page >= d.pages) {  // never read outside the cache; make the rows loudly wrong
    const uint32_t nan2 = kOut == ElementType::kBFloat16 ? 0x7FC07FC0u : 0x7E007E00u;
    const uint4 nan8 = make_uint4(nan2, nan2, nan2, nan2);
    for (int64_t t = threadIdx.z; t < count; t += blockDim.z) {
      uint4* out = reinterpret_cast<uint4*>(out_base + (begin + first + t) * d.heads * d.head_dim);
      for (int64_t h = 0; h < d.heads; ++h) out[h * head_chunks] = out[h * head_chunks + 1] = nan8;
    }
    if (g == 0 && side == 0 && threadIdx.z == 0 && p.status)
      atomicAdd(&p.status->bad_pages, (unsigned long long)count);
    return;
  }
  const Region data = side == 0 ? Region::kKData : Region::kVData;
  const Region scale = side == 0 ? Region::kKScale : Region::kVScale;
  const float gs = side == 0 ? *p.k_global_scale : *p.v_global_scale;
  const int64_t scale_head = p.layout.head_step(scale), data_head = p.layout.head_step(data);
  const bool vector_data = p.layout.vector_bytes(data) >= 8;
  // Output stores: a thread's block is two 16-byte chunks of one 32-byte sector,
  // and two store instructions would each write half of every sector. Where the
  // groups pair up, neighbours g and g ^ 1 swap halves first, so each store
  // instruction writes whole sectors: the even lane the first halves of both
  // blocks, the odd lane the second halves.
  const bool pair_up = (blockDim.x % 2) == 0;
  const bool odd = (g & 1) != 0;
  const unsigned linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned in_warp = min(32u, blockDim.x * blockDim.y * blockDim.z - (linear & ~31u));
  const unsigned warp_mask = in_warp == 32 ? 0xFFFFFFFFu : (1u << in_warp) - 1u;
  // Every thread of a warp runs the same iterations (shuffles need the partner);
  // threads past the page's last token load and store nothing.
  for (int64_t t0 = 0; t0 < count; t0 += blockDim.z) {
    const int64_t t = t0 + threadIdx.z;
    const bool active = t < count;
    // Head 0's addresses; head h is h * head_step further (LayoutView::head_step).
    Coord c{p.layer, page, active ? t : 0, 0, g};
    const uint8_t* const scale_base = element_address(p.layout, p.buffers, scale, c);
    c.column = g * (kBlockSize / 2);
    const uint8_t* const data_base = element_address(p.layout, p.buffers, data, c);
    uint4* const out = reinterpret_cast<uint4*>(out_base + (begin + first + c.token) * d.heads * d.head_dim);
    for (int64_t h0 = 0; h0 < d.heads; h0 += kHeadsInFlight) {
      uint2 bytes[kHeadsInFlight];
      uint8_t sf[kHeadsInFlight];
#pragma unroll
      for (int k = 0; k < kHeadsInFlight; ++k) {
        const int64_t h = h0 + k;
        if (h >= d.heads) break;
        sf[k] = 0;
        bytes[k] = make_uint2(0, 0);
        if (!active) continue;
        sf[k] = __ldg(scale_base + h * scale_head);
        if (vector_data) {
          bytes[k] = __ldg(reinterpret_cast<const uint2*>(data_base + h * data_head));
        } else {  // rows not 8-byte aligned: byte by byte, each through the layout
          Coord cb = c;
          cb.head = h;
          uint32_t w[2] = {0, 0};
          for (int j = 0; j < 8; ++j, ++cb.column) w[j / 4] |= uint32_t(__ldg(element_address(p.layout, p.buffers, data, cb))) << (8 * (j % 4));
          bytes[k] = make_uint2(w[0], w[1]);
        }
      }
#pragma unroll
      for (int k = 0; k < kHeadsInFlight; ++k) {
        const int64_t h = h0 + k;
        if (h >= d.heads) break;
        const DecodeTable table = decode_table<kOut>(sf[k], gs);
        uint32_t lo[4], hi[4];
        decode_eight(table, bytes[k].x, lo);
        decode_eight(table, bytes[k].y, hi);
        uint4* const row = out + h * head_chunks;
        if (pair_up) {
          uint32_t got[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) got[i] = __shfl_xor_sync(warp_mask, odd ? lo[i] : hi[i], 1);
          // even g: chunk 2g (own first half), then 2g + 2 (the partner's first half);
          // odd g: chunk 2g - 1 (the partner's second half), then 2g + 1 (own second half).
          uint32_t a[4], b[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) a[i] = odd ? got[i] : lo[i], b[i] = odd ? hi[i] : got[i];
          if (active) {
            row[odd ? -1 : 0] = make_uint4(a[0], a[1], a[2], a[3]);
            row[odd ? 1 : 2] = make_uint4(b[0], b[1], b[2], b[3]);
          }
        } else if (active) {
          row[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
          row[1] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        }
      }
    }
  }
}

}  // namespace

cudaError_t launch_gather(const GatherParams& p, ElementType out_type, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  const dim3 grid(unsigned(p.block_table_stride), unsigned(p.batch));
  const dim3 block = token_block(p.layout.dims(), 256, p.layout.dims().tokens_per_page);
  if (out_type == ElementType::kBFloat16)
    gather_kernel<ElementType::kBFloat16><<<grid, block, 0, stream>>>(p);
  else
    gather_kernel<ElementType::kFloat16><<<grid, block, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace nvfp4kv::kernels
