// Prefill / extend attention on the GPU against the fp64 reference on the same
// dequantized cache (reference::prefill_attention reads the cache bytes through
// the layout), and the mixed-batch call. Bounds: decode's (the output type's
// rounding plus P in FP16); measured on the H200 over the cases below, worst
// rel L2 1.77e-3 (bf16), 2.42e-4 (fp16), LSE 3.3e-5, each at least 30 % under
// (src/kernels/NOTES.md, Prefill). A dropped scale or a wrong layout gives
// errors above 0.1. Skipped, with a message, without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>

#include "nvfp4kv/api/kv_cache.hpp"
#include "nvfp4kv/api/prefill.hpp"
#include "nvfp4kv/core/attention.hpp"
#include "nvfp4kv/harness/decode_bench.hpp"
#include "nvfp4kv/harness/device_buffer.hpp"
#include "nvfp4kv/harness/workload.hpp"
#include "nvfp4kv/reference/attention.hpp"
#include "nvfp4kv/reference/cache.hpp"
#include "../../src/api/attention_runs.hpp"  // api::prepare_prefill, kernels::launch_prefill: a forced stage count
#include "attention_check.hpp"
#include "odd_layouts.hpp"

namespace nvfp4kv {
namespace {

using harness::DeviceBuffer;

using testing::cat;

class GpuPrefill : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_device_available(&why)) GTEST_SKIP() << "GPU test skipped: " << why;
  }
};

// The output type's own rounding dominates, as in decode (harness/decode_bench.hpp).
double rel_l2_bound(ElementType t) { return harness::decode_error_bound(t); }
constexpr double kLseBound = harness::kDecodeLseBound;

struct Case {
  std::string preset = "nvfp4kv-native";
  int64_t pages = 64, tokens_per_page = 16, kv_heads = 2, head_dim = 128, group = 4;
  std::vector<std::pair<int32_t, int32_t>> seqs = {{1, 37}, {50, 50}, {0, 10}, {70, 200}, {5, 130}};  // (q, kv)
  ElementType type = ElementType::kBFloat16;
  int64_t window = 0;
  float softcap = 0;
  bool sinks = false, lse = true, mixed = false;
  uint64_t seed = 1;
  // The layout's code order (where a data byte keeps its two codes): empty keeps the preset's
  // (the native layout's is fp16-split, every engine's standard), a name replaces it.
  std::string codes;
  std::optional<LayoutSpec> spec;  // a layout of one's own instead of the preset
  size_t* tickets_at_rest = nullptr;  // mixed: set to the workspace's 64-bit words holding a ticket at rest
  int stages = 0;  // prefill: run with this many stages in the ring (0: as many as the planner fits)
  // A cache format over the random stored values (the reference reads them back through it);
  // plain_reader: the GPU reads the same bytes without it, a reader that forgot it.
  std::optional<CacheFormat> format;
  bool plain_reader = false;
  // The layout's element formats (the native layout takes FP8 on either side).
  ElementFormat k_element = ElementFormat::kNvfp4, v_element = ElementFormat::kNvfp4;
  // E4M3 NaN in the FP8 elements and block scales of every slot no sequence reads.
  bool poison_unread = false;
};

struct Outcome : testing::Comparison {
  DeviceStatus gpu, cpu;
};

