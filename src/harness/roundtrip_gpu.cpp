// The GPU path of the round trip: the same rows through nvfp4kv's store and
// gather kernels, the cache copied back and audited like the reference's.
#include <cuda_runtime_api.h>

#include "nvfp4kv/api/kv_cache.hpp"
#include "nvfp4kv/harness/device_buffer.hpp"
#include "roundtrip_workload.hpp"

namespace nvfp4kv::harness {

RoundtripPath gpu_roundtrip(const ValidLayout& valid, const RoundtripWorkload& w) {
  RoundtripPath p;
  if (!cuda_device_available(&p.why_not)) return p;
  const Layout& l = valid.layout();
  const CacheDims& d = l.dims;
  try {
    DeviceCache cache(l, kRoundtripPoison);
    auto k = DeviceBuffer<uint16_t>::from(w.rows.k), v = DeviceBuffer<uint16_t>::from(w.rows.v);
    auto slots = DeviceBuffer<int64_t>::from(w.slots);
    auto scales = DeviceBuffer<float>::from({w.k_gs, w.v_gs});
    auto status = DeviceBuffer<DeviceStatus>::from({DeviceStatus{}});
    const int64_t gathered = int64_t(w.block_table.size()) * d.tokens_per_page;
    auto table = DeviceBuffer<int32_t>::from(w.block_table.empty() ? std::vector<int32_t>{0} : w.block_table);
    auto cu = DeviceBuffer<int32_t>::from({0, int32_t(gathered)});
    const size_t out_elems = size_t(gathered * d.heads * d.head_dim);
    DeviceBuffer<uint16_t> kout(out_elems), vout(out_elems);
    kout.fill_bytes(0xFF);
    vout.fill_bytes(0xFF);
    StoreArgs s;
    s.rows = {k.get(), v.get(), w.rows.tokens, w.rows.stride};
    s.type = w.rows.type;
    s.slots = slots.get();
    s.slots_are_int64 = true;
    s.k_global_scale = scales.get();
    s.v_global_scale = scales.get() + 1;
    s.status = status.get();
    Result r = store(valid, cache.view(), s, nullptr);
    if (!r.ok()) {
      p.refused = true;
      p.why_not = r.message;
      return p;
    }
    GatherArgs g;
    g.batch = {.block_table = table.get(), .block_table_stride = std::max<int64_t>(1, int64_t(w.block_table.size())),
               .cu_seqlens = cu.get(), .batch = w.block_table.empty() ? 0 : 1};
    g.k_global_scale = scales.get();
    g.v_global_scale = scales.get() + 1;
    g.out_type = ElementType::kBFloat16;
    g.k_out = kout.get();
    g.v_out = vout.get();
    g.status = status.get();
    r = gather(valid, cache.view(), g, nullptr);
    if (!r.ok()) {
      p.refused = true;
      p.why_not = r.message;
      return p;
    }
    NVFP4KV_CUDA_CHECK(cudaDeviceSynchronize());
    p.store = audit_store(valid, 0, w.slots, w.qk, w.qv, cache.download(), kRoundtripPoison);
    const auto gk = kout.download(), gv = vout.download();
    const int64_t row = d.heads * d.head_dim;
    for (int64_t i = 0; i < int64_t(w.slots.size()); ++i) {
      const int64_t at = gathered_row(w, d, i);
      if (at < 0) continue;
      for (int64_t e = 0; e < row; ++e, p.gather_values += 2) {
        p.gather_bad += gk[size_t(at * row + e)] != float_to_bf16(w.dk[size_t(i * row + e)]);
        p.gather_bad += gv[size_t(at * row + e)] != float_to_bf16(w.dv[size_t(i * row + e)]);
      }
    }
    p.status = status.download()[0];
    p.ran = true;
  } catch (const CudaError& e) {
    p.refused = true;
    p.why_not = e.what();
  }
  return p;
}

}  // namespace nvfp4kv::harness
