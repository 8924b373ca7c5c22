// Decode attention on the GPU against the fp64 reference on the same
// dequantized cache. Error bounds: docs/decode.md and bench/results say where
// they were measured; a dropped scale or a wrong layout gives errors above 0.1.
// Skipped, with a message, without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>

#include "nvfp4kv/api/decode.hpp"
#include "nvfp4kv/api/kv_cache.hpp"
#include "nvfp4kv/harness/decode_bench.hpp"
#include "nvfp4kv/harness/device_buffer.hpp"
#include "nvfp4kv/harness/workload.hpp"
#include "nvfp4kv/reference/attention.hpp"
#include "nvfp4kv/reference/cache.hpp"
#include "attention_check.hpp"

namespace nvfp4kv {
namespace {

using harness::DeviceBuffer;

using testing::cat;

class GpuDecode : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_device_available(&why)) GTEST_SKIP() << "GPU test skipped: " << why;
  }
};

// Bounds measured on the H200 over every case below (harness/decode_bench.hpp).
double rel_l2_bound(ElementType t) { return harness::decode_error_bound(t); }
constexpr double kLseBound = harness::kDecodeLseBound;

struct Case {
  std::string preset = "nvfp4kv-native";
  int64_t pages = 64, tokens_per_page = 16, kv_heads = 2, head_dim = 128, group = 4;
  std::vector<int32_t> lengths = {37, 200, 1};
  ElementType type = ElementType::kBFloat16;
  int64_t window = 0;
  float softcap = 0;
  bool sinks = false, lse = true;
  uint64_t seed = 1;
  int64_t stride = 0;  // block-table entries per sequence (0: enough for the longest)
  // The layout's code order (where a data byte keeps its two codes): empty keeps the preset's
  // (the native layout's is fp16-split, every engine's standard), a name replaces it.
  std::string codes;
  // A cache format (rotations, K smoothing) over the random stored values; the reference reads
  // the values back through it. plain_reader: the GPU reads the same bytes through the layout
  // without its format, a reader that forgot it (it must fail the bounds).
  std::optional<CacheFormat> format;
  bool plain_reader = false;
  // The layout's element formats (the native layout takes FP8 on either side).
  ElementFormat k_element = ElementFormat::kNvfp4, v_element = ElementFormat::kNvfp4;
  // E4M3 NaN in the FP8 elements and block scales of every slot no sequence reads.
  bool poison_unread = false;
};

struct Outcome : testing::Comparison {
  DeviceStatus gpu, cpu;
  DecodePlan plan;
};

