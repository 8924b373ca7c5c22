// Timing of prefill attention (harness/prefill_bench.hpp).
#include <algorithm>
#include <numeric>
#include <random>

#include "nvfp4kv/api/prefill.hpp"
#include "nvfp4kv/harness/decode_bench.hpp"
#include "nvfp4kv/harness/device_buffer.hpp"
#include "nvfp4kv/harness/prefill_bench.hpp"
#include "timing.hpp"

namespace nvfp4kv::harness {

PrefillBenchResult bench_prefill(const PrefillBenchShape& s) {
  PrefillBenchResult r;
  r.shape = s;
  const int64_t kv = s.cached + s.prompt;
  const int64_t entries = (kv + s.tokens_per_page - 1) / s.tokens_per_page;
  const ValidLayout v = bench_layout(s.layout, s.transform, s.batch * entries, s.tokens_per_page, s.kv_heads, s.head_dim);
  std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> buffers;
  CacheBuffers cb;
  for (const Buffer& b : v.layout().buffers) {
    buffers.push_back(std::make_unique<DeviceBuffer<uint8_t>>(size_t(b.bytes)));
    fill_random_device_bytes(buffers.back()->get(), size_t(b.bytes), 31 + cb.count);
    cb.ptr[cb.count++] = buffers.back()->get();
  }
  std::vector<int32_t> table(size_t(s.batch * entries)), cu(size_t(s.batch + 1));
  std::iota(table.begin(), table.end(), 0);
  std::mt19937_64 rng(6);
  std::shuffle(table.begin(), table.end(), rng);
  for (int64_t b = 0; b <= s.batch; ++b) cu[size_t(b)] = int32_t(b * s.prompt);
  auto dtable = DeviceBuffer<int32_t>::from(table);
  auto dcu = DeviceBuffer<int32_t>::from(cu);
  auto dlen = DeviceBuffer<int32_t>::from(std::vector<int32_t>(size_t(s.batch), int32_t(kv)));
  DeviceBuffer<uint16_t> q(size_t(s.batch * s.prompt * s.q_heads * s.head_dim)), out(q.size());
  fill_random_device_bytes(q.get(), q.size() * 2, 41);  // finite halves: the top bits of each byte are masked
  auto gs = DeviceBuffer<float>::from({0.01f, 0.01f});
  const FormatVectors vectors(v);
  PrefillArgs a;
  a.q = q.get();
  a.q_type = s.type;
  a.q_heads = s.q_heads;
  a.cu_seqlens_q = dcu.get();
  a.max_q_len = s.prompt;
  a.batch = {.block_table = dtable.get(), .block_table_stride = entries, .seq_lens = dlen.get(), .batch = s.batch};
  a.softmax_scale = float(1.0 / std::sqrt(double(s.head_dim)));
  a.k_global_scale = gs.get();
  a.v_global_scale = gs.get() + 1;
  vectors.give(a);
  a.out = out.get();
  const std::vector<int32_t> q_lens(size_t(s.batch), int32_t(s.prompt));
  size_t workspace_bytes = 0;
  if (s.mixed)
    if (Result res = mixed_workspace_bytes(v, q_lens.data(), s.batch, s.q_heads, entries, &workspace_bytes); !res.ok())
      throw Error(res.message);
  DeviceBuffer<uint8_t> workspace(std::max<size_t>(workspace_bytes, 256));
  const MixedBatch m{.args = a, .q_lens = q_lens.data(), .workspace = workspace.get(), .workspace_bytes = workspace.size()};
  const auto launch = [&] {
    const Result res = s.mixed ? mixed_attention(v, cb, m, nullptr) : prefill_attention(v, cb, a, nullptr);
    if (!res.ok()) throw Error(res.message);
  };
  r.ms = median_ms(launch, 7);
  // Query i of a sequence attends to cached + i + 1 tokens.
  const double pairs = double(s.prompt) * double(s.cached) + double(s.prompt) * double(s.prompt + 1) / 2;
  r.flops = 4.0 * double(s.head_dim) * double(s.q_heads) * double(s.batch) * pairs;
  r.tflops = r.flops / (r.ms * 1e-3) / 1e12;
  return r;
}

}  // namespace nvfp4kv::harness
