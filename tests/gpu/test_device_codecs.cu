// The conversion instructions the kernels use, on the GPU itself, against the
// bit-arithmetic definitions the CPU reference runs:
//  - E4M3 encode (cvt.rn.satfinite.e4m3x2.f32) for every one of the 2^32 float
//    patterns that is not a NaN, and E4M3 decode for all 256 codes;
//  - on sm_100a/sm_120a, the native E2M1 block encoder against the portable one.
// Skipped, with a message, without a GPU (or, for E2M1, on a GPU without the
// instruction).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "nvfp4kv/api/kv_cache.hpp"
#include "nvfp4kv/core/packed_block.hpp"

namespace nvfp4kv {
namespace {

struct Mismatches {
  unsigned long long count;
  uint32_t first_input;
  uint32_t first_got, first_want;
  int native;  // whether the instruction path was compiled for this GPU
};

__device__ void record(Mismatches* m, uint32_t input, uint32_t got, uint32_t want) {
  if (atomicAdd(&m->count, 1ull) == 0) m->first_input = input, m->first_got = got, m->first_want = want;
}

__global__ void e4m3_encode_all(Mismatches* m) {
  if (blockIdx.x == 0 && threadIdx.x == 0) m->native = NVFP4KV_NATIVE_E4M3;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t u = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; u < (1ull << 32); u += stride) {
    const float x = bits_float(uint32_t(u));
    if (x != x) continue;
    const uint8_t got = e4m3_encode(x), want = e4m3_encode_bits(x);
    if (got != want) record(m, uint32_t(u), got, want);
  }
}

__global__ void e4m3_decode_all(Mismatches* m) {
  const int code = threadIdx.x;
  const float got = e4m3_decode(uint8_t(code)), want = e4m3_decode_bits(uint8_t(code));
  const bool nan_code = (code & 0x7F) == 0x7F;
  if (nan_code ? !(got != got) : float_bits(got) != float_bits(want)) record(m, uint32_t(code), float_bits(got), float_bits(want));
}

__global__ void e2m1_native_vs_portable(const uint32_t* words, const float* invs, int blocks, Mismatches* m) {
  if (blockIdx.x == 0 && threadIdx.x == 0) m->native = NVFP4KV_NATIVE_E2M1;
  for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < blocks; b += gridDim.x * blockDim.x) {
    const uint32_t* w = words + 4 * b;
    const uint32_t got = encode_eight<ElementType::kBFloat16>(w, invs[b]);
    const uint32_t want = encode_eight_portable<ElementType::kBFloat16>(w, invs[b]);
    if (got != want) record(m, uint32_t(b), got, want);
  }
}

class GpuCodecs : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_device_available(&why)) GTEST_SKIP() << "GPU test skipped: " << why;
    ASSERT_EQ(cudaMalloc(&m_, sizeof(Mismatches)), cudaSuccess);
    ASSERT_EQ(cudaMemset(m_, 0, sizeof(Mismatches)), cudaSuccess);
  }
  void TearDown() override { cudaFree(m_); }
  Mismatches result() {
    Mismatches h{};
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(&h, m_, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  Mismatches* m_ = nullptr;
};

TEST_F(GpuCodecs, E4M3EncodeInstructionEqualsTheDefinitionOnEveryFloat) {
  e4m3_encode_all<<<132 * 16, 256>>>(m_);
  const Mismatches r = result();
  std::printf("E4M3 encode on the GPU: %s path, %llu mismatches over the 2^32 patterns less NaNs\n",
              r.native ? "instruction" : "bit-arithmetic", r.count);
  EXPECT_EQ(r.count, 0u) << "first: input 0x" << std::hex << r.first_input << " got 0x" << r.first_got << " want 0x"
                         << r.first_want;
}

TEST_F(GpuCodecs, E4M3DecodeInstructionEqualsTheDefinitionOnEveryCode) {
  e4m3_decode_all<<<1, 256>>>(m_);
  const Mismatches r = result();
  EXPECT_EQ(r.count, 0u) << "first: code " << r.first_input << " got 0x" << std::hex << r.first_got << " want 0x"
                         << r.first_want;
}

TEST_F(GpuCodecs, NativeE2M1EncoderEqualsThePortableOne) {
  // Blocks of bf16 words with scales from the block rule's range, plus ties.
  const int blocks = 1 << 20;
  std::mt19937 rng(11);
  std::vector<uint32_t> words(size_t(blocks) * 4);
  std::vector<float> invs(static_cast<size_t>(blocks));
  for (auto& w : words) w = rng() & 0xBFFFBFFFu;  // finite bf16 pairs (exponent top bit clear)
  for (int b = 0; b < blocks; ++b)
    invs[size_t(b)] = b % 4 == 0 ? 0.0f : std::ldexp(1.0f + float(rng() % 8) / 8.0f, int(rng() % 40) - 20);
  uint32_t* dw;
  float* di;
  ASSERT_EQ(cudaMalloc(&dw, words.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&di, invs.size() * 4), cudaSuccess);
  cudaMemcpy(dw, words.data(), words.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(di, invs.data(), invs.size() * 4, cudaMemcpyHostToDevice);
  e2m1_native_vs_portable<<<132 * 8, 256>>>(dw, di, blocks, m_);
  const Mismatches r = result();
  cudaFree(dw);
  cudaFree(di);
  if (!r.native) GTEST_SKIP() << "this GPU's build has no E2M1 conversion instruction (sm_100a/sm_120a have it); "
                                 "the portable encoder ran and is checked by every other GPU test";
  EXPECT_EQ(r.count, 0u) << "first: block " << r.first_input << " got 0x" << std::hex << r.first_got << " want 0x"
                         << r.first_want;
}

}  // namespace
}  // namespace nvfp4kv