// Runs one case through the GPU and the reference. Each sequence gets its own
// shuffled pages; `mutate` may spoil the block table or lengths afterwards.
template <typename Mutate>
Outcome run_case(const Case& k, Mutate mutate) {
  Outcome o;
  LayoutSpec spec = preset_spec(k.preset);
  if (!k.codes.empty()) spec.codes = *code_order_named(k.codes);
  const Layout l = instantiate(spec, {1, k.pages, k.tokens_per_page, k.kv_heads, k.head_dim, k.k_element, k.v_element});
  const ValidLayout plain = validate(l);
  const ValidLayout v = k.format ? with_format(plain, *k.format) : plain;
  const CacheDims& d = v.layout().dims;
  auto host = harness::random_cache(v, 0, k.seed);
  const int64_t batch = int64_t(k.lengths.size());
  const int64_t longest = *std::max_element(k.lengths.begin(), k.lengths.end());
  const int64_t stride = k.stride ? k.stride : std::max<int64_t>(1, (longest + d.tokens_per_page - 1) / d.tokens_per_page);
  std::mt19937_64 rng(k.seed + 7);
  std::vector<int32_t> table(size_t(batch * stride));
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
  }
  std::vector<int32_t> lengths = k.lengths;
  mutate(table, lengths);
  if (k.poison_unread) {
    // Pages of their own: every slot but the ones the sequences read, tails included.
    int64_t read = 0;
    for (int32_t len : lengths) read += std::clamp<int64_t>(len, 0, stride * d.tokens_per_page);
    EXPECT_EQ(harness::poison_unread_slots(v, 0, table, stride, lengths, host), d.pages * d.tokens_per_page - read);
  }
  const int64_t q_heads = k.kv_heads * k.group;
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<uint16_t> q(size_t(batch * q_heads * d.head_dim));
  for (auto& x : q) x = k.type == ElementType::kBFloat16 ? float_to_bf16(n(rng)) : float_to_fp16(n(rng));
  std::vector<float> sinks(static_cast<size_t>(q_heads));
  for (auto& s : sinks) s = n(rng) * 2.0f;
  const float gs[2] = {0.37f, 1.9f};

  DecodeArgs a;
  a.q = q.data();
  a.q_type = k.type;
  a.q_heads = q_heads;
  a.batch = {.block_table = table.data(), .block_table_stride = stride, .seq_lens = lengths.data(), .batch = batch};
  a.softmax_scale = float(1.0 / std::sqrt(double(d.head_dim)));
  a.k_global_scale = &gs[0];
  a.v_global_scale = &gs[1];
  a.window = k.window;
  a.softcap = k.softcap;
  a.sinks = k.sinks ? sinks.data() : nullptr;
  a.status = &o.cpu;
  reference::HostCache cpu(v.layout(), 0);
  for (size_t b = 0; b < host.size(); ++b) cpu.storage[b] = host[b];
  const reference::DecodeResult want = reference::decode_attention(v, cpu.buffers, a);

  harness::DeviceCache cache(v.layout(), 0);
  cache.upload(host);
  auto dq = DeviceBuffer<uint16_t>::from(q);
  auto dtable = DeviceBuffer<int32_t>::from(table);
  auto dlen = DeviceBuffer<int32_t>::from(lengths);
  auto dscales = DeviceBuffer<float>::from({gs[0], gs[1]});
  auto dsinks = DeviceBuffer<float>::from(sinks);
  auto dstatus = DeviceBuffer<DeviceStatus>::from({DeviceStatus{}});
  const harness::FormatVectors vectors(v);
  DeviceBuffer<uint16_t> out(q.size());
  DeviceBuffer<float> lse(size_t(batch * q_heads));
  out.fill_bytes(0xFF);
  lse.fill_bytes(0xFF);
  const Result pr = plan_decode(v, batch, q_heads, stride, &o.plan);
  EXPECT_TRUE(pr.ok()) << pr.message;
  DeviceBuffer<uint8_t> ws(std::max<size_t>(o.plan.workspace_bytes, 256));
  ws.fill_bytes(0xA5);  // a workspace needs no clearing: the split tickets read stray bytes as "none finished"
  DecodeArgs g = a;
  g.q = dq.get();
  g.batch.block_table = dtable.get();
  g.batch.seq_lens = dlen.get();
  g.k_global_scale = dscales.get();
  g.v_global_scale = dscales.get() + 1;
  g.sinks = k.sinks ? dsinks.get() : nullptr;
  g.out = out.get();
  g.lse = k.lse ? lse.get() : nullptr;
  g.status = dstatus.get();
  g.workspace = ws.get();
  g.workspace_bytes = ws.size();
  if (!k.plain_reader) vectors.give(g);
  const Result r = decode_attention(k.plain_reader ? plain : v, cache.view(), g, nullptr);
  EXPECT_TRUE(r.ok()) << r.message;
  NVFP4KV_CUDA_CHECK(cudaDeviceSynchronize());
  const auto got = out.download();
  const auto got_lse = lse.download();
  static_cast<testing::Comparison&>(o) = testing::compare_attention(got, want.out, got.size(), d.head_dim, k.type,
                                                                     k.lse ? &got_lse : nullptr, want.lse, got_lse.size());
  o.gpu = dstatus.download()[0];
  return o;
}

Outcome run_case(const Case& k) {
  return run_case(k, [](std::vector<int32_t>&, std::vector<int32_t>&) {});
}

void expect_close(const Case& k, const Outcome& o, const std::string& what) {
  std::printf("  %-44s splits %3d %-5s rel L2 %.2e  max |err| %.2e  lse %.2e\n", what.c_str(), o.plan.splits,
              o.plan.dense_planes ? "bulk" : o.plan.tensor_rows ? "tensor" : "rows", o.rel_l2, o.max_abs, o.lse_max_abs);
  EXPECT_LT(o.rel_l2, rel_l2_bound(k.type)) << what;
  // A rotated query, or one scaled by lambda, is rounded to FP16 where a BF16 one is exact.
  const bool rotated_query = k.format && ((!k.format->layers.empty() && k.format->layers[0].k.rotation != kNoRotation) ||
                                          k.format->has_k_channel_scale());
  EXPECT_LT(o.lse_max_abs, rotated_query ? harness::kRotatedQueryLseBound : kLseBound) << what;
  EXPECT_EQ(o.unwritten, 0) << what;
  EXPECT_EQ(o.nan_mismatch, 0) << what;
}

