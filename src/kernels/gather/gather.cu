// Gather/dequant. One CTA per (block-table entry, sequence); a thread owns one
// 16-element group of one side of one token of the page and walks the token's
// heads, issuing several heads' cache loads before decoding any of them. The
// per-token work (coordinates, layout offsets) is done once per thread; the
// next head's addresses are the layout's head step added on.
// Every address comes from the validated LayoutView; the batch's entries are
// read through core/batch.hpp (bad pages and lengths counted, never read).
// Decoding is core's table decode (packed_block.hpp): per block, the outputs of
// the 8 magnitudes, computed as the reference computes an element; per element,
// byte permutes (Hopper has no E2M1 conversion). tests/cpu checks the table
// decode against the reference's dequantize_element for every scale byte.
#include "../common/device.cuh"
#include "../common/dispatch.cuh"
#include "../common/token_block.hpp"
#include "../common/row_transforms.cuh"
#include "nvfp4kv/core/packed_block.hpp"
#include "params.hpp"

namespace nvfp4kv::kernels {
namespace {

[[maybe_unused]] constexpr int kHeadsInFlight = 8;  // unreferenced where the kernel body is the arch guard's trap

// Who a thread is: its group and side, its token lane (tokens of the page are
// taken blockDim.z at a time), the warp it shares shuffles with, and the
// (sequence, block-table entry) of its CTA.
struct GatherThread {
  int group, groups;
  Side side;
  int token_lane, token_lanes;
  unsigned warp_mask;  // the lanes of this thread's warp that exist
  int64_t seq, entry;
};

// Rows [first, first + count) of sequence rows starting at out_base (one side),
// filled with NaN: rows that must not pass for data.
template <ElementType kOut, int kHeadDim>
__device__ void fill_nan_rows(uint16_t* out_base, int64_t first, int64_t count, const CacheDims& d,
                              const GatherThread& th) {
  const int64_t head_dim = kHeadDim ? kHeadDim : d.head_dim;
  const uint4 nan8 = nan_chunk<kOut == ElementType::kBFloat16>();
  for (int64_t t = th.token_lane; t < count; t += th.token_lanes) {
    uint4* out = reinterpret_cast<uint4*>(out_base + (first + t) * d.heads * head_dim);
    for (int64_t h = 0; h < d.heads; ++h) out[h * head_dim / 8] = out[h * head_dim / 8 + 1] = nan8;
  }
}

template <ElementType kOut, int kHeadDim>
__device__ __forceinline__ void gather_device(const GatherParams& p, const GatherThread& th) {
  const CacheDims& d = p.layout.dims();
  const GatherArgs& a = p.args;
  const int64_t head_dim = kHeadDim ? kHeadDim : d.head_dim;
  const SequenceLength len = sequence_length(a.batch, th.seq, d.tokens_per_page);
  const int64_t begin = a.batch.first_row(th.seq);
  const bool counter = th.group == 0 && th.side == Side::kK && th.token_lane == 0;
  // Token t's group g of head h starts at out_base + (t * heads + h) * D + 16 g.
  uint16_t* const out_base = static_cast<uint16_t*>(a.out(th.side)) + th.group * kBlockSize;
  if (len.bad && th.entry == a.batch.block_table_stride - 1) {
    // A length beyond the block table: the rows past its capacity have no page.
    if (counter && a.status) atomicAdd(&a.status->bad_lengths, 1ull);
    const int64_t beyond = a.batch.raw_length(th.seq) - len.tokens;
    if (beyond > 0) fill_nan_rows<kOut, kHeadDim>(out_base, begin + len.tokens, beyond, d, th);
  }
  const int64_t first = th.entry * d.tokens_per_page;
  if (first >= len.tokens) return;
  const int64_t count = min(d.tokens_per_page, len.tokens - first);
  const int64_t page = page_of(a.batch, th.seq, th.entry, d.pages);
  const float gs = *a.global_scale(th.side);
  const bool scales_ok = global_scale_usable(*a.k_global_scale) && global_scale_usable(*a.v_global_scale);
  if (page < 0 || !scales_ok) {  // never read outside the cache, never decode with a broken scale
    if (counter && a.status)
      atomicAdd(page < 0 ? &a.status->bad_pages : &a.status->bad_global_scale, (unsigned long long)count);
    if (page < 0 || !global_scale_usable(gs)) {
      fill_nan_rows<kOut, kHeadDim>(out_base, begin + first, count, d, th);
      return;
    }
  }
  const SideRegions reg = side_regions(th.side);
  const int64_t scale_head = p.layout.head_step(reg.scale), data_head = p.layout.head_step(reg.data);
  const bool vector_data = p.layout.vector_bytes(reg.data) >= 8;
  // Each data word decoded to the standard order first unless it is in it: fp16-split (the
  // native layout's) in a few operations, another order bit by bit.
  const bool standard_codes = p.layout.codes().is_standard(), split_codes = p.layout.codes().is_fp16_split();
  const int64_t head_chunks = head_dim / 8;  // 16-byte chunks per head of an output row
  // Output stores: a thread's block is two 16-byte chunks of one 32-byte sector,
  // and two store instructions would each write half of every sector. Where the
  // groups pair up, neighbours g and g ^ 1 swap halves first, so each store
  // instruction writes whole sectors: the even lane the first halves of both
  // blocks, the odd lane the second halves.
  const bool pair_up = (th.groups % 2) == 0;
  const bool odd = (th.group & 1) != 0;
  // Every thread of a warp runs the same iterations (shuffles need the partner);
  // threads past the page's last token load and store nothing.
  for (int64_t t0 = 0; t0 < count; t0 += th.token_lanes) {
    const int64_t t = t0 + th.token_lane;
    const bool active = t < count;
    // Head 0's addresses; head h is h * head_step further (LayoutView::head_step).
    Coord c{a.layer, page, active ? t : 0, 0, th.group};
    const uint8_t* const scale_base = element_address(p.layout, p.cache, reg.scale, c);
    c.column = th.group * (kBlockSize / 2);
    const uint8_t* const data_base = element_address(p.layout, p.cache, reg.data, c);
    uint4* const out = reinterpret_cast<uint4*>(out_base + (begin + first + c.token) * d.heads * head_dim);
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
          for (int j = 0; j < 8; ++j, ++cb.column)
            w[j / 4] |= uint32_t(__ldg(element_address(p.layout, p.cache, reg.data, cb))) << (8 * (j % 4));
          bytes[k] = make_uint2(w[0], w[1]);
        }
      }
      // Every head's load is issued above before any word is reordered here: the reorder
      // needs the loaded word, and inside the load loop it serialized the loads (run 56:
      // the native layout's gather at 0.156 ms against 0.109 in the standard order).
#pragma unroll
      for (int k = 0; k < kHeadsInFlight; ++k) {
        if (h0 + k >= d.heads) break;  // bytes[k] past the last head was never loaded
        if (split_codes)
          bytes[k] = make_uint2(CodeOrder::standard_from_split(bytes[k].x), CodeOrder::standard_from_split(bytes[k].y));
        else if (!standard_codes)
          bytes[k] = make_uint2(p.layout.codes().decode_word(bytes[k].x), p.layout.codes().decode_word(bytes[k].y));
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
          for (int i = 0; i < 4; ++i) got[i] = __shfl_xor_sync(th.warp_mask, odd ? lo[i] : hi[i], 1);
          // even g: chunk 2g (own first half), then 2g + 2 (the partner's first half);
          // odd g: chunk 2g - 1 (the partner's second half), then 2g + 1 (own second half).
          uint32_t x[4], y[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) x[i] = odd ? got[i] : lo[i], y[i] = odd ? hi[i] : got[i];
          if (active) {
            row[odd ? -1 : 0] = make_uint4(x[0], x[1], x[2], x[3]);
            row[odd ? 1 : 2] = make_uint4(y[0], y[1], y[2], y[3]);
          }
        } else if (active) {
          row[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
          row[1] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        }
      }
    }
  }
}