// Runs one case through the GPU (prefill_attention, or mixed_attention) and the
// reference. Each sequence gets its own shuffled pages; `mutate` may spoil the
// block table, the kv lengths or the q lengths (cu_seqlens_q) afterwards.
template <typename Mutate>
Outcome run_case(const Case& k, Mutate mutate) {
  Outcome o;
  LayoutSpec spec = k.spec ? *k.spec : preset_spec(k.preset);
  if (!k.codes.empty()) spec.codes = *code_order_named(k.codes);
  const ValidLayout plain = validate(
      instantiate(spec, {1, k.pages, k.tokens_per_page, k.kv_heads, k.head_dim, k.k_element, k.v_element}));
  const ValidLayout v = k.format ? with_format(plain, *k.format) : plain;
  const ValidLayout& reader = k.plain_reader ? plain : v;
  const CacheDims& d = v.layout().dims;
  auto host = harness::random_cache(v, 0, k.seed);
  const int64_t batch = int64_t(k.seqs.size());
  int64_t longest = 1;
  for (const auto& s : k.seqs) longest = std::max<int64_t>(longest, s.second);
  const int64_t stride = (longest + d.tokens_per_page - 1) / d.tokens_per_page;
  std::mt19937_64 rng(k.seed + 7);
  std::vector<int32_t> table(size_t(batch * stride)), kv_lens, cu_q = {0};
  // Poisoned cases give each sequence pages of its own, so that the slots past a sequence's end
  // are read by no other sequence and hold NaN where the kernels meet them.
  std::vector<int32_t> own(k.poison_unread ? size_t(d.pages) : 0);
  std::iota(own.begin(), own.end(), 0);
  std::shuffle(own.begin(), own.end(), rng);
  if (k.poison_unread) {
    EXPECT_GE(d.pages, batch * stride) << "a poisoned case needs a page per table entry";
  }
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int32_t> pages(size_t(d.pages));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    for (int64_t e = 0; e < stride; ++e)
      table[size_t(b * stride + e)] = k.poison_unread ? own[size_t(b * stride + e) % own.size()] : pages[size_t(e % d.pages)];
    kv_lens.push_back(k.seqs[size_t(b)].second);
    cu_q.push_back(cu_q.back() + k.seqs[size_t(b)].first);
  }
  std::vector<int32_t> q_lens;
  for (const auto& s : k.seqs) q_lens.push_back(s.first);
  const int32_t max_q = *std::max_element(q_lens.begin(), q_lens.end());
  mutate(table, kv_lens, cu_q);
  if (k.poison_unread) {
    // Pages of their own: every slot but the ones the sequences read, tails included.
    int64_t read = 0;
    for (int32_t len : kv_lens) read += std::clamp<int64_t>(len, 0, stride * d.tokens_per_page);
    EXPECT_EQ(harness::poison_unread_slots(v, 0, table, stride, kv_lens, host), d.pages * d.tokens_per_page - read);
  }
  const int64_t rows = cu_q.back(), q_heads = k.kv_heads * k.group;
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<uint16_t> q(size_t(std::max<int64_t>(rows, 1) * q_heads * d.head_dim));
  for (auto& x : q) x = k.type == ElementType::kBFloat16 ? float_to_bf16(n(rng)) : float_to_fp16(n(rng));
  std::vector<float> sinks(static_cast<size_t>(q_heads));
  for (auto& s : sinks) s = n(rng) * 2.0f;
  const float gs[2] = {0.37f, 1.9f};

  PrefillArgs a;
  a.q = q.data();
  a.q_type = k.type;
  a.q_heads = q_heads;
  a.cu_seqlens_q = cu_q.data();
  a.max_q_len = max_q;
  a.batch = {.block_table = table.data(), .block_table_stride = stride, .seq_lens = kv_lens.data(), .batch = batch};
  a.softmax_scale = float(1.0 / std::sqrt(double(d.head_dim)));
  a.k_global_scale = &gs[0];
  a.v_global_scale = &gs[1];
  a.window = k.window;
  a.softcap = k.softcap;
  a.sinks = k.sinks ? sinks.data() : nullptr;
  a.status = &o.cpu;
  reference::HostCache cpu(v.layout(), 0);
  for (size_t b = 0; b < host.size(); ++b) cpu.storage[b] = host[b];
  const reference::PrefillResult want = reference::prefill_attention(v, cpu.buffers, a);

  harness::DeviceCache cache(v.layout(), 0);
  cache.upload(host);
  auto dq = DeviceBuffer<uint16_t>::from(q);
  auto dtable = DeviceBuffer<int32_t>::from(table);
  auto dlen = DeviceBuffer<int32_t>::from(kv_lens);
  auto dcu = DeviceBuffer<int32_t>::from(cu_q);
  auto dscales = DeviceBuffer<float>::from({gs[0], gs[1]});
  auto dsinks = DeviceBuffer<float>::from(sinks);
  auto dstatus = DeviceBuffer<DeviceStatus>::from({DeviceStatus{}});
  const harness::FormatVectors vectors(reader);
  DeviceBuffer<uint16_t> out(q.size());
  DeviceBuffer<float> lse(size_t(std::max<int64_t>(rows, 1) * q_heads));
  out.fill_bytes(0xFF);
  lse.fill_bytes(0xFF);
  PrefillArgs g = a;
  g.q = dq.get();
  g.cu_seqlens_q = dcu.get();
  g.batch.block_table = dtable.get();
  g.batch.seq_lens = dlen.get();
  g.k_global_scale = dscales.get();
  g.v_global_scale = dscales.get() + 1;
  g.sinks = k.sinks ? dsinks.get() : nullptr;
  g.out = out.get();
  g.lse = k.lse ? lse.get() : nullptr;
  g.status = dstatus.get();
  vectors.give(g);
  if (k.mixed) {
    size_t bytes = 0;
    const Result wr = mixed_workspace_bytes(v, q_lens.data(), batch, q_heads, stride, &bytes);
    EXPECT_TRUE(wr.ok()) << wr.message;
    DeviceBuffer<uint8_t> ws(std::max<size_t>(bytes, 256));
    const Result r = mixed_attention(reader, cache.view(), {.args = g, .q_lens = q_lens.data(), .workspace = ws.get(),
                                                       .workspace_bytes = ws.size()}, nullptr);
    EXPECT_TRUE(r.ok()) << r.message;
    NVFP4KV_CUDA_CHECK(cudaDeviceSynchronize());
    if (k.tickets_at_rest) {
      const std::vector<uint8_t> bytes_back = ws.download();
      *k.tickets_at_rest = 0;
      for (size_t i = 0; i + 8 <= bytes_back.size(); i += 8) {
        unsigned long long word = 0;
        std::memcpy(&word, bytes_back.data() + i, 8);
        *k.tickets_at_rest += word == kSplitTicketAtRest;
      }
    }
  } else if (k.stages) {
    // Fewer stages than this GPU fits, as a GPU with less shared memory per block plans
    // them (down to one: the producers wait for every tile's release before the next).
    kernels::PrefillParams p{.layout = v.view(), .cache = cache.view(), .args = g, .geometry = {}};
    const Result r = api::prepare_prefill(v, cache.view(), g, &p);
    EXPECT_TRUE(r.ok()) << r.message;
    EXPECT_GE(p.geometry.stages, k.stages);
    p.geometry.stages = k.stages;
    p.geometry.smem_bytes = int(prefill_smem_bytes(p.geometry.head_dim, p.geometry.kv_tile, k.stages));
    NVFP4KV_CUDA_CHECK(kernels::launch_prefill(p, nullptr));
    NVFP4KV_CUDA_CHECK(cudaDeviceSynchronize());
  } else {
    const Result r = prefill_attention(reader, cache.view(), g, nullptr);
    EXPECT_TRUE(r.ok()) << r.message;
    NVFP4KV_CUDA_CHECK(cudaDeviceSynchronize());
  }
  const auto got = out.download();
  const auto got_lse = lse.download();
  static_cast<testing::Comparison&>(o) =
      testing::compare_attention(got, want.out, size_t(rows * q_heads * d.head_dim), d.head_dim, k.type,
                                 k.lse ? &got_lse : nullptr, want.lse, size_t(rows * q_heads));
  o.gpu = dstatus.download()[0];
  return o;
}

Outcome run_case(const Case& k) {
  return run_case(k, [](std::vector<int32_t>&, std::vector<int32_t>&, std::vector<int32_t>&) {});
}