TEST_F(GpuDecode, EveryGroupHeadDimAndPageSizeMatchesTheReference) {
  int ran = 0;
  for (int64_t group : {1, 2, 4, 8, 16})
    for (int64_t dim : {64, 128, 256})
      for (int64_t n : {16, 32, 64, 128}) {
        Case k;
        k.group = group;
        k.head_dim = dim;
        k.tokens_per_page = n;
        k.pages = std::max<int64_t>(8, 2048 / n);
        k.lengths = {int32_t(n * 3 + 5), 0, 1, int32_t(n * 7 - 3)};
        k.type = ran % 2 ? ElementType::kFloat16 : ElementType::kBFloat16;
        k.seed = uint64_t(ran) + 1;
        const Outcome o = run_case(k);
        expect_close(k, o, cat("G", group, " D", dim, " N", n, k.type == ElementType::kBFloat16 ? " bf16" : " fp16"));
        if (HasFailure()) return;
        ++ran;
      }
  EXPECT_EQ(ran, 60);
}

// Page sizes outside the main sweep: 1 token per page (64 pages per stage, the
// page mask's width), stages whose token count is not a multiple of 16 (3, 24, 40,
// 200 tokens per page), one page of 256, at each head dim (at D 64 a warp's tiles
// go in pairs, so odd tile counts per warp leave a single one); and a plane
// preset whose stage holds one or two pages (a bulk copy per plane). Lengths end
// inside tiles.
TEST_F(GpuDecode, OddPageSizesAndStageShapes) {
  for (int64_t dim : {128, 64, 256})
    for (int64_t n : {1, 2, 3, 8, 24, 40, 200, 256}) {
      if (dim != 128 && (n == 1 || n == 2 || n == 8)) continue;
      Case k;
      k.head_dim = dim;
      k.tokens_per_page = n;
      k.pages = std::max<int64_t>(8, 1200 / n + 8);
      k.lengths = {100, 200, 37, 1, 0};
      k.seed = uint64_t(n + dim) + 300;
      const Outcome o = run_case(k);
      expect_close(k, o, cat("native D", dim, " N", n));
    }
  for (int64_t n : {64, 128}) {
    Case k;
    k.preset = "flashinfer-hnd";
    k.tokens_per_page = n;
    k.pages = 24;
    k.lengths = {300, 129, 5};
    k.seed = uint64_t(n) + 400;
    const Outcome o = run_case(k);
    EXPECT_TRUE(o.plan.dense_planes) << "flashinfer-hnd N" << n;
    expect_close(k, o, cat("flashinfer-hnd N", n));
  }
}

// Head dims without their own instance run zero-padded (and row by row).
TEST_F(GpuDecode, OtherHeadDimsThroughThePaddedPath) {
  for (int64_t dim : {16, 48, 80, 96, 112, 160, 192}) {
    Case k;
    k.head_dim = dim;
    k.seed = uint64_t(dim);
    const Outcome o = run_case(k);
    expect_close(k, o, cat("D", dim));
    EXPECT_FALSE(o.plan.dense_planes);
  }
}

TEST_F(GpuDecode, OptionsMatchTheReference) {
  for (int variant = 0; variant < 8; ++variant) {
    Case k;
    k.lengths = {300, 17, 0, 129};
    k.window = (variant & 1) ? 50 : 0;
    k.softcap = (variant & 2) ? 1.5f : 0;  // small: the cap bites
    k.sinks = (variant & 4) != 0;
    k.type = variant % 3 ? ElementType::kBFloat16 : ElementType::kFloat16;
    k.seed = uint64_t(variant) + 40;
    const Outcome o = run_case(k);
    expect_close(k, o, cat("window ", k.window, ", softcap ", k.softcap, k.sinks ? ", sinks" : ""));
  }
}

