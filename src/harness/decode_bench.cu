#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "nvfp4kv/api/decode.hpp"
#include "nvfp4kv/api/kv_cache.hpp"
#include "nvfp4kv/harness/decode_bench.hpp"
#include "nvfp4kv/harness/device_buffer.hpp"
#include "nvfp4kv/harness/workload.hpp"
#include "nvfp4kv/reference/attention.hpp"
#include "nvfp4kv/reference/cache.hpp"
#include "timing.hpp"

namespace nvfp4kv::harness {
namespace {

__global__ void stream_read(const uint4* __restrict__ p, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) sink[0] = acc;  // keeps the loads; practically never taken
}

// Random bytes with every nibble's sign and every byte's top bit... cleared where
// it would make a NaN block scale: byte & 0x77 is never 0x7F or 0xFF.
__global__ void fill_random(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    p[i] = uint8_t(x) & 0x77u;
  }
}

void require(const Result& r) {
  if (!r.ok()) throw Error(r.message);
}

ValidLayout shape_layout(const DecodeBenchShape& s, int64_t pages) {
  return bench_layout(s.layout, s.transform, pages, s.tokens_per_page, s.kv_heads, s.head_dim);
}

// A small instance of the shape (same head dim, group, layout and type) against
// the fp64 reference: what is timed is checked first.
double check_small(const DecodeBenchShape& s) {
  const int64_t context = std::min<int64_t>(s.context, 1000), batch = 2;
  const int64_t entries = (context + s.tokens_per_page - 1) / s.tokens_per_page;
  const ValidLayout v = shape_layout(s, batch * entries);
  const auto host = random_cache(v, 0, 3);
  DeviceCache cache(v.layout(), 0);
  cache.upload(host);
  std::vector<int32_t> table(size_t(batch * entries)), lengths = {int32_t(context), int32_t(context - 7)};
  std::iota(table.begin(), table.end(), 0);
  std::mt19937_64 rng(4);
  std::shuffle(table.begin(), table.end(), rng);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<uint16_t> q(size_t(batch * s.q_heads * s.head_dim));
  for (auto& x : q) x = s.type == ElementType::kBFloat16 ? float_to_bf16(n(rng)) : float_to_fp16(n(rng));
  const float gs = 1.0f;
  DecodeArgs a;
  a.q = q.data();
  a.q_type = s.type;
  a.q_heads = s.q_heads;
  a.batch = {.block_table = table.data(), .block_table_stride = entries, .seq_lens = lengths.data(), .batch = batch};
  a.softmax_scale = float(1.0 / std::sqrt(double(s.head_dim)));
  a.k_global_scale = a.v_global_scale = &gs;
  reference::HostCache cpu(v.layout(), 0);
  for (size_t b = 0; b < host.size(); ++b) cpu.storage[b] = host[b];
  const reference::DecodeResult want = reference::decode_attention(v, cpu.buffers, a);
  auto dq = DeviceBuffer<uint16_t>::from(q);
  auto dt = DeviceBuffer<int32_t>::from(table);
  auto dl = DeviceBuffer<int32_t>::from(lengths);
  auto dgs = DeviceBuffer<float>::from({gs});
  const FormatVectors vectors(v);
  DeviceBuffer<uint16_t> out(q.size());
  out.fill_bytes(0xFF);
  DecodePlan plan;
  require(plan_decode(v, batch, s.q_heads, entries, &plan));
  DeviceBuffer<uint8_t> ws(std::max<size_t>(plan.workspace_bytes, 256));
  DecodeArgs g = a;
  g.q = dq.get();
  g.batch.block_table = dt.get();
  g.batch.seq_lens = dl.get();
  g.k_global_scale = g.v_global_scale = dgs.get();
  vectors.give(g);
  g.out = out.get();
  g.workspace = ws.get();
  g.workspace_bytes = ws.size();
  require(decode_attention(v, cache.view(), g, nullptr));
  NVFP4KV_CUDA_CHECK(cudaDeviceSynchronize());
  const auto got = out.download();
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double x = s.type == ElementType::kBFloat16 ? bf16_to_float(got[i]) : fp16_to_float(got[i]);
    num += (x - want.out[i]) * (x - want.out[i]);
    den += want.out[i] * want.out[i];
  }
  return std::sqrt(num / den);
}

}  // namespace

void fill_random_device_bytes(void* p, size_t n, uint64_t seed) {
  fill_random<<<4096, 256>>>(static_cast<uint8_t*>(p), n, seed);
  NVFP4KV_CUDA_CHECK(cudaGetLastError());
}

double read_ceiling_tbs() {
  const size_t bytes = size_t(2) << 30;
  DeviceBuffer<uint8_t> src(bytes);
  DeviceBuffer<uint32_t> sink(1);
  fill_random<<<1024, 256>>>(src.get(), bytes, 11);
  NVFP4KV_CUDA_CHECK(cudaGetLastError());
  int sms = 0;
  NVFP4KV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const float ms = median_ms([&] { stream_read<<<sms * 8, 512>>>(reinterpret_cast<const uint4*>(src.get()), bytes / 16, sink.get()); }, 20);
  return double(bytes) / (ms * 1e-3) / 1e12;
}

