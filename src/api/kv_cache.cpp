// Host API: check every argument, then launch. Nothing is launched when a check fails.
#include "nvfp4kv/api/kv_cache.hpp"

#include <cuda_runtime_api.h>

#include "../kernels/kernels.hpp"

namespace nvfp4kv {
namespace {

Result invalid(std::string m) { return {Status::kInvalidArgument, std::move(m)}; }

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

Result check_common(const ValidLayout& layout, const CacheBuffers& buffers, int64_t layer, const float* kgs,
                    const float* vgs, const char* who) {
  const Layout& l = layout.layout();
  const std::string w = who;
  if (buffers.count != int(l.buffers.size()))
    return invalid(w + ": layout \"" + l.name + "\" has " + std::to_string(l.buffers.size()) + " buffers, got " +
                   std::to_string(buffers.count));
  for (int b = 0; b < buffers.count; ++b) {
    if (!buffers.ptr[b]) return invalid(w + ": buffer \"" + l.buffers[size_t(b)].name + "\" is null");
    if (!aligned(buffers.ptr[b], 16))
      return invalid(w + ": buffer \"" + l.buffers[size_t(b)].name + "\" is not 16-byte aligned");
  }
  if (layer < 0 || layer >= l.dims.layers)
    return invalid(w + ": layer " + std::to_string(layer) + " outside [0, " + std::to_string(l.dims.layers) + ")");
  if (!kgs || !vgs) return invalid(w + ": the K and V global scales (device pointers to float) are required");
  if (l.dims.head_dim > 1024)
    return {Status::kUnsupported, w + ": head dim " + std::to_string(l.dims.head_dim) + " is above 1024"};
  return {};
}

Result from_cuda(cudaError_t e, const char* who) {
  if (e == cudaSuccess) return {};
  return {Status::kCudaError, std::string(who) + ": " + cudaGetErrorString(e)};
}

}  // namespace

Result store(const ValidLayout& layout, const CacheBuffers& buffers, const StoreArgs& a, cudaStream_t stream) {
  if (Result r = check_common(layout, buffers, a.layer, a.k_global_scale, a.v_global_scale, "store"); !r.ok()) return r;
  const CacheDims& d = layout.layout().dims;
  if (a.type != ElementType::kBFloat16 && a.type != ElementType::kFloat16)
    return invalid(std::string("store: rows must be bf16 or fp16, got ") + element_type_name(a.type));
  if (a.rows.tokens < 0) return invalid("store: negative token count");
  if (a.rows.tokens == 0) return {};
  if (!a.rows.k || !a.rows.v || !a.slots) return invalid("store: K rows, V rows and slots are required");
  if (!aligned(a.rows.k, 16) || !aligned(a.rows.v, 16))
    return invalid("store: K and V rows must be 16-byte aligned");
  if (a.rows.token_stride < d.heads * d.head_dim)
    return invalid("store: token stride " + std::to_string(a.rows.token_stride) + " is smaller than heads * head dim = " +
                   std::to_string(d.heads * d.head_dim) + " (rows must be (tokens, heads, D) with D contiguous)");
  if (a.rows.token_stride % 8 != 0)
    return invalid("store: token stride must be a multiple of 8 elements (16-byte aligned rows), got " +
                   std::to_string(a.rows.token_stride));
  if (!aligned(a.slots, a.slots_are_int64 ? 8 : 4)) return invalid("store: slots are misaligned");
  if (a.rows.tokens > INT32_MAX) return invalid("store: at most 2^31 - 1 tokens per call");
  if (d.pages * d.tokens_per_page > INT32_MAX)
    return {Status::kUnsupported, "store: a layout of more than 2^31 - 1 token slots per layer"};
  kernels::StoreParams p{layout.view(), buffers, a.rows, a.slots, a.slots_are_int64, a.layer,
                         a.k_global_scale, a.v_global_scale, a.status};
  return from_cuda(kernels::launch_store(p, a.type, a.rule, stream), "store");
}

Result gather(const ValidLayout& layout, const CacheBuffers& buffers, const GatherArgs& a, cudaStream_t stream) {
  if (Result r = check_common(layout, buffers, a.layer, a.k_global_scale, a.v_global_scale, "gather"); !r.ok()) return r;
  if (a.out_type != ElementType::kBFloat16 && a.out_type != ElementType::kFloat16)
    return invalid(std::string("gather: output must be bf16 or fp16, got ") + element_type_name(a.out_type));
  if (a.batch < 0 || a.batch > 65535) return invalid("gather: batch must be in [0, 65535]");
  if (a.batch == 0) return {};
  if (!a.block_table || !a.cu_seqlens || !a.k_out || !a.v_out)
    return invalid("gather: block table, cu_seqlens and both outputs are required");
  if (a.block_table_stride < 1) return invalid("gather: block table stride must be >= 1");
  if (a.block_table_stride > INT32_MAX) return invalid("gather: block table stride must be < 2^31");
  if (!aligned(a.k_out, 16) || !aligned(a.v_out, 16)) return invalid("gather: outputs must be 16-byte aligned");
  kernels::GatherParams p{layout.view(), buffers, a.block_table, a.block_table_stride, a.cu_seqlens, a.batch, a.layer,
                          a.k_global_scale, a.v_global_scale, a.k_out, a.v_out, a.status};
  return from_cuda(kernels::launch_gather(p, a.out_type, stream), "gather");
}

bool cuda_device_available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) *why = e != cudaSuccess ? std::string("no CUDA device (") + cudaGetErrorString(e) + ")" : "no CUDA device";
    return false;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major < 9) {
    if (why) *why = "the GPU is older than compute capability 9.0 (Hopper); nvfp4kv's kernels are built for sm_90a and newer";
    return false;
  }
  return true;
}

}  // namespace nvfp4kv