// threadIdx = (group, side, token of the page, strided by blockDim.z);
// blockIdx = (block-table entry, sequence).
template <ElementType kOut, int kHeadDim>
__global__ void gather_kernel(const __grid_constant__ GatherParams p) {
#if NVFP4KV_KERNEL_ARCH_SUPPORTED
  const unsigned linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned in_warp = min(32u, blockDim.x * blockDim.y * blockDim.z - (linear & ~31u));
  const GatherThread th{int(threadIdx.x), int(blockDim.x), Side(threadIdx.y), int(threadIdx.z), int(blockDim.z),
                        in_warp == 32 ? 0xFFFFFFFFu : (1u << in_warp) - 1u, int64_t(blockIdx.y), int64_t(blockIdx.x)};
  gather_device<kOut, kHeadDim>(p, th);
#else
  __trap();  // unreachable: the API refuses devices older than sm_90 (common/arch.hpp)
#endif
}


// ---- a layer holding FP8, or read back through its transforms -----------------------
// One warp per (token, side, head) row: the row's elements as the reference reads them
// (e2m1 * scale * global scale, or e4m3 * global scale), in float64 in shared memory; then,
// unless the stored values are asked for, the rotation undone and mu added in float64 in
// the reference's order (common/row_transforms.cuh); each value rounded to float and then
// to the output type as the reference rounds. So the outputs are the reference's bits.
// Bad pages, lengths and scales are handled as the vectorized kernel handles them.
constexpr int kRowWarps = 4;