// A format's transforms, read by decode from the layout (common/format_view.hpp): the query
// scaled by K's lambda and rotated as K was, q . mu added to the logits (per logit under a soft-cap, as
// a shift of the row otherwise), V's rotation undone on the output, also where a split
// sequence's partials merge. The random stored values are read back through the format by
// the reference in float64. A reader that ignores the format fails: the same bytes read as
// plain NVFP4 are off by more than the bound in the output (a rotation) or in the LSE (mu).
TEST_F(GpuDecode, FormatTransformsMatchTheReference) {
  struct Variant {
    int64_t head_dim, k_rotation, v_rotation;
    bool mean;
    float softcap;
    bool sinks;
    std::vector<int32_t> lengths;
    bool channel_scale = false;  // lambda: the query scaled before its rotation
  };
  const std::vector<Variant> variants = {
      {128, kRotateWholeHead, kRotateWholeHead, true, 0, false, {300, 17, 0, 129}},
      {128, kRotateWholeHead, kNoRotation, true, 1.5f, false, {300, 17, 0, 129}, true},
      {64, kNoRotation, kNoRotation, false, 0, true, {41000, 5}, true},  // lambda alone, split and merged
      {256, 64, kRotateWholeHead, false, 0, false, {900, 33}, true},
      {128, 32, kNoRotation, true, 1.5f, true, {300, 17, 0, 129}},
      {64, kNoRotation, 16, true, 0, true, {41000, 5}},  // split and merged
      {256, kRotateWholeHead, 64, false, 0, false, {900, 33}},
      {96, kRotateWholeHead, kRotateWholeHead, true, 2.0f, false, {513, 64}},  // padded D, blocks of 32
      {128, kNoRotation, kNoRotation, true, 0, false, {300, 17, 129}},  // mu alone: the LSE carries it
  };
  int seed = 900;
  for (const Variant& var : variants) {
    Case k;
    k.head_dim = var.head_dim;
    k.lengths = var.lengths;
    k.pages = var.lengths[0] > 10000 ? 2700 : 64;
    k.softcap = var.softcap;
    k.sinks = var.sinks;
    k.seed = uint64_t(++seed);
    k.format = harness::random_format(k.kv_heads, var.head_dim, var.k_rotation, var.v_rotation, var.mean,
                                      uint64_t(seed), var.channel_scale);
    const std::string what = cat("D", var.head_dim, " K rot ", var.k_rotation, " V rot ", var.v_rotation,
                                 var.mean ? " mu" : "", var.channel_scale ? " lambda" : "",
                                 var.softcap > 0 ? " softcap" : "", var.sinks ? " sinks" : "");
    const Outcome o = run_case(k);
    expect_close(k, o, what);
    if (var.lengths[0] > 10000) {
      EXPECT_GT(o.plan.splits, 1) << what;
    }
    k.plain_reader = true;
    const Outcome wrong = run_case(k);
    std::printf("  %-44s read as plain: rel L2 %.2e  lse %.2e\n", what.c_str(), wrong.rel_l2, wrong.lse_max_abs);
    EXPECT_TRUE(wrong.rel_l2 > 0.1 || wrong.lse_max_abs > 1.0) << what << ": a reader without the format passed";
  }
}

