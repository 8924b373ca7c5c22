#include "nvfp4kv/harness/workload.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "nvfp4kv/core/error.hpp"

namespace nvfp4kv::harness {

std::vector<uint16_t> Rows::dense(bool keys, int64_t row) const {
  const std::vector<uint16_t>& src = keys ? k : v;
  std::vector<uint16_t> out(size_t(tokens * row));
  for (int64_t t = 0; t < tokens; ++t)
    std::copy_n(src.begin() + t * stride, row, out.begin() + t * row);
  return out;
}

Rows make_rows(const CacheDims& d, int64_t tokens, ElementType type, RowPattern pattern, uint64_t seed,
               int64_t stride_pad) {
  Rows r;
  r.tokens = tokens;
  r.type = type;
  r.stride = d.heads * d.head_dim + stride_pad;
  r.k.assign(size_t(tokens * r.stride), 0xFFFF);  // padding between rows: NaN, never read
  r.v = r.k;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.5f, 1.0f);
  const auto conv = [&](float x) { return type == ElementType::kBFloat16 ? float_to_bf16(x) : float_to_fp16(x); };
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t e = 0; e < d.heads * d.head_dim; ++e) {
      const float g = float((e % d.head_dim) / 16 + 1);
      const bool structured = pattern == RowPattern::kStructured;
      const float kx = structured ? (rng() & 1 ? -g : g) * u(rng) : n(rng) * 3.0f;
      const float vx = structured ? (rng() & 1 ? -g : g) * u(rng) * 0.5f : n(rng) * std::exp(n(rng));
      const uint16_t kb = conv(kx), vb = conv(vx);
      r.k[size_t(t * r.stride + e)] = kb;
      r.v[size_t(t * r.stride + e)] = vb;
      const auto back = [&](uint16_t b) { return type == ElementType::kBFloat16 ? bf16_to_float(b) : fp16_to_float(b); };
      r.k_amax = std::max(r.k_amax, std::fabs(back(kb)));
      r.v_amax = std::max(r.v_amax, std::fabs(back(vb)));
    }
  return r;
}

std::vector<int64_t> paged_slots(const CacheDims& d, int64_t tokens, uint64_t seed, bool edge_cases) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> pages(size_t(d.pages));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  std::vector<int64_t> s;
  for (int64_t i = 0; i < tokens; ++i)
    s.push_back(pages[size_t((i / d.tokens_per_page) % d.pages)] * d.tokens_per_page + i % d.tokens_per_page);
  if (edge_cases && tokens > 3) {
    s[1] = -1;
    s[2] = d.pages * d.tokens_per_page;
    // The last slot, unless the shuffled pages already hold it: one slot, one row
    // (which of two rows lands in a duplicated slot is unspecified).
    const int64_t last = d.pages * d.tokens_per_page - 1;
    if (std::find(s.begin(), s.end(), last) == s.end()) s.push_back(last);
  }
  return s;
}

std::vector<int32_t> pages_of(const CacheDims& d, const std::vector<int64_t>& slots) {
  std::vector<int32_t> table;
  for (int64_t s : slots)
    if (s >= 0 && s < d.pages * d.tokens_per_page &&
        std::find(table.begin(), table.end(), int32_t(s / d.tokens_per_page)) == table.end())
      table.push_back(int32_t(s / d.tokens_per_page));
  return table;
}

std::vector<float> realistic_kv(int64_t tokens, int64_t heads, int64_t dim, bool keys, uint64_t seed,
                                int64_t sink_tokens) {
  std::mt19937_64 rng(seed);
  std::student_t_distribution<float> t(4.0f);
  std::lognormal_distribution<float> spread(0.0f, 0.5f);
  std::vector<float> channel(size_t(heads * dim));
  for (float& c : channel) c = spread(rng);
  if (keys)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t c : {3 % dim, 37 % dim, 70 % dim, 101 % dim}) channel[size_t(h * dim + c)] *= 12.0f;
  std::vector<float> x(size_t(tokens * heads * dim));
  for (size_t i = 0; i < x.size(); ++i) x[i] = t(rng) * channel[i % channel.size()] * (keys ? 1.0f : 0.5f);
  std::uniform_real_distribution<float> big(10000.0f, 40000.0f);
  for (int64_t s = 0; s < std::min(sink_tokens, tokens); ++s)
    for (int64_t e = 0; e < heads * dim; e += 7) x[size_t(s * heads * dim + e)] = (rng() & 1 ? -1.0f : 1.0f) * big(rng);
  return x;
}

std::vector<std::vector<uint8_t>> random_cache(const ValidLayout& valid, int64_t layer, uint64_t seed, uint8_t fill) {
  const Layout& l = valid.layout();
  const CacheDims& d = l.dims;
  std::vector<std::vector<uint8_t>> bytes;
  for (const Buffer& b : l.buffers) bytes.emplace_back(size_t(b.bytes), fill);
  std::mt19937_64 rng(seed);
  for (Region r : kAllRegions) {
    std::vector<uint8_t>& buf = bytes[size_t(l.region(r).buffer)];
    for (Coord c{layer, 0, 0, 0, 0}; c.page < d.pages; ++c.page)
      for (c.head = 0; c.head < d.heads; ++c.head)
        for (c.token = 0; c.token < d.tokens_per_page; ++c.token)
          for (c.column = 0; c.column < d.columns(r); ++c.column) {
            const uint64_t x = rng();
            uint8_t v = uint8_t(x);
            if (is_scale(r) || d.fp8(side_of(r))) {
              const uint32_t pick = uint32_t(x >> 8) % 64;
              // E4M3 codes: exponent field 3..11 (2^-4 .. 2^4) any mantissa; 1 in 64 zero, 1 in 64 subnormal.
              v = pick == 0 ? 0 : pick == 1 ? uint8_t(1 + (x >> 16) % 7) : uint8_t(((3 + (x >> 16) % 9) << 3) | ((x >> 24) & 7));
              if (!is_scale(r)) v = uint8_t(v | (x & 0x80));  // FP8 elements: either sign
            }
            buf[size_t(l.offset(r, c))] = v;
          }
  }
  return bytes;
}

