// The warpgroup MMA building blocks prefill's consumers use (src/kernels/attention/wgmma.cuh),
// on their own: tiles written through swizzled_offset, read by wgmma through swizzled_desc,
// with the descriptors prefill takes (kmajor_desc, nmajor_desc) and prefill's tile shapes (Q of
// 128 rows, each warpgroup its 64; K and V of 64 tokens), must
// give exactly the plain products S = Q K^T (K-major operands from shared memory) and
// O = P V (P from registers as mma.sync's A fragments, V N-major), for D 64 and 128. Small
// integers make every product and sum exact, so one wrong descriptor field, swizzle or
// fragment index shows as a mismatch rather than as a tolerance question. Skipped, with a
// message, without a GPU or on one without wgmma (only sm_90a has it).
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "../../src/kernels/attention/wgmma.cuh"
#include "nvfp4kv/api/kv_cache.hpp"

namespace nvfp4kv {
namespace {

using kernels::attention::swizzled_offset;
constexpr int kQRows = 128, kTokens = 64;

// q (128 x kD), k (64 x kD), p (128 x 64), v (64 x kD), row-major; s (128 x 64), o (128 x kD).
template <int kD>
__global__ void wgmma_tiles(const __half* q, const __half* k, const __half* p, const __half* v, float* s, float* o,
                            int* ran) {
#if NVFP4KV_HAS_WGMMA
  using namespace kernels::attention;
  extern __shared__ __align__(1024) char raw[];
  char* base = raw + ((1024u - (kernels::shared_address(raw) & 1023u)) & 1023u);
  char* const sq = base;
  char* const sk = sq + kQRows * kD * 2;
  char* const sv = sk + kTokens * kD * 2;
  for (int i = threadIdx.x; i < kQRows * kD; i += blockDim.x)
    *reinterpret_cast<__half*>(sq + swizzled_offset(kQRows, i / kD, i % kD)) = q[i];
  for (int i = threadIdx.x; i < kTokens * kD; i += blockDim.x) {
    *reinterpret_cast<__half*>(sk + swizzled_offset(kTokens, i / kD, i % kD)) = k[i];
    *reinterpret_cast<__half*>(sv + swizzled_offset(kTokens, i / kD, i % kD)) = v[i];
  }
  fence_shared_to_async();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  float acc[8][4];
  for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0;
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks)
    wgmma_m64n64k16_ss(acc, kmajor_desc(sq, kQRows, 64 * (warp / 4), ks), kmajor_desc(sk, kTokens, 0, ks), ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_accumulators(acc);
  const int r0 = 16 * warp + g;
  for (int j = 0; j < 8; ++j)
    for (int e = 0; e < 4; ++e) s[(r0 + 8 * (e >> 1)) * kTokens + 8 * j + 2 * c + (e & 1)] = acc[j][e];
  // P's A fragments (rows r0, r0 + 8; columns 16 kk + 2c (+1), + 8).
  auto pair = [&](int row, int col) {
    const __half2 h = __halves2half2(p[row * kTokens + col], p[row * kTokens + col + 1]);
    return *reinterpret_cast<const uint32_t*>(&h);
  };
  float out[kD / 8][4];
  for (int j = 0; j < kD / 8; ++j) out[j][0] = out[j][1] = out[j][2] = out[j][3] = 0;
  uint32_t pa[4][4];
  for (int kk = 0; kk < 4; ++kk) {
    pa[kk][0] = pair(r0, 16 * kk + 2 * c), pa[kk][1] = pair(r0 + 8, 16 * kk + 2 * c);
    pa[kk][2] = pair(r0, 16 * kk + 8 + 2 * c), pa[kk][3] = pair(r0 + 8, 16 * kk + 8 + 2 * c);
  }
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint64_t vd = nmajor_desc(sv, kTokens, kk);
    if constexpr (kD == 128)
      wgmma_m64n128k16_rs_nmajor(out, pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], vd, 1);
    else
      wgmma_m64n64k16_rs_nmajor(out, pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], vd, 1);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_accumulators(out);
  for (int j = 0; j < kD / 8; ++j)
    for (int e = 0; e < 4; ++e) o[(r0 + 8 * (e >> 1)) * kD + 8 * j + 2 * c + (e & 1)] = out[j][e];
  if (threadIdx.x == 0) *ran = 1;
#else
  if (threadIdx.x == 0) *ran = 0;
#endif
}