// FP8 E4M3 sides (the layout's elements): decode reads K, V or both in FP8 through that
// side's dequantize part (attention/dequant.cuh), beside the other side's NVFP4, at every
// head dim and group size, with the options, a split sequence, the format's steps and the
// padded row path. The random FP8 elements span 2^-4 .. 2^4 of either sign, with zeros and
// subnormals (harness::random_cache), read back by the reference in float64.
TEST_F(GpuDecode, Fp8SidesMatchTheReference) {
  constexpr ElementFormat F = ElementFormat::kFp8E4M3, N = ElementFormat::kNvfp4;
  struct Variant {
    ElementFormat k, v;
    int64_t head_dim, tokens_per_page, group;
    float softcap;
    bool sinks;
    int64_t window;
    std::vector<int32_t> lengths;
    int64_t k_rotation, v_rotation;
    bool mean;
    ElementType type;
    char copies = 'b';  // the stage copies the planner picks: 'b' bulk, 't' tensor rows, 'r' row copies
    bool poison = false;  // E4M3 NaN in every slot no sequence reads (harness::poison_unread_slots)
  };
  const auto bf16 = ElementType::kBFloat16, fp16 = ElementType::kFloat16;
  const std::vector<Variant> variants = {
      {F, N, 128, 16, 4, 0, false, 0, {300, 17, 0, 129}, kNoRotation, kNoRotation, false, bf16},
      {N, F, 128, 16, 4, 0, false, 0, {300, 17, 0, 129}, kNoRotation, kNoRotation, false, bf16},
      {F, F, 128, 16, 4, 0, false, 0, {300, 17, 0, 129}, kNoRotation, kNoRotation, false, fp16},
      {F, N, 64, 32, 8, 1.5f, true, 0, {41000, 5}, kNoRotation, kNoRotation, false, bf16},  // split and merged
      {N, F, 64, 16, 16, 0, true, 50, {300, 17, 1}, kNoRotation, kNoRotation, false, fp16},
      {F, F, 256, 64, 2, 0, false, 0, {900, 33}, kRotateWholeHead, 64, true, bf16},
      {F, N, 256, 16, 16, 2.0f, false, 0, {513, 64}, kNoRotation, kNoRotation, true, bf16},
      {N, F, 256, 128, 1, 0, true, 0, {700, 3}, kNoRotation, kRotateWholeHead, false, bf16},
      {F, N, 96, 16, 4, 0, false, 0, {513, 64}, kNoRotation, kNoRotation, false, bf16, 'r'},  // padded D
      {F, F, 128, 1, 4, 0, false, 0, {100, 37}, kNoRotation, kNoRotation, false, bf16},        // 64 pages a stage
      // Review (session 19): the copy paths other than one bulk copy per page. K's scale plane
      // of 8 bytes a token: tensor copies, V's FP8 plane beside it; 3 tokens a page: row copies
      // by cp.async; an FP8 V padded from D 80.
      {N, F, 128, 1, 4, 0, false, 0, {100, 37}, kNoRotation, kNoRotation, false, bf16, 't'},
      {F, N, 128, 3, 4, 1.5f, false, 0, {300, 17}, kNoRotation, kNoRotation, false, bf16, 'r'},
      {N, F, 80, 16, 4, 0, true, 0, {513, 64}, kNoRotation, kNoRotation, false, fp16, 'r'},
      // Review (session 19): NaN codes in the slots past each sequence's end (and in every page
      // no sequence reads), which a reader must keep out of its sums; plain NVFP4 beside (NaN
      // block scales), bulk, split and row copies.
      {F, F, 128, 16, 4, 0, false, 0, {300, 17, 129}, kNoRotation, kNoRotation, false, bf16, 'b', true},
      {N, N, 128, 16, 4, 1.5f, true, 0, {300, 17, 129}, kNoRotation, kNoRotation, false, bf16, 'b', true},
      {F, N, 64, 32, 8, 0, true, 0, {41000, 5}, kNoRotation, kNoRotation, false, bf16, 'b', true},
      {N, F, 128, 3, 4, 0, false, 0, {301, 17}, kNoRotation, kNoRotation, false, fp16, 'r', true},
  };
  int seed = 1300;
  for (const Variant& var : variants) {
    Case k;
    k.k_element = var.k, k.v_element = var.v;
    k.head_dim = var.head_dim;
    k.tokens_per_page = var.tokens_per_page;
    k.group = var.group;
    k.lengths = var.lengths;
    k.pages = var.lengths[0] > 10000 ? 1400 : std::max<int64_t>(64, 1100 / var.tokens_per_page + 8);
    // A poisoned case gives every table entry a page of its own (run_case), so the long one needs
    // as many pages as its table has entries (two sequences of 1282 entries at 32 tokens a page).
    if (var.poison) {
      const int64_t longest = *std::max_element(var.lengths.begin(), var.lengths.end());
      const int64_t entries = int64_t(var.lengths.size()) * ((longest + var.tokens_per_page - 1) / var.tokens_per_page);
      k.pages = std::max(k.pages, entries);
    }
    k.softcap = var.softcap;
    k.sinks = var.sinks;
    k.window = var.window;
    k.type = var.type;
    k.seed = uint64_t(++seed);
    k.poison_unread = var.poison;
    k.format = harness::random_format_over(var.k, var.v, k.kv_heads, var.head_dim, var.k_rotation, var.v_rotation,
                                           var.mean, uint64_t(seed), var.mean);  // mu with lambda beside FP8
    const std::string what =
        cat("K ", element_format_name(var.k), " V ", element_format_name(var.v), " D", var.head_dim, " N",
            var.tokens_per_page, " G", var.group, var.softcap > 0 ? " softcap" : "", var.sinks ? " sinks" : "",
            var.window ? " window" : "", var.k_rotation || var.v_rotation ? " rotated" : "", var.mean ? " mu lambda" : "",
            var.poison ? " NaN past the ends" : "");
    const Outcome o = run_case(k);
    expect_close(k, o, what);
    if (var.lengths[0] > 10000) {
      EXPECT_GT(o.plan.splits, 1) << what;
    }
    EXPECT_EQ(o.plan.dense_planes ? 'b' : o.plan.tensor_rows ? 't' : 'r', var.copies) << what;
    if (HasFailure()) return;
  }
}