int64_t poison_unread_slots(const ValidLayout& valid, int64_t layer, const std::vector<int32_t>& table, int64_t stride,
                            const std::vector<int32_t>& lengths, std::vector<std::vector<uint8_t>>& bytes) {
  const Layout& l = valid.layout();
  const CacheDims& d = l.dims;
  const int64_t n = d.tokens_per_page;
  std::vector<bool> read(size_t(d.pages * n), false);
  for (size_t b = 0; b < lengths.size(); ++b)
    for (int64_t t = 0; t < lengths[b]; ++t) {
      if (t / n >= stride) break;  // past the sequence's table row: nothing read
      const size_t entry = b * size_t(stride) + size_t(t / n);
      if (entry >= table.size()) break;
      const int64_t page = table[entry];
      if (page >= 0 && page < d.pages) read[size_t(page * n + t % n)] = true;
    }
  int64_t poisoned = 0;
  for (int64_t slot = 0; slot < d.pages * n; ++slot) {
    if (read[size_t(slot)]) continue;
    ++poisoned;
    for (Region r : kAllRegions) {
      if (!is_scale(r) && !d.fp8(side_of(r))) continue;  // NVFP4 codes are all finite
      std::vector<uint8_t>& buf = bytes[size_t(l.region(r).buffer)];
      for (Coord c{layer, slot / n, slot % n, 0, 0}; c.head < d.heads; ++c.head)
        for (c.column = 0; c.column < d.columns(r); ++c.column) buf[size_t(l.offset(r, c))] = 0x7F;
    }
  }
  return poisoned;
}

CacheFormat random_format(int64_t kv_heads, int64_t head_dim, int64_t k_rotation, int64_t v_rotation, bool mean,
                          uint64_t seed, bool channel_scale) {
  CacheFormat f;
  if (k_rotation != kNoRotation || v_rotation != kNoRotation) {
    f.layers = {LayerFormat{}};
    f.layers[0].k.rotation = k_rotation;
    f.layers[0].v.rotation = v_rotation;
  }
  if (mean) {
    std::mt19937 rng{uint32_t(seed)};
    std::normal_distribution<float> n(0.0f, 2.0f);
    f.k_mean.resize(size_t(kv_heads * head_dim));
    for (float& m : f.k_mean) m = n(rng);
  }
  if (channel_scale) {
    // 2^e x {1, 1.25, 1.5, 1.75}: three significant bits, so a BF16 query times lambda is exact
    // in FP16 (the tensor cores' operand) and the tests see lambda's arithmetic, not rounding.
    std::mt19937 rng{uint32_t(seed) ^ 0x9E3779B9u};
    std::uniform_int_distribution<int> e(-2, 1), m(0, 3);
    f.k_channel_scale.resize(size_t(kv_heads * head_dim));
    for (float& x : f.k_channel_scale) x = std::ldexp(1.0f + 0.25f * float(m(rng)), e(rng));
  }
  return f;
}

std::optional<CacheFormat> random_format_over(ElementFormat k, ElementFormat v, int64_t kv_heads, int64_t head_dim,
                                              int64_t k_rotation, int64_t v_rotation, bool mean, uint64_t seed,
                                              bool channel_scale) {
  if (k_rotation == kNoRotation && v_rotation == kNoRotation && !mean && !channel_scale) return std::nullopt;
  CacheFormat f = random_format(kv_heads, head_dim, k_rotation, v_rotation, mean, seed, channel_scale);
  for (LayerFormat& layer : f.layers) layer.k.element = k, layer.v.element = v;
  return f;
}

CacheFormat transform_format(const std::string& transforms, int64_t kv_heads, int64_t head_dim, uint64_t seed) {
  bool rotate_k = false, rotate_v = false, smooth_k = false, scale_k = false, fp8_k = false, fp8_v = false;
  if (transforms != "plain")
    for (size_t at = 0; at <= transforms.size();) {
      const size_t end = std::min(transforms.find('+', at), transforms.size());
      const std::string word = transforms.substr(at, end - at);
      bool* flag = word == "rotate-k" ? &rotate_k
                   : word == "rotate-v" ? &rotate_v
                   : word == "smooth-k" ? &smooth_k
                   : word == "scale-k"  ? &scale_k
                   : word == "fp8-k"    ? &fp8_k
                   : word == "fp8-v"    ? &fp8_v
                                        : nullptr;
      if (!flag)
        throw ArgumentError("transform \"" + transforms + "\": \"" + word +
                            "\" is none of rotate-k, rotate-v, smooth-k, scale-k, fp8-k, fp8-v (joined by '+'), or plain");
      if (*flag) throw ArgumentError("transform \"" + transforms + "\" names " + word + " twice");
      *flag = true;
      at = end + 1;
    }
  CacheFormat f = random_format(kv_heads, head_dim, rotate_k ? kRotateWholeHead : kNoRotation,
                                rotate_v ? kRotateWholeHead : kNoRotation, smooth_k, seed, scale_k);
  if (fp8_k || fp8_v) {
    if (f.layers.empty()) f.layers.resize(1);
    if (fp8_k) f.layers[0].k.element = ElementFormat::kFp8E4M3;
    if (fp8_v) f.layers[0].v.element = ElementFormat::kFp8E4M3;
  }
  return f;
}

}  // namespace nvfp4kv::harness
