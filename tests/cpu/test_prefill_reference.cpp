// The fp64 prefill reference on the CPU: q length 1 is decode, chunking a
// prompt changes nothing, window 1 returns each position's own V, and bad
// lengths and entries are counted and marked as the GPU must.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "nvfp4kv/reference/attention.hpp"
#include "nvfp4kv/reference/cache.hpp"

namespace nvfp4kv::reference {
namespace {

// One layer of a layout filled by the reference store with Gaussian K/V rows:
// page p holds slots [p N, (p + 1) N).
struct Filled {
  ValidLayout valid;
  HostCache cache;
  float gs[2] = {0.37f, 1.9f};
  Filled(const char* preset, int64_t pages, int64_t n, int64_t heads, int64_t dim, uint64_t seed)
      : valid(validate(instantiate(preset_spec(preset), {1, pages, n, heads, dim}))), cache(valid.layout(), 0) {
    const int64_t tokens = pages * n;
    std::mt19937 rng{uint32_t(seed)};
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> k(size_t(tokens * heads * dim)), v(k.size());
    for (auto& x : k) x = g(rng);
    for (auto& x : v) x = g(rng);
    std::vector<int64_t> slots(static_cast<size_t>(tokens));
    std::iota(slots.begin(), slots.end(), 0);
    StoreArgs s;
    s.rows = {.k = k.data(), .v = v.data(), .tokens = tokens, .token_stride = heads * dim};
    s.type = ElementType::kFloat32;
    s.slots = slots.data();
    s.slots_are_int64 = true;
    s.k_global_scale = &gs[0];
    s.v_global_scale = &gs[1];
    store(valid, cache.buffers, s);
  }
};

struct Batch {
  std::vector<int32_t> table, kv_lens, cu_q;
  std::vector<float> q;
  int64_t stride = 0, q_heads = 0, dim = 0;
  PrefillArgs args(const Filled& f) const {
    PrefillArgs a;
    a.q = q.data();
    a.q_type = ElementType::kFloat32;
    a.q_heads = q_heads;
    a.cu_seqlens_q = cu_q.data();
    for (size_t s = 0; s + 1 < cu_q.size(); ++s) a.max_q_len = std::max<int64_t>(a.max_q_len, cu_q[s + 1] - cu_q[s]);
    a.batch = {.block_table = table.data(), .block_table_stride = stride, .seq_lens = kv_lens.data(),
               .batch = int64_t(kv_lens.size())};
    a.softmax_scale = float(1.0 / std::sqrt(double(dim)));
    a.k_global_scale = &f.gs[0];
    a.v_global_scale = &f.gs[1];
    return a;
  }
};

// Sequences with the given (q, kv) lengths, each on its own shuffled pages.
Batch make_batch(const Filled& f, const std::vector<std::pair<int32_t, int32_t>>& lens, int64_t q_heads, uint64_t seed) {
  const CacheDims& d = f.valid.layout().dims;
  Batch b;
  b.q_heads = q_heads;
  b.dim = d.head_dim;
  b.stride = d.pages;
  std::mt19937 rng{uint32_t(seed)};
  std::normal_distribution<float> g(0.0f, 1.0f);
  b.cu_q.push_back(0);
  for (const auto& [q_len, kv_len] : lens) {
    std::vector<int32_t> pages(size_t(d.pages));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    b.table.insert(b.table.end(), pages.begin(), pages.end());
    b.kv_lens.push_back(kv_len);
    b.cu_q.push_back(b.cu_q.back() + q_len);
  }
  b.q.resize(size_t(b.cu_q.back() * q_heads * d.head_dim));
  for (auto& x : b.q) x = g(rng);
  return b;
}

TEST(PrefillReference, QueryLengthOneIsDecode) {
  const Filled f("nvfp4kv-native", 24, 16, 2, 64, 1);
  Batch b = make_batch(f, {{1, 37}, {1, 200}, {1, 1}, {1, 16}}, 8, 2);
  for (int variant = 0; variant < 8; ++variant) {
    std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f, 1.0f, -3.0f, 0.25f, 4.0f};
    PrefillArgs p = b.args(f);
    p.window = (variant & 1) ? 20 : 0;
    p.softcap = (variant & 2) ? 1.5f : 0;
    p.sinks = (variant & 4) ? sinks.data() : nullptr;
    const DecodeArgs d = decode_args_of(p);
    const PrefillResult got = prefill_attention(f.valid, f.cache.buffers, p);
    const DecodeResult want = decode_attention(f.valid, f.cache.buffers, d);
    ASSERT_EQ(got.out.size(), want.out.size());
    for (size_t i = 0; i < got.out.size(); ++i) ASSERT_EQ(got.out[i], want.out[i]) << "variant " << variant << " at " << i;
    for (size_t i = 0; i < got.lse.size(); ++i) ASSERT_EQ(got.lse[i], want.lse[i]) << "variant " << variant;
  }
}

// A 300-token prompt in one call, in chunks (each chunk's kv length is where it
// ends: the chunk was stored first), and as a 200-token cached prefix plus 100 new
// tokens: the same rows, bit for bit (each row depends only on its position).
TEST(PrefillReference, ChunkingChangesNothing) {
  const Filled f("nvfp4kv-native", 20, 16, 1, 64, 3);
  const int32_t total = 300;
  Batch whole = make_batch(f, {{total, total}}, 2, 4);
  for (const int32_t options : {0, 1}) {
    PrefillArgs a = whole.args(f);
    a.window = options ? 33 : 0;
    a.softcap = options ? 2.0f : 0;
    const PrefillResult one = prefill_attention(f.valid, f.cache.buffers, a);
    for (const int32_t chunk : {1, 17, 100, 200}) {
      std::vector<double> out, lse;
      for (int32_t start = 0; start < total; start += chunk) {
        const int32_t len = std::min(chunk, total - start);
        Batch c = whole;
        c.cu_q = {0, len};
        c.kv_lens = {start + len};
        c.q.assign(whole.q.begin() + start * 2 * 64, whole.q.begin() + (start + len) * 2 * 64);
        PrefillArgs ca = c.args(f);
        ca.window = a.window;
        ca.softcap = a.softcap;
        const PrefillResult part = prefill_attention(f.valid, f.cache.buffers, ca);
        out.insert(out.end(), part.out.begin(), part.out.end());
        lse.insert(lse.end(), part.lse.begin(), part.lse.end());
      }
      ASSERT_EQ(out, one.out) << "chunks of " << chunk << ", options " << options;
      ASSERT_EQ(lse, one.lse) << "chunks of " << chunk << ", options " << options;
    }
  }
}

// Window 1: each query sees only its own position, so its output is that
// token's dequantized V and its LSE that token's logit (through the softcap).
TEST(PrefillReference, WindowOneReturnsEachPositionsValue) {
  const Filled f("flashinfer-hnd", 8, 16, 2, 32, 5);
  const Batch b = make_batch(f, {{5, 40}, {30, 30}}, 2, 6);
  PrefillArgs a = b.args(f);
  a.window = 1;
  const PrefillResult r = prefill_attention(f.valid, f.cache.buffers, a);
  const CacheDims& d = f.valid.layout().dims;
  for (int64_t s = 0; s < 2; ++s) {
    std::vector<int32_t> pages(b.table.begin() + s * b.stride, b.table.begin() + (s + 1) * b.stride);
    const GatheredKv kv = gather_sequence(f.valid, f.cache.buffers, pages, b.kv_lens[size_t(s)], 0, f.gs[0], f.gs[1]);
    const int64_t q_len = b.cu_q[size_t(s) + 1] - b.cu_q[size_t(s)];
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t row = b.cu_q[size_t(s)] + i, pos = b.kv_lens[size_t(s)] - q_len + i;
      for (int64_t h = 0; h < a.q_heads; ++h) {
        const int64_t kvh = h / (a.q_heads / d.heads);
        double logit = 0;
        for (int64_t e = 0; e < d.head_dim; ++e) {
          ASSERT_DOUBLE_EQ(r.out[size_t((row * a.q_heads + h) * d.head_dim + e)],
                           kv.v[size_t((pos * d.heads + kvh) * d.head_dim + e)]);
          logit += double(b.q[size_t((row * a.q_heads + h) * d.head_dim + e)]) *
                   kv.k[size_t((pos * d.heads + kvh) * d.head_dim + e)];
        }
        EXPECT_NEAR(r.lse[size_t(row * a.q_heads + h)], logit * a.softmax_scale, 1e-9);
      }
    }
  }
}