// FP8 beside NVFP4 in the standard code order (a layout of one's own may say so) has no
// instance: refused by name before anything runs.
TEST_F(GpuDecode, Fp8BesideTheStandardCodeOrderIsRefused) {
  LayoutSpec spec = preset_spec("nvfp4kv-native");
  spec.codes = *code_order_named("standard");
  const ValidLayout v = validate(instantiate(spec, {1, 8, 16, 2, 128, ElementFormat::kFp8E4M3, ElementFormat::kNvfp4}));
  DecodePlan plan;
  const Result r = plan_decode(v, 1, 8, 8, &plan);
  EXPECT_EQ(r.status, Status::kUnsupported);
  EXPECT_NE(r.message.find("fp16-split"), std::string::npos) << r.message;
}

// Long sequences split over many blocks and merged: batch 1 and several, ragged.
TEST_F(GpuDecode, SplitSequencesMergeToTheReference) {
  Case k;
  k.kv_heads = 1;
  k.head_dim = 64;
  k.group = 8;
  k.pages = 2600;
  k.lengths = {41000};
  const Outcome one = run_case(k);
  EXPECT_GT(one.plan.splits, 8);
  expect_close(k, one, "batch 1, 41000 tokens");
  k.lengths = {41000, 3, 12000, 0};
  k.sinks = true;
  const Outcome some = run_case(k);
  expect_close(k, some, "ragged batch up to 41000 tokens, sinks");
  // The merge takes the partials in chunks of 64 splits at D 128, 32 at D 256 (and
  // 128 at D 64 above); a padded D leaves columns of the workspace unwritten.
  for (int64_t dim : {128, 256, 96}) {
    Case m;
    m.kv_heads = 1;
    m.head_dim = dim;
    m.group = 4;
    m.pages = 2600;
    m.lengths = {41000, 700};
    m.seed = uint64_t(dim) + 500;
    const Outcome o = run_case(m);
    EXPECT_GT(o.plan.splits, 64) << "D" << dim;
    expect_close(m, o, cat("D", dim, ", 41000 tokens, splits ", o.plan.splits));
  }
}

// A subset of a sequence's pages (sparse / top-k selection): the block table
// names any pages, in any order, repeated or not.
TEST_F(GpuDecode, SparseAndRepeatedPages) {
  Case k;
  k.pages = 40;
  k.lengths = {160, 96};
  const Outcome o = run_case(k, [](std::vector<int32_t>& table, std::vector<int32_t>&) {
    for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t((i * 7) % 5 + 30);  // pages 30..34, repeating
  });
  expect_close(k, o, "sparse, repeated pages");
}

TEST_F(GpuDecode, EverySoundPresetMatchesTheReference) {
  int ran = 0;
  for (const PresetInfo& p : list_presets()) {
    const Layout l = instantiate(preset_spec(p.name), {1, 64, 16, 2, 128});
    if (!check(l).report.ok) continue;
    Case k;
    k.preset = p.name;
    k.seed = uint64_t(ran) + 90;
    const Outcome o = run_case(k);
    expect_close(k, o, p.name);
    ++ran;
  }
  EXPECT_GE(ran, 11);
}

// The fp16-split code order (element 2j's bits where an FP16's high byte wants them; the
// native layout's since its version 2, forced here onto engines' places too):
// decode places it with its own, shorter sequence (attention/dequant.cuh,
// Nvfp4Fp16Split), on every copy path (one span per page, planes, tensor rows, row
// copies), head dim, group and option; the reference reads the order from the layout.
TEST_F(GpuDecode, TheFp16SplitCodeOrderMatchesTheReference) {
  int ran = 0;
  for (const char* preset : {"nvfp4kv-native", "flashinfer-hnd", "flashinfer-nhd", "vllm-packed-nhd-rows"})
    for (int64_t dim : {64, 128, 256})
      for (int64_t group : {1, 4, 16}) {
        Case k;
        k.codes = "fp16-split";
        k.preset = preset;
        k.head_dim = dim;
        k.group = group;
        k.lengths = {37, 700, 1, 16};
        k.type = ran % 2 ? ElementType::kFloat16 : ElementType::kBFloat16;
        k.window = ran % 3 == 1 ? 100 : 0;
        k.softcap = ran % 4 == 2 ? 2.0f : 0;
        k.sinks = ran % 5 == 3;
        k.seed = uint64_t(ran) + 500;
        const Outcome o = run_case(k);
        expect_close(k, o, cat("fp16-split ", preset, " D", dim, " G", group));
        if (HasFailure()) return;
        ++ran;
      }
}