void expect_close(const Case& k, const Outcome& o, const std::string& what) {
  std::printf("  %-46s rel L2 %.2e  max |err| %.2e  lse %.2e\n", what.c_str(), o.rel_l2, o.max_abs, o.lse_max_abs);
  EXPECT_LT(o.rel_l2, rel_l2_bound(k.type)) << what;
  // A rotated query, or one scaled by lambda, is rounded to FP16 where a BF16 one is exact.
  const bool rotated_query = k.format && ((!k.format->layers.empty() && k.format->layers[0].k.rotation != kNoRotation) ||
                                          k.format->has_k_channel_scale());
  EXPECT_LT(o.lse_max_abs, rotated_query ? harness::kRotatedQueryLseBound : kLseBound) << what;
  EXPECT_EQ(o.unwritten, 0) << what;
  EXPECT_EQ(o.nan_mismatch, 0) << what;
  EXPECT_EQ(o.cpu.bad_pages + o.cpu.bad_lengths + o.cpu.bad_global_scale, 0u) << what;
  EXPECT_EQ(o.gpu.bad_pages + o.gpu.bad_lengths + o.gpu.bad_global_scale, 0u) << what;
}

// GQA groups (3 leaves a row of the 64 unused), head dims, page sizes; the batch
// holds q length 1, q = kv (pure prefill), an empty sequence and extends.
TEST_F(GpuPrefill, EveryGroupHeadDimAndPageSizeMatchesTheReference) {
  int ran = 0;
  for (int64_t group : {1, 2, 3, 4, 8, 16})
    for (int64_t dim : {64, 128, 256})
      for (int64_t n : {16, 64}) {
        Case k;
        k.group = group;
        k.head_dim = dim;
        k.tokens_per_page = n;
        k.pages = std::max<int64_t>(8, 512 / n);
        k.type = ran % 2 ? ElementType::kFloat16 : ElementType::kBFloat16;
        k.seed = uint64_t(ran) + 1;
        const Outcome o = run_case(k);
        expect_close(k, o, cat("G", group, " D", dim, " N", n, k.type == ElementType::kBFloat16 ? " bf16" : " fp16"));
        if (HasFailure()) return;
        ++ran;
      }
  EXPECT_EQ(ran, 36);
}

// Head dims without their own instance run zero-padded; pages of 1 to 256 tokens.
TEST_F(GpuPrefill, PaddedHeadDimsAndOddPageSizes) {
  for (int64_t dim : {16, 48, 96, 160, 192}) {
    Case k;
    k.head_dim = dim;
    k.seed = uint64_t(dim) + 100;
    expect_close(k, run_case(k), cat("D", dim));
  }
  for (int64_t n : {1, 3, 24, 128, 256}) {
    Case k;
    k.tokens_per_page = n;
    k.pages = 256 / n + 8;
    k.seed = uint64_t(n) + 200;
    expect_close(k, run_case(k), cat("N", n));
  }
}

TEST_F(GpuPrefill, OptionsMatchTheReference) {
  for (int variant = 0; variant < 8; ++variant) {
    Case k;
    k.seqs = {{130, 300}, {17, 17}, {0, 0}, {1, 129}, {64, 100}};
    k.pages = 100;
    k.window = (variant & 1) ? 50 : 0;
    k.softcap = (variant & 2) ? 1.5f : 0;  // small: the cap bites
    k.sinks = (variant & 4) != 0;
    k.type = variant % 3 ? ElementType::kBFloat16 : ElementType::kFloat16;
    k.seed = uint64_t(variant) + 40;
    expect_close(k, run_case(k), cat("window ", k.window, ", softcap ", k.softcap, k.sinks ? ", sinks" : ""));
  }
}

TEST_F(GpuPrefill, EverySoundPresetMatchesTheReference) {
  int ran = 0;
  for (const PresetInfo& p : list_presets()) {
    const Layout l = instantiate(preset_spec(p.name), {1, 64, 16, 2, 128});
    if (!check(l).report.ok) continue;
    Case k;
    k.preset = p.name;
    k.seed = uint64_t(ran) + 90;
    expect_close(k, run_case(k), p.name);
    ++ran;
  }
  EXPECT_GE(ran, 11);
}

// Sequences of many kv tiles (up to 19 of 64 tokens) take the producers' ring round after
// round: on both fast loops (the native layout's fp16-split order, version 1's standard one)
// and the general one (high-first codes moved back word by word; the 4-token scale
// interleave of a nested token mode), at D 64, 128 and 256, with the ring the H200 fits and
// with one and two stages (what a GPU with less shared memory per block plans).
TEST_F(GpuPrefill, LongSequencesCycleTheStageRingOnEveryProducerPath) {
  struct Path {
    const char* preset;
    const char* codes;  // "" keeps the preset's order
  };
  for (const Path& path : {Path{"nvfp4kv-native", ""}, Path{"nvfp4kv-native-v1", ""}, Path{"nvfp4kv-native", "high-first"},
                           Path{"flashinfer-trtllm-gen-nhd", ""}})
    for (int64_t dim : {64, 128, 256})
      for (int stages : {0, 1, 2}) {
        Case k;
        k.preset = path.preset;
        k.codes = path.codes;
        k.head_dim = dim;
        k.kv_heads = 1;
        k.group = 2;
        k.pages = 80;
        k.stages = stages;
        k.seqs = {{300, 1200}, {64, 700}, {2, 1100}};  // (q, kv)
        k.seed = uint64_t(dim + stages) + 300;
        expect_close(k, run_case(k), cat(path.preset, " ", *path.codes ? path.codes : "(its order)", " D", dim, " stages ", stages));
      }
}

// A layout whose data bytes keep their codes in another order: the prefill kernel moves
// each word's bits back before placing them, and matches the reference (which reads the
// order from the same layout); at D 64 and 128, native and strided rows.
TEST_F(GpuPrefill, CodeOrdersOtherThanTheStandardOneMatchTheReference) {
  for (const char* codes : {"high-first", "fp16-split"})
    for (const char* preset : {"nvfp4kv-native", "flashinfer-nhd"})
      for (int64_t dim : {64, 128}) {
        Case k;
        k.codes = codes;
        k.preset = preset;
        k.head_dim = dim;
        k.seqs = {{37, 37}, {50, 120}, {0, 10}, {5, 130}};  // (q, kv): no q length 1 (prefill runs them all)
        k.seed = uint64_t(dim) + 7;
        expect_close(k, run_case(k), cat(codes, " ", preset, " D", dim));
      }
  // Decode reads fp16-split too: a mixed batch of every route over it.
  for (const char* preset : {"nvfp4kv-native", "flashinfer-nhd"}) {
    Case k;
    k.mixed = true;
    k.codes = "fp16-split";
    k.preset = preset;
    k.seqs = {{1, 37}, {4, 300}, {40, 120}, {2, 2}, {1, 900}};
    k.pages = 128;
    expect_close(k, run_case(k), cat("fp16-split mixed ", preset));
  }
}