TEST(PrefillReference, BadLengthsAndEntriesAreCountedAndMarked) {
  const Filled f("nvfp4kv-native", 16, 16, 1, 32, 7);
  // 0: fine; 1: a bad page at entry 1 (tokens 16..31, read); 2: q longer than kv;
  // 3: kv beyond its table; 4: a bad page before the window (not read); 5: empty.
  Batch b = make_batch(f, {{4, 40}, {3, 40}, {9, 8}, {2, 20}, {2, 64}, {0, 10}}, 2, 8);
  b.stride = 4;
  std::vector<int32_t> table;
  for (int64_t s = 0; s < 6; ++s) table.insert(table.end(), {int32_t(4 * (s % 4)), int32_t(4 * (s % 4) + 1), 2, 3});
  table[1 * 4 + 1] = 16;   // sequence 1, entry 1: no such page
  table[4 * 4 + 0] = -1;   // sequence 4, entry 0: tokens 0..15, before its window
  b.table = table;
  b.kv_lens[3] = 4 * 16 + 1;
  PrefillArgs a = b.args(f);
  a.window = 10;  // sequence 4 reads from position 64 - 2 - 10 + 1 = 53 on
  DeviceStatus st;
  a.status = &st;
  const PrefillResult r = prefill_attention(f.valid, f.cache.buffers, a);
  EXPECT_EQ(st.bad_pages, 16u);
  EXPECT_EQ(st.bad_lengths, 2u);
  const auto row_nan = [&](int64_t row) { return std::isnan(r.out[size_t(row * a.q_heads * 32)]); };
  for (int64_t s = 0; s < 6; ++s)
    for (int32_t row = b.cu_q[size_t(s)]; row < b.cu_q[size_t(s) + 1]; ++row)
      EXPECT_EQ(row_nan(row), s == 1 || s == 2 || s == 3) << "sequence " << s << " row " << row;
  // A q length above max_q_len is a bad length too.
  a.max_q_len = 3;
  st = {};
  (void)prefill_attention(f.valid, f.cache.buffers, a);
  EXPECT_EQ(st.bad_lengths, 3u);  // sequence 0 (4 > 3) joins 2 (counted once) and 3
}

