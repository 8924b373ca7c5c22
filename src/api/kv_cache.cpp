// Host API: check every argument (core's shared rules, then the GPU's own), build
// the family's params by name, launch. Nothing is launched when a check fails.
#include "nvfp4kv/api/kv_cache.hpp"

#include <cuda_runtime_api.h>

#include "../kernels/gather/params.hpp"
#include "../kernels/store/params.hpp"
#include "launch_checks.hpp"

namespace nvfp4kv {

Result store(const ValidLayout& layout, const CacheBuffers& buffers, const StoreArgs& a, cudaStream_t stream) {
  const char* who = "store";
  if (std::string p = store_problem(layout, buffers, a); !p.empty()) return api::invalid(who, p);
  if (Result r = api::gpu_cache_checks(layout, buffers, who); !r.ok()) return r;
  kernels::LayerFormatView format;
  if (Result r = api::layer_format_view(layout, a.layer, a.k_mean, a.k_channel_scale, who, a.rule, &format); !r.ok())
    return r;
  if (a.type != ElementType::kBFloat16 && a.type != ElementType::kFloat16)
    return api::invalid(who, std::string("rows must be bf16 or fp16, got ") + element_type_name(a.type));
  if (a.rows.tokens == 0) return {};
  if (!api::aligned(a.rows.k, 16) || !api::aligned(a.rows.v, 16))
    return api::invalid(who, "K and V rows must be 16-byte aligned");
  if (a.rows.token_stride % 8 != 0)
    return api::invalid(who, "token stride must be a multiple of 8 elements (16-byte aligned rows), got " +
                                 std::to_string(a.rows.token_stride));
  if (!api::aligned(a.slots, a.slots_are_int64 ? 8 : 4)) return api::invalid(who, "slots are misaligned");
  if (a.rows.tokens > INT32_MAX) return api::invalid(who, "at most 2^31 - 1 tokens per call");
  const CacheDims& d = layout.layout().dims;
  if (d.pages * d.tokens_per_page > INT32_MAX)
    return {Status::kUnsupported, "store: a layout of more than 2^31 - 1 token slots per layer"};
  const kernels::StoreParams params{.layout = layout.view(), .cache = buffers, .args = a, .format = format};
  return api::from_cuda(kernels::launch_store(params, stream), who);
}

Result gather(const ValidLayout& layout, const CacheBuffers& buffers, const GatherArgs& a, cudaStream_t stream) {
  const char* who = "gather";
  if (std::string p = gather_problem(layout, buffers, a); !p.empty()) return api::invalid(who, p);
  if (Result r = api::gpu_cache_checks(layout, buffers, who); !r.ok()) return r;
  if (a.out_type != ElementType::kBFloat16 && a.out_type != ElementType::kFloat16)
    return api::invalid(who, std::string("output must be bf16 or fp16, got ") + element_type_name(a.out_type));
  kernels::LayerFormatView format;
  if (Result r = api::layer_format_view(layout, a.layer, a.k_mean, a.k_channel_scale, who, ScaleRule::kStandard, &format);
      !r.ok())
    return r;
  if (a.batch.batch == 0) return {};
  if (!api::aligned(a.k_out, 16) || !api::aligned(a.v_out, 16))
    return api::invalid(who, "outputs must be 16-byte aligned");
  const kernels::GatherParams params{.layout = layout.view(), .cache = buffers, .args = a, .format = format};
  return api::from_cuda(kernels::launch_gather(params, stream), who);
}

bool cuda_device_available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0) || e == cudaErrorInsufficientDriver) {
    if (why) *why = "no CUDA GPU on this machine";
    return false;
  }
  if (e != cudaSuccess) {
    if (why) *why = std::string("the CUDA runtime cannot reach a GPU: ") + cudaGetErrorString(e);
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