// The mixed-batch call: q length 1 runs through decode, the rest through prefill.
TEST_F(GpuPrefill, MixedBatchesRouteEachRunAndMatchTheReference) {
  Case k;
  k.mixed = true;
  k.seqs = {{1, 37}, {1, 300}, {5, 200}, {0, 4}, {1, 1}, {80, 80}, {1, 129}, {3, 700}};
  k.pages = 128;
  k.sinks = true;
  expect_close(k, run_case(k), "mixed, sinks");
  k.window = 40;
  k.softcap = 2.0f;
  k.type = ElementType::kFloat16;
  expect_close(k, run_case(k), "mixed, window, softcap, fp16");
}

// The batch the format and FP8 tests run: four prefill sequences (a pure prefill among them),
// or a mixed batch whose q lengths take every route (decode, short-query, prefill).
Case format_case(int64_t head_dim, float softcap, bool sinks, bool mixed, uint64_t seed) {
  Case k;
  k.head_dim = head_dim;
  k.seqs = mixed ? std::vector<std::pair<int32_t, int32_t>>{{1, 37}, {5, 200}, {80, 80}, {1, 300}, {3, 129}}
                 : std::vector<std::pair<int32_t, int32_t>>{{130, 300}, {17, 17}, {1, 129}, {64, 100}};
  k.pages = 100;
  k.softcap = softcap;
  k.sinks = sinks;
  k.mixed = mixed;
  k.seed = seed;
  return k;
}

// A format's transforms in prefill and in a mixed batch's routes (decode, short-query, prefill):
// each query row scaled by K's lambda and rotated as K was, q . mu joining each logit under a soft-cap and
// shifting the row otherwise, V's rotation undone on O in registers. Against the reference
// reading the random stored values back through the format; the same bytes read without the
// format are off by more than the bound (the output for a rotation, the LSE for mu alone).
TEST_F(GpuPrefill, FormatTransformsMatchTheReference) {
  struct Variant {
    int64_t head_dim, k_rotation, v_rotation;
    bool mean;
    float softcap;
    bool sinks, mixed;
    bool channel_scale = false;  // lambda: each query row scaled before its rotation
  };
  const std::vector<Variant> variants = {
      {128, kRotateWholeHead, kRotateWholeHead, true, 0, false, false},
      {128, kRotateWholeHead, kNoRotation, true, 0, false, false, true},
      {64, kNoRotation, kNoRotation, false, 1.5f, true, false, true},  // lambda alone
      {256, 64, kRotateWholeHead, false, 0, false, false, true},
      {128, 32, kNoRotation, true, 0, true, true, true},  // lambda on every route of a mixed batch
      {128, 32, 16, true, 1.5f, true, false},
      {64, kNoRotation, kRotateWholeHead, true, 0, true, false},
      {256, kRotateWholeHead, 64, false, 2.0f, false, false},  // the mma.sync consumers
      {96, kRotateWholeHead, kRotateWholeHead, true, 0, false, false},  // padded D, blocks of 32
      {128, kNoRotation, kNoRotation, true, 0, false, false},  // mu alone: the LSE carries it
      {128, kRotateWholeHead, 32, true, 1.5f, true, true},  // every route of a mixed batch
  };
  int seed = 700;
  for (const Variant& var : variants) {
    Case k = format_case(var.head_dim, var.softcap, var.sinks, var.mixed, uint64_t(++seed));
    k.format = harness::random_format(k.kv_heads, var.head_dim, var.k_rotation, var.v_rotation, var.mean,
                                      uint64_t(seed), var.channel_scale);
    const std::string what = cat("D", var.head_dim, " K rot ", var.k_rotation, " V rot ", var.v_rotation,
                                 var.mean ? " mu" : "", var.channel_scale ? " lambda" : "",
                                 var.softcap > 0 ? " softcap" : "", var.sinks ? " sinks" : "", var.mixed ? " mixed" : "");
    expect_close(k, run_case(k), what);
    k.plain_reader = true;
    const Outcome wrong = run_case(k);
    std::printf("  %-46s read as plain: rel L2 %.2e  lse %.2e\n", what.c_str(), wrong.rel_l2, wrong.lse_max_abs);
    EXPECT_TRUE(wrong.rel_l2 > 0.1 || wrong.lse_max_abs > 1.0) << what << ": a reader without the format passed";
  }
}