template <ElementType kOut>
__device__ __forceinline__ uint16_t output_bits(float x) {
  return kOut == ElementType::kBFloat16 ? float_to_bf16(x) : float_to_fp16(x);
}

template <ElementType kOut>
__device__ void gather_rows_device(const GatherParams& p, double* row, int64_t seq, int64_t entry) {
  const CacheDims& d = p.layout.dims();
  const GatherArgs& a = p.args;
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const int64_t row_elements = d.heads * d.head_dim;
  const uint16_t nan = output_bits<kOut>(__int_as_float(0x7FC00000));
  const auto fill_nan = [&](Side side, int64_t first_row, int64_t rows) {
    uint16_t* out = static_cast<uint16_t*>(a.out(side)) + first_row * row_elements;
    for (int64_t e = threadIdx.x; e < rows * row_elements; e += blockDim.x) out[e] = nan;
  };
  const SequenceLength len = sequence_length(a.batch, seq, d.tokens_per_page);
  const int64_t begin = a.batch.first_row(seq);
  if (len.bad && entry == a.batch.block_table_stride - 1) {
    if (threadIdx.x == 0 && a.status) atomicAdd(&a.status->bad_lengths, 1ull);
    const int64_t beyond = a.batch.raw_length(seq) - len.tokens;
    if (beyond > 0)
      for (Side side : {Side::kK, Side::kV}) fill_nan(side, begin + len.tokens, beyond);
  }
  const int64_t first = entry * d.tokens_per_page;
  if (first >= len.tokens) return;
  const int64_t count = min(d.tokens_per_page, len.tokens - first);
  const int64_t page = page_of(a.batch, seq, entry, d.pages);
  const bool scales_ok = global_scale_usable(*a.k_global_scale) && global_scale_usable(*a.v_global_scale);
  if ((page < 0 || !scales_ok) && threadIdx.x == 0 && a.status)
    atomicAdd(page < 0 ? &a.status->bad_pages : &a.status->bad_global_scale, (unsigned long long)count);
  for (int64_t item = warp; item < count * 2 * d.heads; item += kRowWarps) {
    const int64_t t = item / (2 * d.heads), h = item % d.heads;
    const Side side = Side((item / d.heads) % 2);
    const float gs = *a.global_scale(side);
    uint16_t* const out = static_cast<uint16_t*>(a.out(side)) + (begin + first + t) * row_elements + h * d.head_dim;
    if (page < 0 || !global_scale_usable(gs)) {  // never read outside the cache or with a broken scale
      for (int64_t e = lane; e < d.head_dim; e += 32) out[e] = nan;
      continue;
    }
    const SideRegions reg = side_regions(side);
    const SideFormatView& f = p.format.side(side);
    Coord c{a.layer, page, t, h, 0};
    for (int64_t e = lane; e < d.head_dim; e += 32) {
      if (d.fp8(side)) {
        c.column = e;
        row[e] = fp8_decode_element(*element_address(p.layout, p.cache, reg.data, c), gs);
      } else {
        c.column = e / 2;
        const uint8_t byte = p.layout.codes().decode(*element_address(p.layout, p.cache, reg.data, c));
        c.column = e / kBlockSize;
        row[e] = dequantize_element(byte, int(e % 2), *element_address(p.layout, p.cache, reg.scale, c), gs);
      }
    }
    if (!a.stored_values && f.transformed()) {
      if (f.rotation > 0) hadamard_row(row, d.head_dim, f.rotation, lane);
      if (const float* lambda = f.channel_scale_row(h, d.head_dim))
        for (int64_t e = lane; e < d.head_dim; e += 32) row[e] = __dmul_rn(row[e], double(lambda[e]));
      if (const float* mu = f.mean_row(h, d.head_dim))
        for (int64_t e = lane; e < d.head_dim; e += 32) row[e] = __dadd_rn(row[e], double(mu[e]));
    }
    for (int64_t e = lane; e < d.head_dim; e += 32) out[e] = output_bits<kOut>(float(row[e]));
    __syncwarp();  // the row's shared memory is free for the warp's next item
  }
}