ValidLayout bench_layout(const std::string& layout, const std::string& transform, int64_t pages,
                         int64_t tokens_per_page, int64_t kv_heads, int64_t head_dim) {
  const CacheFormat format = transform_format(transform, kv_heads, head_dim, 7);
  const LayerFormat one = format.layer(0);  // the elements (FP8 words) shape the layout
  const ValidLayout plain = validate(
      instantiate(load_spec(layout), {1, pages, tokens_per_page, kv_heads, head_dim, one.k.element, one.v.element}));
  return with_format(plain, format);
}

DecodeBenchResult bench_decode(const DecodeBenchShape& s) {
  DecodeBenchResult r;
  r.shape = s;
  r.checked_rel_l2 = check_small(s);
  if (!(r.checked_rel_l2 < decode_error_bound(s.type)))
    throw Error("decode output differs from the fp64 reference (rel L2 " + std::to_string(r.checked_rel_l2) + "); not timing it");
  // The pool: the batch's pages, copied often enough to pass 256 MB (the L2 is 60 MB).
  const int64_t entries = (s.context + s.tokens_per_page - 1) / s.tokens_per_page;
  const int64_t pages = s.batch * entries;
  const double page_bytes = double(s.tokens_per_page) * s.kv_heads * shape_layout(s, 1).layout().dims.row_bytes();
  const int64_t copies = std::max<int64_t>(1, std::min<int64_t>(16, int64_t(std::ceil(256e6 / (page_bytes * pages)))));
  const ValidLayout v = shape_layout(s, pages * copies);
  const Layout& l = v.layout();
  std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> buffers;
  CacheBuffers cb;
  for (const Buffer& b : l.buffers) {
    buffers.push_back(std::make_unique<DeviceBuffer<uint8_t>>(size_t(b.bytes)));
    fill_random<<<4096, 256>>>(buffers.back()->get(), size_t(b.bytes), 17 + cb.count);
    cb.ptr[cb.count++] = buffers.back()->get();
  }
  NVFP4KV_CUDA_CHECK(cudaGetLastError());
  std::mt19937_64 rng(5);
  std::vector<std::unique_ptr<DeviceBuffer<int32_t>>> tables;
  for (int64_t c = 0; c < copies; ++c) {
    std::vector<int32_t> t(static_cast<size_t>(pages));
    std::iota(t.begin(), t.end(), int32_t(c * pages));
    std::shuffle(t.begin(), t.end(), rng);
    tables.push_back(std::make_unique<DeviceBuffer<int32_t>>(DeviceBuffer<int32_t>::from(t)));
  }
  auto lengths = DeviceBuffer<int32_t>::from(std::vector<int32_t>(size_t(s.batch), int32_t(s.context)));
  std::vector<uint16_t> hq(size_t(s.batch * s.q_heads * s.head_dim));
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (auto& x : hq) x = s.type == ElementType::kBFloat16 ? float_to_bf16(n(rng)) : float_to_fp16(n(rng));
  auto q = DeviceBuffer<uint16_t>::from(hq);
  DeviceBuffer<uint16_t> out(hq.size());
  auto gs = DeviceBuffer<float>::from({0.01f, 0.01f});
  const FormatVectors vectors(v);
  DecodePlan plan;
  require(plan_decode(v, s.batch, s.q_heads, entries, &plan));
  DeviceBuffer<uint8_t> ws(std::max<size_t>(plan.workspace_bytes, 256));
  DecodeArgs a;
  a.q = q.get();
  a.q_type = s.type;
  a.q_heads = s.q_heads;
  a.batch = {.block_table = nullptr, .block_table_stride = entries, .seq_lens = lengths.get(), .batch = s.batch};
  a.softmax_scale = float(1.0 / std::sqrt(double(s.head_dim)));
  a.k_global_scale = gs.get();
  a.v_global_scale = gs.get() + 1;
  vectors.give(a);
  a.out = out.get();
  a.workspace = ws.get();
  a.workspace_bytes = ws.size();
  // One graph: one call per copy, each on its own pages.
  cudaStream_t stream;
  NVFP4KV_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  const int calls = int(std::max<int64_t>(copies, 4));
  NVFP4KV_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int c = 0; c < calls; ++c) {
    a.batch.block_table = tables[size_t(c % copies)]->get();
    require(decode_attention(v, cb, a, stream));
  }
  NVFP4KV_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  NVFP4KV_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  r.ms = median_ms([&] { NVFP4KV_CUDA_CHECK(cudaGraphLaunch(exec, stream)); }, 20, stream) / calls;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  r.cache_bytes = double(s.batch) * s.context * s.kv_heads * l.dims.row_bytes();
  r.tbs = r.cache_bytes / (r.ms * 1e-3) / 1e12;
  r.splits = plan.splits;
  r.dense = plan.dense_planes;
  r.tensor_rows = plan.tensor_rows;
  return r;
}

}  // namespace nvfp4kv::harness