// FP8 E4M3 sides (the layout's elements): prefill's producers write an FP8 group as FP16
// e4m3 * 2^-14 (the same power of two NVFP4's placement leaves), so the consumers and the
// epilogue are NVFP4's; every side combination, D 64 / 128 (wgmma) and 256 (mma.sync), a
// padded D, options, the format's steps, the standard code order beside FP8 (the general
// producer loop decodes any order), and a mixed batch (its decode and short-query routes
// read FP8 through decode's dequantize parts).
TEST_F(GpuPrefill, Fp8SidesMatchTheReference) {
  constexpr ElementFormat F = ElementFormat::kFp8E4M3, N = ElementFormat::kNvfp4;
  struct Variant {
    ElementFormat k, v;
    int64_t head_dim, group;
    float softcap;
    bool sinks, mixed;
    int64_t k_rotation, v_rotation;
    bool mean;
    const char* codes;
    bool poison = false;  // E4M3 NaN in every slot no sequence reads
  };
  const std::vector<Variant> variants = {
      {F, N, 128, 4, 0, false, false, kNoRotation, kNoRotation, false, ""},
      {N, F, 128, 4, 0, false, false, kNoRotation, kNoRotation, false, ""},
      {F, F, 128, 8, 1.5f, true, false, kNoRotation, kNoRotation, false, ""},
      {F, N, 64, 4, 0, true, false, kRotateWholeHead, kNoRotation, true, ""},
      {N, F, 256, 2, 0, false, false, kNoRotation, kRotateWholeHead, false, ""},  // the mma.sync consumers
      {F, F, 96, 4, 0, false, false, kNoRotation, kNoRotation, false, ""},         // padded D
      {F, N, 128, 4, 0, false, false, kNoRotation, kNoRotation, false, "standard"},
      {F, N, 128, 4, 1.5f, true, true, kRotateWholeHead, 32, true, ""},  // every route of a mixed batch
      {N, F, 64, 16, 0, false, true, kNoRotation, kNoRotation, false, ""},
      // NaN codes past each sequence's end and in unread pages (a reader keeps them out of its
      // sums), FP8 and plain NVFP4 (NaN block scales), one of them a mixed batch.
      {F, F, 128, 4, 0, false, false, kNoRotation, kNoRotation, false, "", true},
      {N, N, 64, 4, 1.5f, true, false, kNoRotation, kNoRotation, false, "", true},
      {F, N, 128, 4, 0, true, true, kNoRotation, kNoRotation, false, "", true},  // every route
  };
  int seed = 1500;
  for (const Variant& var : variants) {
    Case k = format_case(var.head_dim, var.softcap, var.sinks, var.mixed, uint64_t(++seed));
    k.k_element = var.k, k.v_element = var.v;
    k.group = var.group;
    k.codes = var.codes;
    k.poison_unread = var.poison;
    k.format = harness::random_format_over(var.k, var.v, k.kv_heads, var.head_dim, var.k_rotation, var.v_rotation,
                                           var.mean, uint64_t(seed), var.mean);  // mu with lambda beside FP8
    const std::string what =
        cat("K ", element_format_name(var.k), " V ", element_format_name(var.v), " D", var.head_dim, " G", var.group,
            var.softcap > 0 ? " softcap" : "", var.sinks ? " sinks" : "", var.mixed ? " mixed" : "",
            var.k_rotation || var.v_rotation ? " rotated" : "", var.mean ? " mu lambda" : "", *var.codes ? " standard order" : "",
            var.poison ? " NaN past the ends" : "");
    expect_close(k, run_case(k), what);
    if (HasFailure()) return;
  }
  // FP8 K rows aligned to 8 bytes only (a layout of one's own): the producers gather each
  // FP8 group byte by byte; at D 64 and 128, NaN past the ends.
  for (int64_t dim : {64, 128}) {
    Case k = format_case(dim, 0, false, false, uint64_t(++seed));
    k.spec = test_layouts::fp8_k_rows_8_aligned();
    k.k_element = F;
    k.poison_unread = true;
    expect_close(k, run_case(k), cat("K fp8 in 8-byte aligned rows, D", dim));
  }
}

// A mixed call gives each split run its own region of the workspace: after a decode run and a
// short-query run that both split, every ticket of both is at rest (tagged, none finished), so
// the next call takes one atomic per split. With one region for both, the short-query run's
// partials covered the decode run's tickets (the next call paid the compare-and-swap path).
TEST_F(GpuPrefill, MixedRunsKeepTheirTicketsApart) {
  Case k;
  k.mixed = true;
  k.pages = 256;
  k.seqs = {{1, 3000}, {1, 2900}, {1, 3100}, {4, 3000}, {4, 2950}, {4, 3050}};  // a decode run, then a short-query run
  size_t at_rest = 0;
  k.tickets_at_rest = &at_rest;
  expect_close(k, run_case(k), "mixed decode + short-query runs, both split");
  EXPECT_EQ(at_rest, size_t(6 * k.kv_heads)) << "one ticket per (sequence, kv head) of each split run";
}

// The short-query route: in a mixed batch, q lengths 2 .. 16 / group run through the
// decode kernel with (token, head) rows, each token causal on its own. Every group
// and head dim, ragged q and kv lengths (q = kv, kv below a page, long ones split
// over blocks and merged), page sizes, every option, beside decode and prefill runs.
TEST_F(GpuPrefill, ShortQueriesMatchTheReferenceForEveryGroupHeadDimAndOption) {
  int ran = 0;
  for (int64_t group : {1, 2, 3, 4, 8})
    for (int64_t dim : {64, 128, 256}) {
      Case k;
      k.mixed = true;
      k.group = group;
      k.head_dim = dim;
      const int32_t most = int32_t(16 / group);
      k.seqs = {{most, 700}, {2, 2}, {most, 40}, {2, 9}, {std::min<int32_t>(3, most), 2900}};
      k.pages = 256;
      k.type = ran % 2 ? ElementType::kFloat16 : ElementType::kBFloat16;
      k.seed = uint64_t(ran) + 300;
      expect_close(k, run_case(k), cat("short G", group, " D", dim, k.type == ElementType::kBFloat16 ? " bf16" : " fp16"));
      if (HasFailure()) return;
      ++ran;
    }
  for (int64_t n : {1, 3, 32, 128}) {
    Case k;
    k.mixed = true;
    k.tokens_per_page = n;
    k.pages = 2048 / n + 8;
    k.seqs = {{4, 300}, {3, 3}, {2, 1000}, {4, 31}};
    k.seed = uint64_t(n) + 320;
    expect_close(k, run_case(k), cat("short N", n));
  }
  for (int variant = 0; variant < 8; ++variant) {
    Case k;
    k.mixed = true;
    k.seqs = {{4, 300}, {1, 129}, {3, 3}, {0, 5}, {2, 1000}, {40, 200}, {4, 61}, {2, 2}};
    k.pages = 200;
    k.window = (variant & 1) ? 50 : 0;
    k.softcap = (variant & 2) ? 1.5f : 0;
    k.sinks = (variant & 4) != 0;
    k.lse = variant != 3;
    k.type = variant % 3 ? ElementType::kBFloat16 : ElementType::kFloat16;
    k.seed = uint64_t(variant) + 340;
    expect_close(k, run_case(k), cat("short, window ", k.window, ", softcap ", k.softcap, k.sinks ? ", sinks" : ""));
  }
  // Splits where some rows see nothing: with 256-token stages the last split of a 2049-token
  // sequence holds token 2048 alone, which only the last query sees.
  {
    Case k;
    k.mixed = true;
    k.pages = 160;
    k.seqs = {{4, 2049}, {4, 2050}, {4, 2051}, {3, 4097}};
    expect_close(k, run_case(k), "short, splits some rows do not reach");
    k.window = 3;
    expect_close(k, run_case(k), "short, splits some rows do not reach, window 3");
  }
  // A window shorter than the q length: the last query sees tokens the first one does not.
  Case k;
  k.mixed = true;
  k.window = 2;
  k.seqs = {{4, 4}, {4, 90}, {3, 17}};
  expect_close(k, run_case(k), "short, window 2");
}