template <int kD>
void check_tiles() {
  std::string why;
  if (!cuda_device_available(&why)) GTEST_SKIP() << "GPU test skipped: " << why;
  std::mt19937 rng(kD);
  auto fill = [&](std::vector<float>& x, size_t n) {
    x.resize(n);
    for (auto& e : x) e = float(int(rng() % 9) - 4);
  };
  std::vector<float> q, k, p, v;
  fill(q, size_t(kQRows) * kD), fill(k, size_t(kTokens) * kD), fill(p, size_t(kQRows) * kTokens),
      fill(v, size_t(kTokens) * kD);
  auto to_device = [](const std::vector<float>& x) {
    std::vector<__half> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = __float2half(x[i]);
    __half* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, h.size() * 2), cudaSuccess);
    cudaMemcpy(d, h.data(), h.size() * 2, cudaMemcpyHostToDevice);
    return d;
  };
  __half *dq = to_device(q), *dk = to_device(k), *dp = to_device(p), *dv = to_device(v);
  float *ds = nullptr, *dout = nullptr;
  int* dran = nullptr;
  ASSERT_EQ(cudaMalloc(&ds, sizeof(float) * kQRows * kTokens), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dout, sizeof(float) * kQRows * kD), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dran, sizeof(int)), cudaSuccess);
  const int smem = 1024 + (kQRows + 2 * kTokens) * kD * 2;
  ASSERT_EQ(cudaFuncSetAttribute(wgmma_tiles<kD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), cudaSuccess);
  wgmma_tiles<kD><<<1, 256, smem>>>(dq, dk, dp, dv, ds, dout, dran);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  int ran = 0;
  std::vector<float> s(size_t(kQRows) * kTokens), o(size_t(kQRows) * kD);
  cudaMemcpy(&ran, dran, sizeof ran, cudaMemcpyDeviceToHost);
  cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost);
  for (void* ptr : {static_cast<void*>(dq), static_cast<void*>(dk), static_cast<void*>(dp), static_cast<void*>(dv),
                    static_cast<void*>(ds), static_cast<void*>(dout), static_cast<void*>(dran)})
    cudaFree(ptr);
  if (!ran) GTEST_SKIP() << "this GPU's build has no wgmma (sm_90a only): prefill runs mma.sync here";
  int bad_s = 0, bad_o = 0;
  for (int r = 0; r < kQRows; ++r)
    for (int t = 0; t < kTokens; ++t) {
      double want = 0;
      for (int d = 0; d < kD; ++d) want += double(q[size_t(r) * kD + d]) * k[size_t(t) * kD + d];
      if (s[size_t(r) * kTokens + t] != float(want) && bad_s++ < 3)
        ADD_FAILURE() << "S row " << r << " token " << t << ": " << s[size_t(r) * kTokens + t] << " want " << want;
    }
  for (int r = 0; r < kQRows; ++r)
    for (int d = 0; d < kD; ++d) {
      double want = 0;
      for (int t = 0; t < kTokens; ++t) want += double(p[size_t(r) * kTokens + t]) * v[size_t(t) * kD + d];
      if (o[size_t(r) * kD + d] != float(want) && bad_o++ < 3)
        ADD_FAILURE() << "O row " << r << " column " << d << ": " << o[size_t(r) * kD + d] << " want " << want;
    }
  EXPECT_EQ(bad_s, 0) << "of " << kQRows * kTokens << " S entries";
  EXPECT_EQ(bad_o, 0) << "of " << kQRows * kD << " O entries";
}

TEST(GpuWgmma, SwizzledTilesGiveThePlainProductsAtD64) { check_tiles<64>(); }
TEST(GpuWgmma, SwizzledTilesGiveThePlainProductsAtD128) { check_tiles<128>(); }

}  // namespace
}  // namespace nvfp4kv
