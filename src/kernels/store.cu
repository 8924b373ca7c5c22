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

__device__ __forceinline__ void copy_async_16(uint4* shared, const uint4* global) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(global) : "memory");
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// threadIdx = (group, side, token within the CTA's tokens); blockIdx.y picks
// every gridDim.y-th head (more CTAs when a batch has few tokens).
template <ElementType kType, ScaleRule kRule>
__global__ void __launch_bounds__(kMaxThreads, kRule == ScaleRule::kStandard ? kStandardMinBlocks : 4) store_kernel(const __grid_constant__ StoreParams p) {
  __shared__ uint4 stage[kStages][2][kMaxThreads];
  const CacheDims& d = p.layout.dims();
  const int64_t token = int64_t(blockIdx.x) * blockDim.z + threadIdx.z;
  if (token >= p.rows.tokens) return;
  const int g = int(threadIdx.x), side = int(threadIdx.y);
  const int tid = int(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  const int64_t slot = p.slots_are_int64 ? static_cast<const int64_t*>(p.slots)[token]
                                         : int64_t(static_cast<const int32_t*>(p.slots)[token]);
  const bool counter = (g == 0 && side == 0 && blockIdx.y == 0);
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
  // Head 0's addresses; head h is h * head_step further (LayoutView::head_step).
  uint8_t* const scale_base = element_address(p.layout, p.buffers, scale, c);
  c.column = g * (kBlockSize / 2);
  uint8_t* const data_base = element_address(p.layout, p.buffers, data, c);
  const int64_t scale_head = p.layout.head_step(scale), data_head = p.layout.head_step(data);
  const bool vector_data = p.layout.vector_bytes(data) >= 8;
  // 16-byte aligned rows (checked on the host); head h's group starts h * D elements further.
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(side == 0 ? p.rows.k : p.rows.v) +
                                                    token * p.rows.token_stride + g * kBlockSize);
  const int64_t head_chunks = d.head_dim / 8;  // 16-byte chunks per head of an input or output row
  const int64_t first_head = blockIdx.y, head_stride = gridDim.y;
  const int64_t heads = first_head < d.heads ? (d.heads - first_head + head_stride - 1) / head_stride : 0;
  // One commit per step, empty or not, so "all but the newest kStages - 1 groups
  // done" always means "step j's copies done".
  const auto issue = [&](int64_t j) {
    if (j < heads) {
      const uint4* from = src + (first_head + j * head_stride) * head_chunks;
      copy_async_16(&stage[j % kStages][0][tid], from);
      copy_async_16(&stage[j % kStages][1][tid], from + 1);
    }
    commit_copies();
  };
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) issue(j);
#pragma unroll 1
  for (int64_t j = 0; j < heads; ++j) {
    issue(j + kStages - 1);  // into the slot step j - 1 read
    wait_copies<kStages - 1>();
    const uint4 lo = stage[j % kStages][0][tid], hi = stage[j % kStages][1][tid];
    const int64_t h = first_head + j * head_stride;
    const PackedBlock q = quantize<kType, kRule>(lo, hi, gs, p.status);
    scale_base[h * scale_head] = q.scale;
    if (vector_data) {
      *reinterpret_cast<uint2*>(data_base + h * data_head) = make_uint2(q.data[0], q.data[1]);
    } else {  // rows not 8-byte aligned: byte by byte, each through the layout
      Coord cb = c;
      cb.head = h;
      for (int k = 0; k < kBlockSize / 2; ++k, ++cb.column)
        *element_address(p.layout, p.buffers, data, cb) = uint8_t(q.data[k / 4] >> (8 * (k % 4)));
    }
  }
  wait_copies<0>();  // nothing may still be writing this CTA's shared memory at exit
}

template <ElementType kType, ScaleRule kRule>
cudaError_t launch(const StoreParams& p, cudaStream_t stream) {
  if (p.rows.tokens == 0) return cudaSuccess;
  const CacheDims& d = p.layout.dims();
  const dim3 block = token_block(d, kMaxThreads);
  const int64_t token_ctas = (p.rows.tokens + block.z - 1) / block.z;
  // Small batches (decode steps) split the heads over more CTAs: aim for about
  // 1024 CTAs, enough to fill any current GPU.
  const int64_t slices = std::min<int64_t>(d.heads, std::max<int64_t>(1, (1024 + token_ctas - 1) / token_ctas));
  store_kernel<kType, kRule><<<dim3(unsigned(token_ctas), unsigned(slices)), block, 0, stream>>>(p);
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