// The route is the short-query one: it needs a split workspace at long contexts
// (prefill has none), which grows with the rows; a q length whose rows do not fit
// goes to prefill.
TEST_F(GpuPrefill, ShortQueriesPlanTheirOwnSplitWorkspace) {
  const ValidLayout v = validate(instantiate(preset_spec("nvfp4kv-native"), {1, 4096, 16, 8, 128}));
  const auto bytes = [&](std::vector<int32_t> q_lens) {
    size_t b = 0;
    const Result r = mixed_workspace_bytes(v, q_lens.data(), int64_t(q_lens.size()), 32, 2048, &b);
    EXPECT_TRUE(r.ok()) << r.message;
    return b;
  };
  // Not more than decode's: the 16-row instance runs one block per SM where decode's 8-row one
  // runs two, so the planner halves the splits (run 45: 528512 bytes for both).
  const size_t two = bytes({2, 2}), four = bytes({4, 3});
  EXPECT_GT(two, 0u);
  EXPECT_GT(four, two);  // twice the rows, the same splits
  EXPECT_EQ(bytes({5, 5}), 0u);  // 5 x 4 rows: prefill
  EXPECT_EQ(bytes({4, 5}), bytes({4}));  // a short run of one sequence, then prefill
}

// A uniform short-query batch (what engines capture for speculative decoding) in a
// CUDA graph: replays follow changing block tables and kv lengths, split merges
// included (their tickets reset themselves), the workspace never cleared.
TEST_F(GpuPrefill, ShortQueryGraphReplaysFollowChangingLengthsAndTables) {
  const ValidLayout v = validate(instantiate(preset_spec("nvfp4kv-native"), {1, 300, 16, 2, 128}));
  const CacheDims& d = v.layout().dims;
  const auto host = harness::random_cache(v, 0, 15);
  harness::DeviceCache cache(v.layout(), 0);
  cache.upload(host);
  reference::HostCache cpu(v.layout(), 0);
  for (size_t b = 0; b < host.size(); ++b) cpu.storage[b] = host[b];
  const int64_t batch = 3, stride = 100, q_heads = 8, q_len = 4;  // 4 tokens x group 4: 16 rows
  std::mt19937_64 rng(18);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<uint16_t> q(size_t(batch * q_len * q_heads * 128));
  for (auto& x : q) x = float_to_bf16(n(rng));
  const float gs[2] = {1.0f, 1.0f};
  const std::vector<int32_t> q_lens(static_cast<size_t>(batch), int32_t(q_len)), cu = {0, 4, 8, 12};
  size_t bytes = 0;
  ASSERT_TRUE(mixed_workspace_bytes(v, q_lens.data(), batch, q_heads, stride, &bytes).ok());
  ASSERT_GT(bytes, 0u);  // split: the replays run the merge
  auto dq = DeviceBuffer<uint16_t>::from(q);
  auto dcu = DeviceBuffer<int32_t>::from(cu);
  DeviceBuffer<int32_t> dtable(static_cast<size_t>(batch * stride)), dlen(static_cast<size_t>(batch));
  auto dscales = DeviceBuffer<float>::from({gs[0], gs[1]});
  DeviceBuffer<uint16_t> out(q.size());
  DeviceBuffer<uint8_t> ws(std::max<size_t>(bytes, 256));
  ws.fill_bytes(0x5A);
  PrefillArgs g;
  g.q = dq.get();
  g.q_heads = q_heads;
  g.cu_seqlens_q = dcu.get();
  g.max_q_len = q_len;
  g.batch = {.block_table = dtable.get(), .block_table_stride = stride, .seq_lens = dlen.get(), .batch = batch};
  g.softmax_scale = 0.088f;
  g.k_global_scale = dscales.get();
  g.v_global_scale = dscales.get() + 1;
  g.out = out.get();
  const MixedBatch m{.args = g, .q_lens = q_lens.data(), .workspace = ws.get(), .workspace_bytes = ws.size()};
  const testing::CapturedGraph graph([&](cudaStream_t s) { return mixed_attention(v, cache.view(), m, s); });
  ASSERT_TRUE(graph.captured().ok()) << graph.captured().message;
  for (int replay = 0; replay < 4; ++replay) {
    std::vector<int32_t> table(static_cast<size_t>(batch * stride)), lengths(static_cast<size_t>(batch));
    for (auto& t : table) t = int32_t(rng() % uint64_t(d.pages));
    for (auto& len : lengths) len = int32_t(q_len + rng() % uint64_t(stride * d.tokens_per_page - q_len));
    dtable.upload(table);
    dlen.upload(lengths);
    out.fill_bytes(0xFF);
    graph.replay();
    PrefillArgs a = g;
    a.q = q.data();
    a.cu_seqlens_q = cu.data();
    a.batch.block_table = table.data();
    a.batch.seq_lens = lengths.data();
    a.k_global_scale = &gs[0];
    a.v_global_scale = &gs[1];
    const reference::PrefillResult want = reference::prefill_attention(v, cpu.buffers, a);
    const auto got = out.download();
    const testing::Comparison c =
        testing::compare_attention(got, want.out, got.size(), d.head_dim, ElementType::kBFloat16, nullptr, want.lse, 0);
    std::printf("  replay %d: lengths %d %d %d, rel L2 %.2e\n", replay, lengths[0], lengths[1], lengths[2], c.rel_l2);
    EXPECT_LT(c.rel_l2, rel_l2_bound(ElementType::kBFloat16)) << "replay " << replay;
    EXPECT_EQ(c.unwritten, 0) << "replay " << replay;
  }
}