// Strided rows by tensor copies: heads sharing a row put a head's scale columns at
// any multiple of D/16 bytes, which the copy engine cannot start a box at (run 41's
// illegal instruction at head 1). Head counts that give every head shift the copy
// engine's 16-byte rule allows (D 64: 4 heads, shifts 0/4/8/12 in a 16-byte scale
// row; D 128: 6, shifts 0/8; D 256: 3, an odd count) take the tensor copies; 5 heads
// at D 64 and 128 make the token stride of the scale rows (20, 40 bytes) one the copy
// engine refuses, and those read through the row copies (run 42 counted 6 of 18 with 5
// heads everywhere). Both kinds agree with the reference.
TEST_F(GpuDecode, TensorRowsReadEveryHeadOfASharedRow) {
  int tensor = 0, rows = 0;
  for (const char* preset : {"flashinfer-nhd", "attention-rs", "vllm-legacy-nhd-reader-sm120"})
    for (int64_t dim : {64, 128, 256})
      for (int64_t n : {16, 32})
        for (const bool fits : {true, false}) {
          if (!fits && dim == 256) continue;  // 5 heads of 16 scale bytes: a stride of 80, fine
          Case k;
          k.preset = preset;
          k.head_dim = dim;
          k.tokens_per_page = n;
          k.kv_heads = !fits ? 5 : dim == 64 ? 4 : dim == 128 ? 6 : 3;
          k.group = 2;
          k.lengths = {int(3 * n + 5), 1, int(2 * n)};
          k.seed = uint64_t(dim + n + k.kv_heads);
          const Outcome o = run_case(k);
          expect_close(k, o, cat(preset, " D", dim, " N", n, " heads ", k.kv_heads));
          EXPECT_EQ(o.plan.tensor_rows, fits) << preset << " D" << dim << " heads " << k.kv_heads;
          (o.plan.tensor_rows ? tensor : rows) += 1;
        }
  EXPECT_EQ(tensor, 18);
  EXPECT_EQ(rows, 12);
}

TEST_F(GpuDecode, BadEntriesAreCountedNeverReadAndMarkTheirSequence) {
  Case k;
  k.lengths = {64, 64, 64};
  // Sequence 1's second page does not exist; sequence 2 is longer than its table.
  const Outcome o = run_case(k, [](std::vector<int32_t>& table, std::vector<int32_t>& lengths) {
    table[size_t(1 * 4 + 1)] = 100000;
    lengths[2] = 4 * 16 + 9;
  });
  EXPECT_EQ(o.nan_mismatch, 0);
  EXPECT_EQ(o.gpu.bad_pages, 16u);
  EXPECT_EQ(o.gpu.bad_lengths, 1u);
  EXPECT_EQ(o.cpu.bad_pages, o.gpu.bad_pages);
  EXPECT_EQ(o.cpu.bad_lengths, o.gpu.bad_lengths);
  EXPECT_LT(o.rel_l2, rel_l2_bound(k.type));  // sequence 0 is still right
}

TEST_F(GpuDecode, HostSideErrorsLaunchNothing) {
  const ValidLayout v = validate(instantiate(preset_spec("nvfp4kv-native"), {1, 4, 16, 2, 128}));
  harness::DeviceCache cache(v.layout(), 0);
  DeviceBuffer<uint16_t> q(8 * 128), out(8 * 128);
  auto table = DeviceBuffer<int32_t>::from({0, 1});
  auto lens = DeviceBuffer<int32_t>::from({20});
  auto scales = DeviceBuffer<float>::from({1.0f, 1.0f});
  DecodeArgs a;
  a.q = q.get();
  a.q_heads = 8;
  a.batch = {.block_table = table.get(), .block_table_stride = 2, .seq_lens = lens.get(), .batch = 1};
  a.softmax_scale = 0.1f;
  a.k_global_scale = scales.get();
  a.v_global_scale = scales.get() + 1;
  a.out = out.get();
  EXPECT_TRUE(decode_attention(v, cache.view(), a, nullptr).ok());
  const auto bad = [&](auto mutate, const char* needle) {
    DecodeArgs x = a;
    mutate(x);
    const Result r = decode_attention(v, cache.view(), x, nullptr);
    EXPECT_EQ(r.status, Status::kInvalidArgument) << needle;
    EXPECT_NE(r.message.find(needle), std::string::npos) << r.message;
  };
  bad([](DecodeArgs& x) { x.q_heads = 7; }, "multiple of the layout's 2 kv heads");
  bad([](DecodeArgs& x) { x.q_heads = 34; }, "at most 16 query heads per kv head");
  bad([](DecodeArgs& x) { x.softmax_scale = 0; }, "softmax_scale");
  bad([](DecodeArgs& x) { x.window = -1; }, "window");
  bad([](DecodeArgs& x) { x.q_type = ElementType::kFloat32; }, "bf16 or fp16");
  bad([](DecodeArgs& x) { x.out = nullptr; }, "output");
  bad([](DecodeArgs& x) { x.batch.seq_lens = nullptr; }, "lengths are required");
  NVFP4KV_CUDA_CHECK(cudaDeviceSynchronize());
}

