#include "nvfp4kv/conformance/kit.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "nvfp4kv/reference/attention.hpp"
#include "nvfp4kv/reference/cache.hpp"

namespace nvfp4kv::conformance {

__extension__ typedef __int128 i128;

namespace {

// 1.75 * 2^-k: reciprocals of these round back to something else
// (1 / float(1 / 1.75) != 1.75 in float), which is where the reciprocal-multiply
// writer parts from nvfp4kv's; and with three significant bits every value stays
// within bf16's eight.
constexpr float kKGlobalScale = 0.4375f, kVGlobalScale = 0.21875f;

// Bounds that keep a kit a few seconds and a few hundred MiB of work.
constexpr int64_t kMaxCacheBytes = int64_t(16) << 20;
constexpr int64_t kMaxTokens = 16384;
constexpr int64_t kMaxElements = int64_t(1) << 24;  // rows x heads x D per side

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// a * x + c modulo m, a bijection of [0, m) when gcd(a, m) = 1.
uint64_t affine_mod(uint64_t x, uint64_t a, uint64_t c, uint64_t m) {
  return uint64_t((i128(x) * a + c) % m);
}

uint64_t coprime_multiplier(uint64_t m, uint64_t start, std::initializer_list<uint64_t> primes) {
  uint64_t a = start % m;
  for (;; ++a) {
    bool ok = a > 1;
    for (uint64_t p : primes) ok = ok && a % p != 0;
    if (ok) return a;
  }
}

// The codes a key digit takes: the 15 E2M1 codes other than -0.
uint8_t digit_code(uint64_t d) { return uint8_t(d < 8 ? d : d + 1); }

constexpr uint64_t kDigitSpace = 1946195068359375ull;  // 15^13: thirteen base-15 digits

uint8_t marker_code(uint64_t i) { return uint8_t((11u << 3) | (2u * (i % 4))); }       // 16, 20, 24, 28
uint8_t other_code(uint64_t i) { return uint8_t(((4u + i / 4) << 3) | (2u * (i % 4))); }  // 2^-3 .. 1.75 * 2^3

// The 16 E2M1 codes of a block (element 15 without its probe).
std::array<uint8_t, kBlockSize> signature_codes(uint64_t block) {
  std::array<uint8_t, kBlockSize> c{};
  c[0] = 7;  // +6: the block maximum
  uint64_t y = affine_mod(block, coprime_multiplier(kDigitSpace, 0x5851F42D4C957F2Dull, {3, 5}), 0x14057B7EF767814Full % kDigitSpace,
                          kDigitSpace);
  for (int i = 1; i <= 13; ++i, y /= 15) c[size_t(i)] = digit_code(y % 15);
  const uint64_t h = mix(block ^ 0xA5A5A5A5ull);
  c[14] = digit_code(h % 15);
  c[15] = digit_code((h >> 8) % 15);
  return c;
}

bool probe_block(uint64_t block) { return (mix(block + 77) & 7u) == 0; }

uint16_t to_16bit(float x, ElementType t) { return t == ElementType::kFloat16 ? float_to_fp16(x) : float_to_bf16(x); }
float from_16bit(uint16_t b, ElementType t) { return t == ElementType::kFloat16 ? fp16_to_float(b) : bf16_to_float(b); }

// Per scale code: the signed tie values m (x = m * scale * gs sits exactly on an
// E2M1 tie, exact in the element type) at which some policy stores element 15
// unlike nvfp4kv's.
std::vector<float> probe_ties(uint8_t scale, float gs, ElementType type) {
  std::vector<float> out;
  const float sf = e4m3_decode(scale);
  for (float m : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f})
    for (float sign : {1.0f, -1.0f}) {
      const float x = sign * m * sf * gs;
      if (from_16bit(to_16bit(x, type), type) != x) continue;
      float block[kBlockSize] = {};
      block[0] = 6.0f * sf * gs;
      block[15] = x;
      const QuantizedBlock q0 = quantize_block_as(RoundingPolicy::kNvfp4kv, block, gs);
      bool differs = false;
      for (RoundingPolicy p : {RoundingPolicy::kReciprocalMultiply, RoundingPolicy::kFastMathDivision})
        differs |= quantize_block_as(p, block, gs).packed[7] != q0.packed[7];
      if (differs) out.push_back(sign * m);
    }
  return out;
}

void require(bool ok, const std::string& why) {
  if (!ok) throw ArgumentError("kit: " + why);
}

// The inverse of the n x n matrix a (Gauss-Jordan with partial pivoting), or
// nothing when it is singular to working precision.
std::optional<std::vector<double>> inverse(std::vector<double> a, int64_t n) {
  std::vector<double> inv(size_t(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i) inv[size_t(i * n + i)] = 1;
  double scale = 0;
  for (double x : a) scale = std::max(scale, std::fabs(x));
  for (int64_t c = 0; c < n; ++c) {
    int64_t p = c;
    for (int64_t r = c + 1; r < n; ++r)
      if (std::fabs(a[size_t(r * n + c)]) > std::fabs(a[size_t(p * n + c)])) p = r;
    if (!(std::fabs(a[size_t(p * n + c)]) > 1e-12 * scale)) return std::nullopt;
    for (int64_t k = 0; k < n; ++k) {
      std::swap(a[size_t(c * n + k)], a[size_t(p * n + k)]);
      std::swap(inv[size_t(c * n + k)], inv[size_t(p * n + k)]);
    }
    const double d = a[size_t(c * n + c)];
    for (int64_t k = 0; k < n; ++k) {
      a[size_t(c * n + k)] /= d;
      inv[size_t(c * n + k)] /= d;
    }
    for (int64_t r = 0; r < n; ++r) {
      if (r == c || a[size_t(r * n + c)] == 0) continue;
      const double f = a[size_t(r * n + c)];
      for (int64_t k = 0; k < n; ++k) {
        a[size_t(r * n + k)] -= f * a[size_t(c * n + k)];
        inv[size_t(r * n + k)] -= f * inv[size_t(c * n + k)];
      }
    }
  }
  return inv;
}

}  // namespace

bool is_row_marker(uint8_t code) { return (code >> 3) == 11u && (code & 1u) == 0; }

uint8_t signature_scale(const CacheDims& d, int64_t row_id, int64_t group) {
  // Mixed radix: group 0 a digit of 4 (a marker), groups 1..11 digits of 28; groups
  // past 11 (D > 192) add nothing a row needs to be told apart and take hashed digits.
  const int64_t varying = std::min<int64_t>(d.scale_bytes() - 1, 11);
  uint64_t space = 4;
  for (int64_t i = 0; i < varying; ++i) space *= 28;
  uint64_t y = affine_mod(uint64_t(row_id) % space, coprime_multiplier(space, 0x2545F4914F6CDD1Dull, {2, 7}),
                          0x6A09E667F3BCC909ull % space, space);
  if (group == 0) return marker_code(y % 4);
  y /= 4;
  if (group <= varying) {
    for (int64_t i = 1; i < group; ++i) y /= 28;
    return other_code(y % 28);
  }
  return other_code(mix(uint64_t(row_id) * 131 + uint64_t(group)) % 28);
}

int64_t Kit::block_count() const { return rows * dims().heads * 2 * dims().scale_bytes(); }

int64_t Kit::block_index(const BlockId& b) const {
  return ((b.row * dims().heads + b.head) * 2 + int64_t(b.side)) * dims().scale_bytes() + b.group;
}

BlockId Kit::block(int64_t i) const {
  const int64_t sd = dims().scale_bytes();
  BlockId b;
  b.group = i % sd;
  i /= sd;
  b.side = Side(i % 2);
  i /= 2;
  b.head = i % dims().heads;
  b.row = i / dims().heads;
  return b;
}

void Kit::block_values(const BlockId& b, float* x) const {
  const std::vector<uint16_t>& src = b.side == Side::kK ? k : v;
  const int64_t base = (b.row * dims().heads + b.head) * dims().head_dim + b.group * kBlockSize;
  for (int e = 0; e < kBlockSize; ++e) x[e] = from_16bit(src[size_t(base + e)], options.type);
}

std::optional<std::pair<int64_t, int64_t>> Kit::cell(int64_t row) const {
  const int64_t s = slots[size_t(row)];
  if (s < 0) return std::nullopt;
  return std::pair{s / dims().tokens_per_page, s % dims().tokens_per_page};
}

Kit generate(const ValidLayout& valid, const KitOptions& opt) {
  const Layout& l = valid.layout();
  const CacheDims& d = l.dims;
  Kit kit;
  kit.options = opt;
  kit.valid = valid;
  require(opt.type == ElementType::kBFloat16 || opt.type == ElementType::kFloat16, "rows are bf16 or fp16");
  // The signatures are found in the engine's bytes as standard-order codes (check_read and
  // trace search for them byte by byte), so a kit needs a layout whose data bytes keep that order.
  require(l.codes.is_standard(), "layout " + quote_text(l.name) + " keeps a data byte's codes in the " +
                                     code_order_text(l.codes) +
                                     " order; conformance kits cover the standard order only so far");
  // The signatures are NVFP4 blocks: a block scale and E2M1 codes designed together.
  require(!d.fp8(Side::kK) && !d.fp8(Side::kV),
          "layout " + quote_text(l.name) + " holds " + (d.fp8(Side::kK) ? "K" : "V") +
              " as fp8_e4m3; conformance kits cover NVFP4 pages only so far (their signatures are NVFP4 blocks)");
  require(opt.layer >= 0 && opt.layer < d.layers,
          "layer " + std::to_string(opt.layer) + " is outside the layout's [0, " + std::to_string(d.layers) + ")");
  // The signatures are designed in the stored codes of the standard rule: a transform or 4over6
  // between the rows and the codes would rewrite them, so kits cover plain NVFP4 only.
  // mu and lambda are the cache's, so a format without per-layer entries can carry them too.
  {
    const CacheFormat& f = valid.format();
    const LayerFormat lf = f.layer(opt.layer);
    require(f.plain_nvfp4(opt.layer) && lf.k.rule == ScaleRule::kStandard && lf.v.rule == ScaleRule::kStandard,
            "the layout's format transforms layer " + std::to_string(opt.layer) +
                " (FP8, a rotation, K smoothing, K's channel scale or 4over6); conformance kits cover plain NVFP4 "
                "with the standard rule only so far");
  }
  int64_t cache_bytes = 0;
  for (const Buffer& b : l.buffers) cache_bytes += b.bytes;
  require(cache_bytes <= kMaxCacheBytes, "the cache's buffers hold " + std::to_string(cache_bytes) +
                                             " bytes, more than a kit's 16 MiB; use fewer pages, heads or layers");
  require(opt.tokens >= 0 && opt.q_heads >= 0, "tokens and q_heads are counts (0 picks the default), got " +
                                                  std::to_string(opt.tokens) + " and " + std::to_string(opt.q_heads));
  const int64_t capacity = d.pages * d.tokens_per_page;
  const int64_t tokens = opt.tokens > 0 ? opt.tokens : std::max<int64_t>(1, std::min<int64_t>(capacity / 2, 512));
  require(tokens >= 1 && tokens <= kMaxTokens,
          "--tokens must be in [1, " + std::to_string(kMaxTokens) + "], got " + std::to_string(tokens));
  require(tokens * d.heads * d.head_dim <= kMaxElements,
          std::to_string(tokens) + " tokens x " + std::to_string(d.heads) + " heads x head dim " +
              std::to_string(d.head_dim) + " is more than 2^24 elements; lower --tokens");
  kit.q_heads = opt.q_heads > 0 ? opt.q_heads : d.heads;
  require(kit.q_heads % d.heads == 0 && kit.q_heads / d.heads <= 16,
          "--q-heads must be a multiple of the " + std::to_string(d.heads) + " kv heads, at most 16 per kv head; got " +
              std::to_string(kit.q_heads));
  kit.k_global_scale = kKGlobalScale;
  kit.v_global_scale = kVGlobalScale;
  std::mt19937_64 rng(opt.seed);

  // Sequences of at most D/2 tokens (so a probe's query can single one out) and
  // four pages, over shuffled pages; the last page of most is partly filled.
  const int64_t longest = std::max<int64_t>(1, std::min(d.head_dim / 2, 4 * d.tokens_per_page));
  std::vector<int64_t> lengths;
  for (int64_t left = tokens; left > 0;) {
    const int64_t len = std::min(left, (longest + 1) / 2 + int64_t(rng() % uint64_t(longest - (longest + 1) / 2 + 1)));
    lengths.push_back(len);
    left -= len;
  }
  int64_t pages_needed = 0;
  for (int64_t len : lengths) pages_needed += (len + d.tokens_per_page - 1) / d.tokens_per_page;
  require(pages_needed <= d.pages,
          std::to_string(tokens) + " tokens in sequences of at most " + std::to_string(longest) + " need " +
              std::to_string(pages_needed) + " pages of " + std::to_string(d.tokens_per_page) + " tokens; the cache has " +
              std::to_string(d.pages) + ": lower --tokens or raise --pages");
  std::vector<int32_t> pages(size_t(d.pages));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  size_t next_page = 0;
  int64_t read_row = 0;
  for (int64_t len : lengths) {
    KitSequence s;
    s.length = len;
    s.first_read_row = read_row;
    read_row += len;
    for (int64_t p = 0; p < (len + d.tokens_per_page - 1) / d.tokens_per_page; ++p) s.pages.push_back(pages[next_page++]);
    kit.sequences.push_back(std::move(s));
  }

  // Input rows: the sequences in order, a padding row (slot -1) first, after every
  // 13 stored rows and two at the end, as a batch padded for a CUDA graph has them.
  kit.read_rows.assign(size_t(tokens), -1);
  const auto add_row = [&](int64_t slot, int64_t seq, int64_t pos) {
    kit.slots.push_back(slot);
    kit.row_sequence.push_back(seq);
    kit.row_position.push_back(pos);
  };
  add_row(-1, -1, -1);
  int64_t stored = 0;
  for (size_t s = 0; s < kit.sequences.size(); ++s) {
    const KitSequence& seq = kit.sequences[s];
    for (int64_t t = 0; t < seq.length; ++t) {
      kit.read_rows[size_t(seq.first_read_row + t)] = int64_t(kit.slots.size());
      add_row(int64_t(seq.pages[size_t(t / d.tokens_per_page)]) * d.tokens_per_page + t % d.tokens_per_page, int64_t(s), t);
      if (++stored % 13 == 0) add_row(-1, -1, -1);
    }
  }
  add_row(-1, -1, -1);
  add_row(-1, -1, -1);
  kit.rows = int64_t(kit.slots.size());

  // The rows' values: each block's signature times its scale and global scale.
  const int64_t sd = d.scale_bytes(), row_elems = d.heads * d.head_dim;
  kit.k.assign(size_t(kit.rows * row_elems), 0);
  kit.v = kit.k;
  std::array<std::vector<std::vector<float>>, 2> ties;  // per side, per scale code
  for (Side side : {Side::kK, Side::kV}) {
    ties[size_t(side)].resize(256);
    for (int c = 0; c < 256; ++c)
      if ((c >> 3) >= 4 && (c >> 3) <= 11 && c % 2 == 0)
        ties[size_t(side)][size_t(c)] = probe_ties(uint8_t(c), kit.global_scale(side), opt.type);
  }
  const int64_t row_ids = kit.rows * d.heads * 2;
  uint64_t space = 4;
  for (int64_t i = 0; i < std::min<int64_t>(sd - 1, 11); ++i) space *= 28;
  kit.scale_rows_unique = uint64_t(row_ids) <= space;
  for (int64_t b = 0; b < kit.block_count(); ++b) {
    const BlockId id = kit.block(b);
    const float gs = kit.global_scale(id.side);
    const uint8_t scale = signature_scale(d, (id.row * d.heads + id.head) * 2 + int64_t(id.side), id.group);
    const float sf = e4m3_decode(scale);
    const auto codes = signature_codes(uint64_t(b));
    std::vector<uint16_t>& dst = id.side == Side::kK ? kit.k : kit.v;
    const int64_t base = (id.row * d.heads + id.head) * d.head_dim + id.group * kBlockSize;
    for (int e = 0; e < kBlockSize; ++e) dst[size_t(base + e)] = to_16bit(e2m1_decode(codes[size_t(e)]) * sf * gs, opt.type);
    const std::vector<float>& t = ties[size_t(id.side)][scale];
    if (probe_block(uint64_t(b)) && !t.empty()) {
      dst[size_t(base + 15)] = to_16bit(t[mix(uint64_t(b)) % t.size()] * sf * gs, opt.type);
      kit.probe_blocks += kit.cell(id.row).has_value();
    }
  }

  // The reference store through the layout.
  {
    reference::HostCache cache(l, kPoison);
    StoreArgs s;
    s.rows = {kit.k.data(), kit.v.data(), kit.rows, row_elems};
    s.type = opt.type;
    s.slots = kit.slots.data();
    s.slots_are_int64 = true;
    s.layer = opt.layer;
    s.k_global_scale = &kit.k_global_scale;
    s.v_global_scale = &kit.v_global_scale;
    reference::store(valid, cache.buffers, s);
    kit.cache = std::move(cache.storage);
  }
  // The signatures survived quantization (a check of this file, not of the layout),
  // and what each policy would store differently.
  for (int64_t b = 0; b < kit.block_count(); ++b) {
    const BlockId id = kit.block(b);
    float x[kBlockSize];
    kit.block_values(id, x);
    const QuantizedBlock q = quantize_block_as(RoundingPolicy::kNvfp4kv, x, kit.global_scale(id.side));
    const auto codes = signature_codes(uint64_t(b));
    bool ok = q.scale == signature_scale(d, (id.row * d.heads + id.head) * 2 + int64_t(id.side), id.group);
    for (int e = 0; e < 15; ++e) ok = ok && ((q.packed[e / 2] >> (4 * (e % 2))) & 15u) == codes[size_t(e)];
    if (!ok) throw Error("kit: block " + std::to_string(b) + " lost its signature in quantization (a bug in nvfp4kv)");
    if (!kit.cell(id.row)) continue;
    for (RoundingPolicy p : {RoundingPolicy::kReciprocalMultiply, RoundingPolicy::kFastMathDivision}) {
      const QuantizedBlock o = quantize_block_as(p, x, kit.global_scale(id.side));
      int64_t n = o.scale != q.scale;
      for (int j = 0; j < kBlockSize / 2; ++j) n += o.packed[j] != q.packed[j];
      kit.bytes_differing[size_t(p)] += n;
    }
  }

  // The reader's expected rows: the sequences gathered through the layout.
  const int64_t batch = int64_t(kit.sequences.size());
  size_t widest = 1;
  for (const KitSequence& s : kit.sequences) widest = std::max(widest, s.pages.size());
  std::vector<int32_t> table(size_t(batch) * widest, -1), cu(size_t(batch + 1), 0);
  for (int64_t s = 0; s < batch; ++s) {
    std::copy(kit.sequences[size_t(s)].pages.begin(), kit.sequences[size_t(s)].pages.end(), table.begin() + s * int64_t(widest));
    cu[size_t(s + 1)] = int32_t(kit.sequences[size_t(s)].first_read_row + kit.sequences[size_t(s)].length);
  }
  CacheBuffers buffers;
  for (size_t i = 0; i < kit.cache.size(); ++i) buffers.ptr[i] = kit.cache[i].data();
  buffers.count = int(kit.cache.size());
  kit.read_k.assign(size_t(tokens * row_elems), 0);
  kit.read_v = kit.read_k;
  {
    GatherArgs g;
    g.batch = {.block_table = table.data(), .block_table_stride = int64_t(widest), .cu_seqlens = cu.data(), .batch = batch};
    g.layer = opt.layer;
    g.k_global_scale = &kit.k_global_scale;
    g.v_global_scale = &kit.v_global_scale;
    g.out_type = ElementType::kFloat32;
    g.k_out = kit.read_k.data();
    g.v_out = kit.read_v.data();
    reference::gather(valid, buffers, g);
  }

  // Attention probes: for each stored token, a query per q-head whose logits are
  // Z at that token and 0 at the others of its sequence, solved in the span of the
  // sequence's K rows (at most D/2 of them), then rounded to the element type.
  const int64_t group = kit.q_heads / d.heads, D = d.head_dim;
  kit.softmax_scale = float(1.0 / std::sqrt(double(D)));
  kit.q.assign(size_t(tokens * kit.q_heads * D), 0);
  kit.probe_isolates.assign(size_t(tokens * kit.q_heads), 0);
  constexpr double kTarget = 2 * kProbeMargin;
  for (int64_t s = 0; s < batch; ++s) {
    const KitSequence& seq = kit.sequences[size_t(s)];
    const int64_t L = seq.length;
    for (int64_t t = 0; t < L; ++t) {
      kit.probe_sequence.push_back(int32_t(s));
      kit.probe_position.push_back(int32_t(t));
    }
    for (int64_t kh = 0; kh < d.heads; ++kh) {
      const auto key = [&](int64_t t, int64_t e) {
        return double(kit.read_k[size_t(((seq.first_read_row + t) * d.heads + kh) * D + e)]);
      };
      std::vector<double> gram(size_t(L * L));
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < L; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < D; ++e) dot += key(i, e) * key(j, e);
          gram[size_t(i * L + j)] = dot;
        }
      const auto inv = inverse(gram, L);  // the query for token t is K^T (K K^T)^-1 e_t Z / scale
      const bool solved = inv.has_value();
      for (int64_t t = 0; t < L; ++t) {
        std::vector<uint16_t> q(size_t(D), 0);
        for (int64_t e = 0; e < D && solved; ++e) {
          double x = 0;
          for (int64_t i = 0; i < L; ++i) x += (*inv)[size_t(i * L + t)] * key(i, e);
          q[size_t(e)] = to_16bit(float(x * kTarget / double(kit.softmax_scale)), opt.type);
        }
        // The margin with the rounded query, in fp64 as the reference computes it.
        double mine = 0, others = -1e300;
        for (int64_t i = 0; i < L; ++i) {
          double dot = 0;
          for (int64_t e = 0; e < D; ++e) dot += double(from_16bit(q[size_t(e)], opt.type)) * key(i, e);
          const double logit = dot * double(kit.softmax_scale);
          if (i == t) mine = logit;
          else others = std::max(others, logit);
        }
        const bool isolates = solved && (L == 1 || mine - others >= kProbeMargin) && std::isfinite(mine);
        const int64_t b = seq.first_read_row + t;
        for (int64_t g = 0; g < group; ++g) {
          const int64_t hq = kh * group + g;
          std::copy(q.begin(), q.end(), kit.q.begin() + (b * kit.q_heads + hq) * D);
          kit.probe_isolates[size_t(b * kit.q_heads + hq)] = isolates;
        }
      }
    }
  }
  // What each probe returns: decode attention in fp64 over the cache dequantized through
  // the layout (reference::decode_attention's definition, on the rows gathered above).
  kit.expected_out.assign(kit.q.size(), 0.0f);
  for (const KitSequence& seq : kit.sequences) {
    const int64_t n = seq.length * row_elems;
    const std::vector<double> k(kit.read_k.begin() + seq.first_read_row * row_elems,
                                kit.read_k.begin() + seq.first_read_row * row_elems + n);
    const std::vector<double> v(kit.read_v.begin() + seq.first_read_row * row_elems,
                                kit.read_v.begin() + seq.first_read_row * row_elems + n);
    std::vector<double> q(size_t(kit.q_heads * D)), out(q.size()), lse(size_t(kit.q_heads));
    for (int64_t b = seq.first_read_row; b < seq.first_read_row + seq.length; ++b) {
      for (int64_t i = 0; i < kit.q_heads * D; ++i) q[size_t(i)] = from_16bit(kit.q[size_t(b * kit.q_heads * D + i)], opt.type);
      reference::attend(q.data(), kit.q_heads, k.data(), v.data(), seq.length, d.heads, D, {kit.softmax_scale}, out.data(),
                        lse.data());
      std::copy(out.begin(), out.end(), kit.expected_out.begin() + b * kit.q_heads * D);
    }
  }
  return kit;
}

}  // namespace nvfp4kv::conformance