// Bad entries, counted and marked as the reference does: sequence 1's last page does not
// exist, sequence 2 is longer than its table, sequence 3 has more new tokens than tokens
// (the caller's q and kv lengths),
// and sequence 4's bad first page lies before its window (never read); each holds 64
// tokens in its table of 4 pages. Sequences 0 and 4 stay right.
void expect_bad_entries_marked(Case k, const char* what) {
  k.window = 20;
  const Outcome o = run_case(k, [](std::vector<int32_t>& table, std::vector<int32_t>& kv, std::vector<int32_t>&) {
    table[size_t(1 * 4 + 3)] = 100000;
    kv[2] = 4 * 16 + 9;
    table[size_t(4 * 4 + 0)] = -5;
  });
  EXPECT_EQ(o.nan_mismatch, 0) << what;
  EXPECT_EQ(o.gpu.bad_pages, 16u) << what;
  EXPECT_EQ(o.gpu.bad_lengths, 2u) << what;
  EXPECT_EQ(o.cpu.bad_pages, o.gpu.bad_pages) << what;
  EXPECT_EQ(o.cpu.bad_lengths, o.gpu.bad_lengths) << what;
  // Sequences 1, 2 and 3 marked, every head.
  EXPECT_EQ(o.nan_rows, int64_t(k.seqs[1].first + k.seqs[2].first + k.seqs[3].first) * 8) << what;
  EXPECT_LT(o.rel_l2, rel_l2_bound(k.type)) << what;
  EXPECT_EQ(o.unwritten, 0) << what;
}

TEST_F(GpuPrefill, BadEntriesAreCountedNeverReadAndMarkTheirSequence) {
  Case k;
  k.seqs = {{10, 64}, {10, 64}, {10, 64}, {70, 64}, {4, 64}};
  expect_bad_entries_marked(k, "prefill");
}

// The same on the short-query route (q lengths 2-4 at group 4, in a mixed call).
TEST_F(GpuPrefill, ShortQueryBadEntriesAreCountedNeverReadAndMarkTheirSequence) {
  Case k;
  k.mixed = true;
  k.seqs = {{3, 64}, {3, 64}, {3, 64}, {4, 2}, {2, 64}};
  expect_bad_entries_marked(k, "short-query route");
}

// A 4096-token prompt in one call, in chunks of 17, 256 and 1000 tokens (each
// chunk stored before it is attended: its kv length is where it ends), and as a
// 3000-token cached prefix plus 1096 new ones: every row within the bound of the
// one-call result and of the reference.
TEST_F(GpuPrefill, ChunkingAPromptChangesNothingBeyondRounding) {
  const int64_t total = 4096, n = 16, q_heads = 2;
  const ValidLayout v = validate(instantiate(preset_spec("nvfp4kv-native"), {1, total / n + 4, n, 1, 64}));
  const auto host = harness::random_cache(v, 0, 77);
  harness::DeviceCache cache(v.layout(), 0);
  cache.upload(host);
  std::mt19937_64 rng(78);
  std::vector<int32_t> table(size_t(total / n));
  std::iota(table.begin(), table.end(), 2);
  std::shuffle(table.begin(), table.end(), rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> q(size_t(total * q_heads * 64));
  for (auto& x : q) x = float_to_bf16(nd(rng));
  const float gs[2] = {0.5f, 1.5f};
  auto dq = DeviceBuffer<uint16_t>::from(q);
  auto dtable = DeviceBuffer<int32_t>::from(table);
  auto dscales = DeviceBuffer<float>::from({gs[0], gs[1]});
  DeviceBuffer<int32_t> dcu(2), dlen(1);
  PrefillArgs a;
  a.q = dq.get();
  a.q_heads = q_heads;
  a.cu_seqlens_q = dcu.get();
  a.batch = {.block_table = dtable.get(), .block_table_stride = total / n, .seq_lens = dlen.get(), .batch = 1};
  a.softmax_scale = 0.125f;
  a.k_global_scale = dscales.get();
  a.v_global_scale = dscales.get() + 1;
  const auto run = [&](const std::vector<int32_t>& ends) {
    DeviceBuffer<uint16_t> out(q.size());
    out.fill_bytes(0xFF);
    PrefillArgs c = a;
    c.out = out.get();
    for (size_t i = 0; i < ends.size(); ++i) {
      const int32_t start = i ? ends[i - 1] : 0;
      dcu.upload({start, ends[i]});  // absolute rows: the chunk's queries and outputs in place
      dlen.upload({ends[i]});
      c.max_q_len = ends[i] - start;
      const Result r = prefill_attention(v, cache.view(), c, nullptr);
      EXPECT_TRUE(r.ok()) << r.message;
      NVFP4KV_CUDA_CHECK(cudaDeviceSynchronize());  // the next chunk's offsets overwrite these
    }
    return out.download();
  };
  const auto one = run({int32_t(total)});
  // The reference on the same cache, for the one-call result.
  reference::HostCache cpu(v.layout(), 0);
  for (size_t b = 0; b < host.size(); ++b) cpu.storage[b] = host[b];
  const int32_t cu_host[2] = {0, int32_t(total)}, len_host[1] = {int32_t(total)};
  PrefillArgs h = a;
  h.q = q.data();
  h.cu_seqlens_q = cu_host;
  h.max_q_len = total;
  h.batch.block_table = table.data();
  h.batch.seq_lens = len_host;
  h.k_global_scale = &gs[0];
  h.v_global_scale = &gs[1];
  const reference::PrefillResult want = reference::prefill_attention(v, cpu.buffers, h);
  const auto rel = [](const std::vector<uint16_t>& x, const auto& y) {
    double num = 0, den = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double got = bf16_to_float(x[i]), want_i = double(y[i]);
      num += (got - want_i) * (got - want_i);
      den += want_i * want_i;
    }
    return std::sqrt(num / den);
  };
  const double one_err = rel(one, want.out);
  std::printf("  one call: rel L2 %.2e against the reference\n", one_err);
  EXPECT_LT(one_err, rel_l2_bound(ElementType::kBFloat16));
  std::vector<float> one_f(one.size());
  for (size_t i = 0; i < one.size(); ++i) one_f[i] = bf16_to_float(one[i]);
  for (const int32_t chunk : {17, 256, 1000, 0}) {
    std::vector<int32_t> ends;
    if (chunk == 0) ends = {3000, int32_t(total)};
    else
      for (int32_t e = chunk; e - chunk < total; e += chunk) ends.push_back(std::min(e, int32_t(total)));
    const auto got = run(ends);
    EXPECT_EQ(std::count(got.begin(), got.end(), uint16_t(0xFFFF)), 0);
    const double vs_one = rel(got, one_f), vs_ref = rel(got, want.out);
    std::printf("  %-24s rel L2 %.2e against one call, %.2e against the reference\n",
                chunk ? cat("chunks of ", chunk).c_str() : "3000 cached + 1096 new", vs_one, vs_ref);
    EXPECT_LT(vs_one, rel_l2_bound(ElementType::kBFloat16)) << chunk;
    EXPECT_LT(vs_ref, rel_l2_bound(ElementType::kBFloat16)) << chunk;
  }
}