TEST(PrefillReference, RejectsBadArguments) {
  const Filled f("nvfp4kv-native", 4, 16, 2, 64, 9);
  const Batch b = make_batch(f, {{3, 20}}, 4, 10);
  const auto problem = [&](auto mutate) {
    PrefillArgs a = b.args(f);
    mutate(a);
    return prefill_problem(f.valid, f.cache.buffers, a);
  };
  EXPECT_EQ(problem([](PrefillArgs&) {}), "");
  EXPECT_NE(problem([](PrefillArgs& a) { a.cu_seqlens_q = nullptr; }).find("cu_seqlens_q"), std::string::npos);
  EXPECT_NE(problem([](PrefillArgs& a) { a.max_q_len = -1; }).find("max_q_len"), std::string::npos);
  EXPECT_NE(problem([](PrefillArgs& a) { a.q_heads = 5; }).find("multiple"), std::string::npos);
  EXPECT_NE(problem([](PrefillArgs& a) { a.q_heads = 34; }).find("at most 16"), std::string::npos);
  EXPECT_NE(problem([](PrefillArgs& a) { a.softmax_scale = 0; }).find("softmax_scale"), std::string::npos);
  EXPECT_NE(problem([](PrefillArgs& a) { a.window = -2; }).find("window"), std::string::npos);
  EXPECT_NE(problem([](PrefillArgs& a) { a.q = nullptr; }).find("query"), std::string::npos);
  EXPECT_NE(problem([](PrefillArgs& a) { a.batch.seq_lens = nullptr; }).find("lengths are required"), std::string::npos);
  PrefillArgs a = b.args(f);
  a.cu_seqlens_q = nullptr;
  EXPECT_THROW(prefill_attention(f.valid, f.cache.buffers, a), ArgumentError);
}

}  // namespace
}  // namespace nvfp4kv::reference
