// Decode attention's host side: the planner's kernel facts (shared memory,
// occupancy), the tensor maps of strided-row layouts, and the launch, which picks the
// head dim's instances (decode_d64.cu, decode_d128.cu, decode_d256.cu; the kernel is
// in kernel.cuh).
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include "../common/dispatch.cuh"
#include "instances.hpp"
#include "smem.cuh"

namespace nvfp4kv::kernels {

cudaError_t plan_decode_geometry(DecodeParams& p, std::string* unsupported) {
  using namespace decode;
  DecodeDeviceFacts dev;
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&dev.sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&dev.max_smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&dev.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
  if (e != cudaSuccess) return e;
  const int64_t n = p.layout.dims().tokens_per_page;
  DecodeKernelFacts kernel;
  kernel.smem_bytes = [n, steps = p.format_steps](const DecodeGeometry& geo) {
    size_t bytes = 0;
    NVFP4KV_DISPATCH_ATTENTION_HEAD_DIM(geo.head_dim, kD, [&] { bytes = carve<kD>(nullptr, geo, n, nullptr, steps); });
    return int(bytes + 128);  // slack kept from the first design (the dynamic base is 128-byte aligned already)
  };
  kernel.blocks_per_sm = [&](const DecodeGeometry& geo) {
    DecodeParams q = p;
    q.geometry = geo;
    // The bf16 instance without soft-cap stands for all four: plan_decode (which
    // knows neither) and the call must plan alike (__launch_bounds__ gives every
    // instance the same blocks per SM).
    q.args.q_type = ElementType::kBFloat16;
    q.args.softcap = 0;
    int per_sm = 0;
    NVFP4KV_DISPATCH_ATTENTION_HEAD_DIM(geo.head_dim, kD, [&] { e = occupancy_dim<kD>(q, &per_sm); });
    return e == cudaSuccess ? per_sm : -1;
  };
  *unsupported = nvfp4kv::plan_decode_geometry(p.layout, p.args, dev, kernel, &p.geometry, p.max_q_len);
  if (e != cudaSuccess) {
    unsupported->clear();
    return e;
  }
  return cudaSuccess;
}

namespace {

// The driver's tensor-map encoder, found once through the runtime (no libcuda link).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// p.rows: each region of the call's layer as a 4-D byte tensor (columns, token,
// head, page) whose box is one (page, head) tile of N rows of row_pitch bytes; where
// the heads share a row (tensor_rows_flat) the columns run over all heads and the
// head dimension has extent 1. An extent of 1 takes a stride past the dimension
// before it (any stride the copy engine accepts).
cudaError_t encode_tensor_rows(DecodeParams& p) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encode) return cudaErrorNotSupported;
  const CacheDims& d = p.layout.dims();
  const auto up16 = [](uint64_t b) { return (b + 15) / 16 * 16; };
  for (int ri = 0; ri < kRegionCount; ++ri) {
    const Region r = Region(ri);
    if (!d.holds(r)) continue;  // an FP8 side's scales: nothing to copy
    const RegionMap& m = p.layout.region(r);
    const bool flat = tensor_rows_flat(m.head, d.heads);
    const uint64_t cols = uint64_t(d.columns(r)), n = uint64_t(d.tokens_per_page);
    const cuuint64_t dims[4] = {flat ? cols * uint64_t(d.heads) : cols, n, flat ? 1 : uint64_t(d.heads), uint64_t(d.pages)};
    cuuint64_t strides[3];
    strides[0] = n == 1 ? up16(dims[0]) : uint64_t(m.token.stride);
    strides[1] = dims[2] == 1 ? up16(strides[0] * n) : uint64_t(m.head);
    strides[2] = dims[3] == 1 ? up16(strides[1] * dims[2]) : uint64_t(m.page);
    const cuuint32_t box[4] = {cuuint32_t(p.geometry.row_pitch[ri]), cuuint32_t(n), 1, 1};
    const cuuint32_t element_strides[4] = {1, 1, 1, 1};
    uint8_t* base = p.cache.ptr[m.buffer] + m.offset + p.args.layer * m.layer;
    const CUresult e = encode(&p.rows[ri], CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, base, dims, strides, box, element_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (e != CUDA_SUCCESS) return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t launch_decode(const DecodeParams& p, cudaStream_t stream) {
  if (p.args.batch.batch == 0) return cudaSuccess;
  const auto launch = [stream](const DecodeParams& call) {
    return NVFP4KV_DISPATCH_ATTENTION_HEAD_DIM(call.geometry.head_dim, kD, [&] { return decode::launch_dim<kD>(call, stream); });
  };
  if (!p.geometry.tensor_rows) return launch(p);
  DecodeParams q = p;
  if (const cudaError_t e = encode_tensor_rows(q); e != cudaSuccess) return e;
  return launch(q);
}

}  // namespace nvfp4kv::kernels