TEST_F(GpuPrefill, HostSideErrorsLaunchNothing) {
  const ValidLayout v = validate(instantiate(preset_spec("nvfp4kv-native"), {1, 4, 16, 2, 128}));
  harness::DeviceCache cache(v.layout(), 0);
  DeviceBuffer<uint16_t> q(8 * 128 * 4), out(8 * 128 * 4);
  auto table = DeviceBuffer<int32_t>::from({0, 1});
  auto lens = DeviceBuffer<int32_t>::from({20});
  auto cu = DeviceBuffer<int32_t>::from({0, 4});
  auto scales = DeviceBuffer<float>::from({1.0f, 1.0f});
  PrefillArgs a;
  a.q = q.get();
  a.q_heads = 8;
  a.cu_seqlens_q = cu.get();
  a.max_q_len = 4;
  a.batch = {.block_table = table.get(), .block_table_stride = 2, .seq_lens = lens.get(), .batch = 1};
  a.softmax_scale = 0.1f;
  a.k_global_scale = scales.get();
  a.v_global_scale = scales.get() + 1;
  a.out = out.get();
  EXPECT_TRUE(prefill_attention(v, cache.view(), a, nullptr).ok());
  const auto bad = [&](auto mutate, const char* needle) {
    PrefillArgs x = a;
    mutate(x);
    const Result r = prefill_attention(v, cache.view(), x, nullptr);
    EXPECT_EQ(r.status, Status::kInvalidArgument) << needle;
    EXPECT_NE(r.message.find(needle), std::string::npos) << r.message;
  };
  bad([](PrefillArgs& x) { x.q_heads = 7; }, "multiple of the layout's 2 kv heads");
  bad([](PrefillArgs& x) { x.q_heads = 34; }, "at most 16 query heads per kv head");
  bad([](PrefillArgs& x) { x.softmax_scale = 0; }, "softmax_scale");
  bad([](PrefillArgs& x) { x.cu_seqlens_q = nullptr; }, "cu_seqlens_q");
  bad([](PrefillArgs& x) { x.max_q_len = -3; }, "max_q_len");
  bad([](PrefillArgs& x) { x.q_type = ElementType::kFloat32; }, "bf16 or fp16");
  bad([](PrefillArgs& x) { x.out = nullptr; }, "output");
  bad([](PrefillArgs& x) { x.out = static_cast<char*>(x.out) + 2; }, "16-byte aligned");
  // A mixed call refused for its second run launches nothing, not even its first: a
  // short-query run (q length 4) and then a decode run, whose rows must be 8 elements apart.
  {
    DeviceBuffer<uint16_t> q2(8 * 1032), out2(5 * 8 * 128);
    auto cu2 = DeviceBuffer<int32_t>::from({0, 4, 5});
    auto lens2 = DeviceBuffer<int32_t>::from({20, 20});
    auto table2 = DeviceBuffer<int32_t>::from({0, 1, 2, 3});
    const int32_t routes[2] = {4, 1};
    size_t bytes = 0;
    ASSERT_TRUE(mixed_workspace_bytes(v, routes, 2, 8, 2, &bytes).ok());
    DeviceBuffer<uint8_t> ws(std::max<size_t>(bytes, 256));
    out2.fill_bytes(0x7F);
    PrefillArgs x = a;
    x.q = q2.get();
    x.q_token_stride = 8 * 128 + 4;
    x.cu_seqlens_q = cu2.get();
    x.batch = {.block_table = table2.get(), .block_table_stride = 2, .seq_lens = lens2.get(), .batch = 2};
    x.out = out2.get();
    const Result r = mixed_attention(v, cache.view(),
                                     {.args = x, .q_lens = routes, .workspace = ws.get(), .workspace_bytes = ws.size()}, nullptr);
    EXPECT_EQ(r.status, Status::kInvalidArgument) << r.message;
    EXPECT_NE(r.message.find("q_token_stride"), std::string::npos) << r.message;
    NVFP4KV_CUDA_CHECK(cudaDeviceSynchronize());
    const auto written = out2.download();
    EXPECT_TRUE(std::all_of(written.begin(), written.end(), [](uint16_t h) { return h == 0x7F7F; }))
        << "the short-query run launched before the decode run was refused";
  }
  const int32_t q_lens[2] = {1, -1};
  MixedBatch m{.args = a, .q_lens = q_lens};
  m.args.batch.batch = 2;
  const Result r = mixed_attention(v, cache.view(), m, nullptr);
  EXPECT_EQ(r.status, Status::kInvalidArgument);
  EXPECT_NE(r.message.find("negative"), std::string::npos) << r.message;
  NVFP4KV_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace nvfp4kv