// Engines capture the decode step in a CUDA graph for a fixed batch and replay it
// while lengths and block tables change: every replay must match the reference.
TEST_F(GpuDecode, GraphReplaysFollowChangingLengthsAndTables) {
  const ValidLayout v = validate(instantiate(preset_spec("nvfp4kv-native"), {1, 300, 16, 2, 128}));
  const CacheDims& d = v.layout().dims;
  const auto host = harness::random_cache(v, 0, 5);
  harness::DeviceCache cache(v.layout(), 0);
  cache.upload(host);
  reference::HostCache cpu(v.layout(), 0);
  for (size_t b = 0; b < host.size(); ++b) cpu.storage[b] = host[b];
  const int64_t batch = 3, stride = 100, q_heads = 8;
  std::mt19937_64 rng(8);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<uint16_t> q(size_t(batch * q_heads * 128));
  for (auto& x : q) x = float_to_bf16(n(rng));
  const float gs[2] = {1.0f, 1.0f};
  DecodePlan plan;
  ASSERT_TRUE(plan_decode(v, batch, q_heads, stride, &plan).ok());
  // Split, so that the replays run the merge's tickets, which reset themselves.
  ASSERT_GT(plan.splits, 1);
  auto dq = DeviceBuffer<uint16_t>::from(q);
  DeviceBuffer<int32_t> dtable(static_cast<size_t>(batch * stride)), dlen(static_cast<size_t>(batch));
  auto dscales = DeviceBuffer<float>::from({gs[0], gs[1]});
  DeviceBuffer<uint16_t> out(q.size());
  DeviceBuffer<uint8_t> ws(std::max<size_t>(plan.workspace_bytes, 256));
  ws.fill_bytes(0x5A);  // never cleared: not before capture, not between replays
  DecodeArgs g;
  g.q = dq.get();
  g.q_heads = q_heads;
  g.batch = {.block_table = dtable.get(), .block_table_stride = stride, .seq_lens = dlen.get(), .batch = batch};
  g.softmax_scale = 0.088f;
  g.k_global_scale = dscales.get();
  g.v_global_scale = dscales.get() + 1;
  g.out = out.get();
  g.workspace = ws.get();
  g.workspace_bytes = ws.size();
  const testing::CapturedGraph graph([&](cudaStream_t s) { return decode_attention(v, cache.view(), g, s); });
  ASSERT_TRUE(graph.captured().ok()) << graph.captured().message;
  for (int replay = 0; replay < 4; ++replay) {
    std::vector<int32_t> table(static_cast<size_t>(batch * stride)), lengths(static_cast<size_t>(batch));
    for (auto& t : table) t = int32_t(rng() % uint64_t(d.pages));
    for (auto& len : lengths) len = int32_t(rng() % uint64_t(stride * d.tokens_per_page));
    dtable.upload(table);
    dlen.upload(lengths);
    out.fill_bytes(0xFF);
    graph.replay();
    DecodeArgs a = g;
    a.q = q.data();
    a.batch.block_table = table.data();
    a.batch.seq_lens = lengths.data();
    a.k_global_scale = &gs[0];
    a.v_global_scale = &gs[1];
    const reference::DecodeResult want = reference::decode_attention(v, cpu.buffers, a);
    const auto got = out.download();
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double x = bf16_to_float(got[i]);
      num += (x - want.out[i]) * (x - want.out[i]);
      den += want.out[i] * want.out[i];
    }
    std::printf("  replay %d: lengths %d %d %d, rel L2 %.2e\n", replay, lengths[0], lengths[1], lengths[2],
                std::sqrt(num / den));
    EXPECT_LT(std::sqrt(num / den), rel_l2_bound(ElementType::kBFloat16)) << "replay " << replay;
  }
}

}  // namespace
}  // namespace nvfp4kv