// blockIdx = (block-table entry, sequence), as the vectorized kernel.
template <ElementType kOut>
__global__ void __launch_bounds__(kRowWarps * 32) gather_rows_kernel(const __grid_constant__ GatherParams p) {
#if NVFP4KV_KERNEL_ARCH_SUPPORTED
  extern __shared__ double rows[];
  gather_rows_device<kOut>(p, rows + (threadIdx.x / 32) * p.layout.dims().head_dim, int64_t(blockIdx.y),
                           int64_t(blockIdx.x));
#else
  __trap();  // unreachable: the API refuses devices older than sm_90 (common/arch.hpp)
#endif
}

}  // namespace

cudaError_t launch_gather(const GatherParams& p, cudaStream_t stream) {
  if (p.args.batch.batch == 0) return cudaSuccess;
  const CacheDims& d = p.layout.dims();
  const dim3 grid{unsigned(p.args.batch.block_table_stride), unsigned(p.args.batch.batch)};
  if (p.format.holds_fp8() || (p.format.transformed() && !p.args.stored_values)) {
    const size_t smem = size_t(kRowWarps) * size_t(d.head_dim) * sizeof(double);
    return NVFP4KV_DISPATCH_HALF_TYPE(p.args.out_type, kOut, [&] {
      gather_rows_kernel<kOut><<<grid, kRowWarps * 32, smem, stream>>>(p);
      return cudaGetLastError();
    });
  }
  const dim3 block = token_block(d, 256, d.tokens_per_page);
  return NVFP4KV_DISPATCH_HALF_TYPE(p.args.out_type, kOut, [&] {
    return NVFP4KV_DISPATCH_HEAD_DIM(d.head_dim, kHeadDim, [&] {
      gather_kernel<kOut, kHeadDim><<<grid, block, 0, stream>>>(p);
      return cudaGetLastError();
    });
  });
}

}  // namespace nvfp4kv::kernels
