// docs/api.md's GPU example, whole: allocate the planned cache (plan_example.hpp),
// store a decode step's K and V rows, gather them back. tests/consumer builds it against the
// installed package (and as a subproject) and runs it where there is a GPU;
// The regions between two "// [name]" lines are docs/api.md's code blocks, and
// tests/consumer/check_docs.py holds the two equal. Exit 77: no usable GPU (skipped).
#include <cuda_runtime.h>  // the runtime header: cudaMalloc's overload for typed pointers

#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

// [includes]
#include "nvfp4kv/api/kv_cache.hpp"  // store, gather, decode: the CUDA host API
#include "nvfp4kv/reference/cache.hpp"
// [includes]
#include "plan_example.hpp"

namespace {

void cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace

int main() try {
  using namespace nvfp4kv;
  if (std::string why; !cuda_device_available(&why)) {
    std::printf("skipped: %s\n", why.c_str());
    return 77;
  }
  const Plan plan = plan_example();
  // [allocate]
  // With a GPU: one allocation per layer, of the size the plan gives.
  const ValidLayout& layout = plan.layout;  // only check()/validate() make these
  std::vector<uint8_t*> layer_buf(32);
  for (auto& p : layer_buf) cudaMalloc(&p, layout.layout().buffers[0].bytes);
  // [allocate]

  // The step's inputs: 5 tokens of K and V rows, (tokens, heads, D) bf16, one padding slot.
  const int64_t num_tokens = 5, layer = 3, row = 8 * 128;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<uint16_t> hk(size_t(num_tokens * row)), hv(hk.size());
  for (size_t i = 0; i < hk.size(); ++i) hk[i] = float_to_bf16(normal(rng)), hv[i] = float_to_bf16(normal(rng));
  const std::vector<int64_t> hslots = {16 * 7 + 0, 16 * 7 + 1, -1, 16 * 2 + 5, 16 * 7 + 2};
  const float hscales[2] = {9.0f / 2688.0f, 9.0f / 2688.0f};  // about amax / (448 * 6)
  uint16_t *k_bf16, *v_bf16;
  int64_t* slot_mapping;
  float* d_scales;
  cuda(cudaMalloc(&k_bf16, hk.size() * 2), "cudaMalloc");
  cuda(cudaMalloc(&v_bf16, hv.size() * 2), "cudaMalloc");
  cuda(cudaMalloc(&slot_mapping, hslots.size() * 8), "cudaMalloc");
  cuda(cudaMalloc(&d_scales, sizeof hscales), "cudaMalloc");
  cuda(cudaMemcpy(k_bf16, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice), "copy");
  cuda(cudaMemcpy(v_bf16, hv.data(), hv.size() * 2, cudaMemcpyHostToDevice), "copy");
  cuda(cudaMemcpy(slot_mapping, hslots.data(), hslots.size() * 8, cudaMemcpyHostToDevice), "copy");
  cuda(cudaMemcpy(d_scales, hscales, sizeof hscales, cudaMemcpyHostToDevice), "copy");
  const float* d_k_scale = d_scales;
  const float* d_v_scale = d_scales + 1;
  cudaStream_t stream;
  cuda(cudaStreamCreate(&stream), "cudaStreamCreate");

  // [status]
  // Counters of what the calls did; the API adds to them and never clears them.
  DeviceStatus* d_status;
  cudaMalloc(&d_status, sizeof(DeviceStatus));
  cudaMemsetAsync(d_status, 0, sizeof(DeviceStatus), stream);
  // [status]

  // [store]
  // Each decode or prefill step, per layer (one launch, graph-capturable):
  StoreArgs s;
  s.rows = {k_bf16, v_bf16, num_tokens, /*token_stride=*/8 * 128};  // (tokens, heads, D)
  s.type = ElementType::kBFloat16;
  s.slots = slot_mapping;                             // page * 16 + token; -1 = padding
  s.slots_are_int64 = true;
  s.layer = layer;
  s.k_global_scale = d_k_scale;                       // device floats (dequant multipliers)
  s.v_global_scale = d_v_scale;
  s.rule = ScaleRule::kStandard;                      // or kFourOverSix
  s.status = d_status;                                // optional
  CacheBuffers bufs;
  bufs.ptr[0] = layer_buf[layer];                     // this layer's allocation
  bufs.count = 1;
  if (Result r = store(layout, bufs, s, stream); !r.ok()) throw std::runtime_error(r.message);
  // [store]

  // One sequence of pages 7 and 2: tokens 0-2 on page 7; the block table is padded to 2 entries.
  const std::vector<int32_t> htable = {7, 2}, hcu = {0, 3};
  int32_t *block_table, *cu_seqlens;
  uint16_t *k_out, *v_out;
  cuda(cudaMalloc(&block_table, 8), "cudaMalloc");
  cuda(cudaMalloc(&cu_seqlens, 8), "cudaMalloc");
  cuda(cudaMalloc(&k_out, 3 * row * 2), "cudaMalloc");
  cuda(cudaMalloc(&v_out, 3 * row * 2), "cudaMalloc");
  cuda(cudaMemcpy(block_table, htable.data(), 8, cudaMemcpyHostToDevice), "copy");
  cuda(cudaMemcpy(cu_seqlens, hcu.data(), 8, cudaMemcpyHostToDevice), "copy");
  const int64_t batch = 1, max_pages = 2;

  // [gather]
  // Dequantize pages back to BF16 for a consumer without a fused kernel:
  // sequence i fills rows [cu_seqlens[i], cu_seqlens[i+1]) of (rows, heads, D) outputs.
  GatherArgs g;
  g.batch.block_table = block_table;                  // (batch, max_pages) int32 page ids
  g.batch.block_table_stride = max_pages;
  g.batch.cu_seqlens = cu_seqlens;                    // (batch + 1) int32 offsets
  g.batch.batch = batch;
  g.layer = layer;
  g.k_global_scale = d_k_scale;
  g.v_global_scale = d_v_scale;
  g.out_type = ElementType::kBFloat16;
  g.k_out = k_out;
  g.v_out = v_out;
  g.status = d_status;
  if (Result r = gather(layout, bufs, g, stream); !r.ok()) throw std::runtime_error(r.message);
  // [gather]

  DeviceStatus st;
  std::vector<uint16_t> gk(size_t(3 * row)), gv(gk.size());
  cuda(cudaStreamSynchronize(stream), "store and gather");
  cuda(cudaMemcpy(&st, d_status, sizeof st, cudaMemcpyDeviceToHost), "copy");
  cuda(cudaMemcpy(gk.data(), k_out, gk.size() * 2, cudaMemcpyDeviceToHost), "copy");
  cuda(cudaMemcpy(gv.data(), v_out, gv.size() * 2, cudaMemcpyDeviceToHost), "copy");

  // The same step on the CPU reference: the gathered rows must match bit for bit.
  reference::HostCache host(layout.layout(), 0);
  StoreArgs hs = s;
  hs.rows = {hk.data(), hv.data(), num_tokens, row};
  hs.slots = hslots.data();
  hs.k_global_scale = &hscales[0];
  hs.v_global_scale = &hscales[1];
  DeviceStatus hst;
  hs.status = &hst;
  reference::store(layout, host.buffers, hs);
  const int32_t hcu_host[2] = {0, 3};
  std::vector<uint16_t> rk(gk.size()), rv(gv.size());
  GatherArgs hg = g;
  hg.batch.block_table = htable.data();
  hg.batch.cu_seqlens = hcu_host;
  hg.k_global_scale = &hscales[0];
  hg.v_global_scale = &hscales[1];
  hg.k_out = rk.data();
  hg.v_out = rv.data();
  hg.status = &hst;
  reference::gather(layout, host.buffers, hg);
  if (st.stored != 4 || st.padding != 1 || st.stored != hst.stored || rk != gk || rv != gv) {
    std::printf("FAILED: stored %llu padding %llu (reference %llu), gathered rows %s the reference\n", st.stored,
                st.padding, hst.stored, (rk == gk && rv == gv) ? "match" : "differ from");
    return 1;
  }
  std::printf("stored %llu tokens, 1 padding slot; 3 gathered rows equal the CPU reference bit for bit\n", st.stored);
  for (auto* p : layer_buf) cudaFree(p);
  return 0;
} catch (const std::exception& e) {
  std::printf("FAILED: %s\n", e.what());
  return 1;
}
