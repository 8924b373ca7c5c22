// check-read: what an engine's reader made of nvfp4kv's cache (docs/conformance.md,
// "check-read"). A misread block's 16 outputs are e2m1 x scale x global scale, so
// they give back the scale the reader used and the codes it read; the codes are
// looked up in the cache, and the row of scales too, to name the bytes it read.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "nvfp4kv/conformance/check.hpp"
#include "trace.hpp"

namespace nvfp4kv::conformance {
namespace {

constexpr float kMagnitudes[] = {0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// A way the reader's 16 outputs decompose into a scale and 8 bytes of codes.
struct Decomposition {
  uint8_t scale = 0;
  Pattern bytes;
};

std::vector<Decomposition> decompose(const float* v, float gs) {
  std::vector<Decomposition> out;
  double vmax = 0;
  for (int k = 0; k < kBlockSize; ++k) vmax = std::max(vmax, std::fabs(double(v[k])));
  if (vmax == 0) return out;
  // A scale byte may be negative (a reader that takes a data byte for a scale):
  // then every code's sign is the opposite of its output's.
  for (float m : kMagnitudes)
    for (bool negative : {false, true}) {
      const double target = vmax / (double(m) * double(gs));
      const uint8_t code = uint8_t(e4m3_encode(float(target)) | (negative ? 0x80u : 0u));
      const double sf = std::fabs(double(e4m3_decode(code)));
      // The outputs may have been rounded to bf16: allow a few of its ulps.
      if (!(std::fabs(sf - target) <= target * 0x1p-6) || sf == 0) continue;
      Decomposition dc;
      dc.scale = code;
      dc.bytes.length = 8;
      bool ok = true;
      for (int k = 0; k < kBlockSize && ok; ++k) {
        const double y = double(v[k]) / (sf * double(gs));
        int best = 0;
        for (int i = 1; i < 8; ++i)
          if (std::fabs(std::fabs(y) - e2m1_decode(uint8_t(i))) < std::fabs(std::fabs(y) - e2m1_decode(uint8_t(best)))) best = i;
        const double e = e2m1_decode(uint8_t(best));
        ok = std::fabs(std::fabs(y) - e) <= 0x1p-6 * std::max(e, 0.5);
        const uint8_t nib = uint8_t(best | ((std::signbit(v[k]) != negative) ? 8 : 0));
        dc.bytes.bytes[size_t(k / 2)] |= uint8_t(nib << (4 * (k % 2)));
      }
      if (!ok) continue;
      bool seen = false;
      for (const Decomposition& o : out) seen |= o.scale == dc.scale;
      if (!seen) out.push_back(dc);
    }
  return out;
}

// Both nibbles with -0 (8) read as +0: a reader may or may not keep the sign of a zero.
std::array<uint8_t, 256> zero_sign_blind() {
  std::array<uint8_t, 256> t{};
  for (int b = 0; b < 256; ++b) {
    const int lo = (b & 15) == 8 ? 0 : b & 15, hi = (b >> 4) == 8 ? 0 : b >> 4;
    t[size_t(b)] = uint8_t(lo | hi << 4);
  }
  return t;
}

bool close_to(const float* got, const float* want, int64_t n, double rel) {
  double peak = 0;
  for (int64_t i = 0; i < n; ++i) peak = std::max(peak, std::fabs(double(want[i])));
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return false;
    if (std::fabs(double(got[i]) - double(want[i])) > rel * peak + 0x1p-8 * std::fabs(double(want[i]))) return false;
  }
  return true;
}

struct Candidate {
  int64_t side, read_row, head, group;  // block of the output
  std::vector<Decomposition> ways;
  std::vector<std::vector<Location>> hits;
};

// Traces misread blocks: which 8 bytes each read its codes from and which scale it used,
// then where that row of scales is. `expected` gives the layout's coordinates.
class BlockTracer {
 public:
  BlockTracer(const Kit& kit, const ByteOwners& owners) : kit_(kit), owners_(owners), norm_(zero_sign_blind()) {}

  // blocks: (side, read row, head, group, the 16 outputs)
  void trace(std::vector<BlockRead>& blocks, const std::vector<const float*>& values) {
    const CacheDims& d = kit_.dims();
    const Layout& l = kit_.layout();
    std::vector<Pattern> patterns;
    std::vector<std::vector<Decomposition>> ways(blocks.size());
    std::vector<size_t> first(blocks.size());
    for (size_t i = 0; i < blocks.size(); ++i) {
      BlockRead& b = blocks[i];
      bool finite = true;
      double peak = 0;
      for (int k = 0; k < kBlockSize; ++k) {
        finite = finite && std::isfinite(values[i][k]);
        peak = std::max(peak, std::fabs(double(values[i][k])));
      }
      first[i] = patterns.size();
      if (!finite) {
        b.what = "non-finite";
        continue;
      }
      if (peak == 0) {
        b.what = "zeros";
        continue;
      }
      ways[i] = decompose(values[i], kit_.global_scale(b.side));
      for (const Decomposition& w : ways[i]) patterns.push_back(w.bytes);
    }
    const auto hits = find_patterns(kit_.cache, patterns, norm_.data(), nullptr, 4);
    // Choose per block: found in the cache, once if possible, with the expected scale if tied.
    std::map<std::tuple<int, int64_t, int64_t>, std::vector<size_t>> rows;  // (side, read row, head) -> blocks
    for (size_t i = 0; i < blocks.size(); ++i) {
      BlockRead& b = blocks[i];
      const SideRegions reg = side_regions(b.side);
      const uint8_t want_scale = kit_.cache[size_t(l.region(reg.scale).buffer)][size_t(l.offset(reg.scale, b.cell))];
      int best = -1;
      for (size_t w = 0; w < ways[i].size(); ++w) {
        const auto& h = hits[first[i] + w];
        if (h.empty()) continue;
        const auto rank = [&](int x) {
          const auto& hx = hits[first[i] + size_t(x)];
          return std::tuple{hx.size() == 1, ways[i][size_t(x)].scale == want_scale};
        };
        if (best < 0 || rank(int(w)) > rank(best)) best = int(w);
      }
      rows[{int(b.side), b.read_row, b.head}].push_back(i);
      if (best < 0) {
        if (b.what.empty()) {
          b.what = "unidentified";
          if (!ways[i].empty()) b.scale_code = ways[i][0].scale;
        }
        continue;
      }
      b.scale_code = ways[i][size_t(best)].scale;
      b.data_from = hits[first[i] + size_t(best)].front();
      b.data_owner = owners_.describe_run(*b.data_from, 8);
    }
    // Where each misread row of scales came from: the row's scale codes (the expected
    // ones for its groups read right) looked up at the strides scales are stored at.
    std::vector<Pattern> scale_rows;
    std::vector<std::tuple<int, int64_t, int64_t>> row_keys;
    const int64_t sd = d.scale_bytes();
    const std::vector<int64_t> strides = scale_row_strides(l);
    for (const auto& [key, members] : rows) {
      const auto [side, read_row, head] = key;
      std::vector<int> codes(size_t(sd), -1);
      const int64_t row = kit_.read_rows[size_t(read_row)];
      const auto cell = *kit_.cell(row);
      const SideRegions reg = side_regions(Side(side));
      for (int64_t g = 0; g < sd; ++g)
        codes[size_t(g)] = kit_.cache[size_t(l.region(reg.scale).buffer)][size_t(l.offset(reg.scale, {kit_.options.layer, cell.first, cell.second, head, g}))];
      bool known = true;
      for (size_t i : members) {
        if (blocks[i].scale_code) codes[size_t(blocks[i].group)] = *blocks[i].scale_code;
        else known = false;
      }
      if (!known) continue;
      for (int64_t stride : strides) {
        Pattern p;
        p.length = int(std::min<int64_t>(sd, 8));
        p.stride = stride;
        for (int g = 0; g < p.length; ++g) p.bytes[size_t(g)] = uint8_t(codes[size_t(g)]);
        scale_rows.push_back(p);
        row_keys.push_back(key);
      }
    }
    const auto scale_hits = find_patterns(kit_.cache, scale_rows, nullptr, nullptr, 2);
    std::set<std::tuple<int, int64_t, int64_t>> placed;
    for (size_t i = 0; i < scale_rows.size(); ++i) {
      if (scale_hits[i].size() != 1 || placed.count(row_keys[i])) continue;  // absent or ambiguous
      placed.insert(row_keys[i]);
      for (size_t m : rows[row_keys[i]]) {
        BlockRead& b = blocks[m];
        if (!b.scale_code) continue;
        b.scale_from = Location{scale_hits[i][0].buffer, scale_hits[i][0].byte + b.group * scale_rows[i].stride};
        b.scale_owner = owners_.describe(*b.scale_from);
      }
    }
    // What each block got wrong.
    for (BlockRead& b : blocks) {
      if (!b.what.empty()) continue;
      const SideRegions reg = side_regions(b.side);
      Coord c = b.cell;
      c.column = b.group * 8;
      const Location data_at{l.region(reg.data).buffer, l.offset(reg.data, c)};
      c.column = b.group;
      const Location scale_at{l.region(reg.scale).buffer, l.offset(reg.scale, c)};
      const bool data_wrong = !(b.data_from && *b.data_from == data_at);
      const bool scale_wrong = b.scale_code != kit_.cache[size_t(scale_at.buffer)][size_t(scale_at.byte)] ||
                               (b.scale_from && !(*b.scale_from == scale_at));
      b.what = data_wrong && scale_wrong ? "data and scale" : data_wrong ? "data" : scale_wrong ? "scale" : "unidentified";
      const auto data_owner = b.data_from ? owners_.owner(*b.data_from) : std::nullopt;
      const auto scale_owner = b.scale_from ? owners_.owner(*b.scale_from) : std::nullopt;
      b.aliased = (data_wrong && data_owner && is_scale(data_owner->region)) ||
                  (scale_wrong && scale_owner && !is_scale(scale_owner->region));
    }
  }

 private:
  const Kit& kit_;
  const ByteOwners& owners_;
  std::array<uint8_t, 256> norm_;
};

void tally(SideReadReport& s, const BlockRead& b) {
  ++s.blocks_misread;
  if (b.what == "data and scale" || b.what == "data") ++s.wrong_data;
  if (b.what == "data and scale" || b.what == "scale") ++s.wrong_scale;
  if (b.what != "data and scale" && b.what != "data" && b.what != "scale") ++s.unidentified;
  s.aliased += b.aliased;
}

BlockRead block_at(const Kit& kit, Side side, int64_t read_row, int64_t head, int64_t group) {
  BlockRead b;
  b.side = side;
  b.read_row = read_row;
  b.row = kit.read_rows[size_t(read_row)];
  b.head = head;
  b.group = group;
  const auto cell = *kit.cell(b.row);
  b.cell = {kit.options.layer, cell.first, cell.second, head, group};
  return b;
}

// The reader's map of the regions it misread, from where the traced blocks' bytes
// came from (and, for the blocks it read right, the layout's bytes).
void infer_reader(const Kit& kit, const std::vector<BlockRead>& misread, ReadReport& rep) {
  const Layout& l = kit.layout();
  const CacheDims& d = l.dims;
  std::array<bool, kRegionCount> wrong{};
  std::set<std::tuple<int, int64_t, int64_t, int64_t>> bad;
  for (const BlockRead& b : misread) {
    const SideRegions reg = side_regions(b.side);
    wrong[size_t(reg.data)] = wrong[size_t(reg.data)] || b.what == "data" || b.what == "data and scale";
    wrong[size_t(reg.scale)] = wrong[size_t(reg.scale)] || b.what == "scale" || b.what == "data and scale";
    bad.insert({int(b.side), b.read_row, b.head, b.group});
  }
  std::array<std::vector<Observation>, kRegionCount> obs;
  for (const BlockRead& b : misread) {
    const SideRegions reg = side_regions(b.side);
    if (b.data_from)
      for (int64_t j = 0; j < 8; ++j)
        obs[size_t(reg.data)].push_back({b.cell.page, b.cell.token, b.head, b.group * 8 + j, {b.data_from->buffer, b.data_from->byte + j}});
    if (b.scale_from) obs[size_t(reg.scale)].push_back({b.cell.page, b.cell.token, b.head, b.group, *b.scale_from});
  }
  for (int64_t i = 0; i < int64_t(kit.read_rows.size()); ++i)
    for (Side side : {Side::kK, Side::kV})
      for (int64_t h = 0; h < d.heads; ++h)
        for (int64_t g = 0; g < d.scale_bytes(); ++g) {
          if (bad.count({int(side), i, h, g})) continue;
          const BlockRead b = block_at(kit, side, i, h, g);
          const SideRegions reg = side_regions(side);
          Coord c = b.cell;
          for (int64_t j = 0; j < 8; ++j) {
            c.column = g * 8 + j;
            obs[size_t(reg.data)].push_back({c.page, c.token, h, c.column, {l.region(reg.data).buffer, l.offset(reg.data, c)}});
          }
          c.column = g;
          obs[size_t(reg.scale)].push_back({c.page, c.token, h, g, {l.region(reg.scale).buffer, l.offset(reg.scale, c)}});
        }
  Layout reader = l;
  bool any = false;
  for (Region r : kAllRegions) {
    if (!wrong[size_t(r)]) continue;
    const RegionFit fit = fit_region(obs[size_t(r)], l, r, kit.options.layer);
    rep.reader_maps[size_t(r)] = fit;
    if (fit.fitted) {
      reader.regions[size_t(r)] = fit.map;
      any = true;
    } else {
      rep.not_inferred.push_back(r);
    }
  }
  if (!any) return;
  reader.name = l.name + "-as-read";
  reader.summary = "Where the reader under test took the cache's bytes from, inferred by nvfp4kv conformance check-read";
  rep.differences = map_differences(reader, l);
  reader.provenance = Provenance{"the reader under test", "inferred by nvfp4kv conformance check-read",
                                 "the one the reader's output came from", "reader (inferred)",
                                 {"a conformance kit for \"" + l.name + "\": the reader's output over its cache"}, {}, ""};
  for (const MapDifference& m : rep.differences) reader.provenance.expressions.push_back(m.text("the layout"));
  if (reader.provenance.expressions.empty()) reader.provenance.expressions.push_back("the layout's own map");
  if (rep.not_inferred.empty()) rep.reader_layout = std::move(reader);  // every misread region's map, or none
}

}  // namespace

bool ReadReport::ok() const {
  if (mode == "attention") return probe_correct == probe_rows;
  return sides[0].blocks_misread == 0 && sides[1].blocks_misread == 0;
}

ReadReport check_read_rows(const Kit& kit, const std::vector<float>& k, const std::vector<float>& v, int max_examples,
                           const Progress& progress) {
  const CacheDims& d = kit.dims();
  const int64_t R = int64_t(kit.read_rows.size()), D = d.head_dim, n = R * d.heads * D;
  for (const auto& [x, name] : {std::pair{&k, "K"}, {&v, "V"}})
    if (int64_t(x->size()) != n)
      throw ArgumentError(std::string("check-read: the reader's ") + name + " rows hold " + std::to_string(x->size()) +
                          " values; the kit's sequences are " + std::to_string(R) + " tokens x " + std::to_string(d.heads) +
                          " heads x " + std::to_string(D) + " = " + std::to_string(n));
  ReadReport rep;
  rep.layout = kit.layout().name;
  for (const Buffer& b : kit.layout().buffers) rep.buffers.push_back(b.name);
  rep.mode = "rows";
  report_progress(progress, "comparing the reader's rows", 0.0);
  std::vector<BlockRead> misread;
  std::vector<const float*> values;
  for (Side side : {Side::kK, Side::kV}) {
    const std::vector<float>& got = side == Side::kK ? k : v;
    const std::vector<float>& want = side == Side::kK ? kit.read_k : kit.read_v;
    SideReadReport& s = rep.sides[size_t(side)];
    for (int64_t i = 0; i < R; ++i)
      for (int64_t h = 0; h < d.heads; ++h)
        for (int64_t g = 0; g < d.scale_bytes(); ++g) {
          const int64_t at = (i * d.heads + h) * D + g * kBlockSize;
          int right = 0;
          for (int e = 0; e < kBlockSize; ++e) right += got[size_t(at + e)] == want[size_t(at + e)];
          s.elements += kBlockSize;
          s.correct += right;
          ++s.blocks;
          if (right == kBlockSize) continue;
          misread.push_back(block_at(kit, side, i, h, g));
          values.push_back(got.data() + at);
        }
  }
  report_progress(progress, "tracing the misread blocks in the cache", 0.3);
  const ByteOwners owners(kit.layout(), kit.options.layer);
  BlockTracer(kit, owners).trace(misread, values);
  for (const BlockRead& b : misread) tally(rep.sides[size_t(b.side)], b);
  std::array<std::vector<const BlockRead*>, 2> per_side;
  for (const BlockRead& b : misread) per_side[size_t(b.side)].push_back(&b);
  for (const auto& list : per_side) {
    const int64_t take = std::min<int64_t>(max_examples, int64_t(list.size()));
    for (int64_t i = 0; i < take; ++i) rep.examples.push_back(*list[size_t(i * int64_t(list.size()) / take)]);
  }
  report_progress(progress, "inferring the reader's map", 0.8);
  if (!misread.empty()) infer_reader(kit, misread, rep);
  report_progress(progress, "done", 1.0);
  return rep;
}

ReadReport check_read_attention(const Kit& kit, const std::vector<float>& out, int max_examples, const Progress& progress) {
  const CacheDims& d = kit.dims();
  const int64_t B = kit.probes(), Hq = kit.q_heads, D = d.head_dim, group = Hq / d.heads;
  if (int64_t(out.size()) != B * Hq * D)
    throw ArgumentError("check-read: the reader's attention output holds " + std::to_string(out.size()) + " values; the kit's " +
                        std::to_string(B) + " probes x " + std::to_string(Hq) + " query heads x " + std::to_string(D) + " = " +
                        std::to_string(B * Hq * D));
  ReadReport rep;
  rep.layout = kit.layout().name;
  for (const Buffer& b : kit.layout().buffers) rep.buffers.push_back(b.name);
  rep.mode = "attention";
  const ByteOwners owners(kit.layout(), kit.options.layer);
  report_progress(progress, "comparing the probes' outputs", 0.0);
  std::vector<ProbeRead> wrong;
  std::vector<BlockRead> v_blocks;
  std::vector<const float*> v_values;
  std::vector<size_t> v_owner;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hq = 0; hq < Hq; ++hq) {
      ++rep.probe_rows;
      const float* got = out.data() + (b * Hq + hq) * D;
      const float* want = kit.expected_out.data() + (b * Hq + hq) * D;
      const bool isolates = kit.probe_isolates[size_t(b * Hq + hq)];
      rep.not_isolating += !isolates;
      // An isolating probe's output is one V row: bf16 rounding at most. Otherwise a
      // mixture, rounded per term by the reader's own precision.
      if (close_to(got, want, D, isolates ? 0x1p-9 : 0x1p-6)) {
        ++rep.probe_correct;
        continue;
      }
      ProbeRead p;
      p.probe = b;
      p.q_head = hq;
      p.sequence = kit.probe_sequence[size_t(b)];
      p.position = kit.probe_position[size_t(b)];
      double num = 0, den = 0;
      for (int64_t e = 0; e < D; ++e) {
        num += (double(got[e]) - want[e]) * (double(got[e]) - want[e]);
        den += double(want[e]) * want[e];
      }
      p.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
      bool finite = true;
      for (int64_t e = 0; e < D; ++e) finite = finite && std::isfinite(got[e]);
      if (!finite) {
        p.what = "non-finite output: a NaN or Inf reached the softmax or the sum over V (a scale read from a byte that is an "
                 "E4M3 NaN, 0x7f / 0xff, does that)";
        ++rep.non_finite;
        wrong.push_back(std::move(p));
        continue;
      }
      if (!isolates) {
        p.what = "unidentified (this probe does not single out one token)";
        ++rep.unidentified;
        wrong.push_back(std::move(p));
        continue;
      }
      const KitSequence& seq = kit.sequences[size_t(p.sequence)];
      const int64_t kh = hq / group;
      for (int64_t t = 0; t < seq.length && p.attended < 0; ++t)
        if (t != p.position && close_to(got, kit.read_v.data() + ((seq.first_read_row + t) * d.heads + kh) * D, D, 0x1p-9))
          p.attended = t;
      if (p.attended >= 0) {
        p.what = "attended to position " + std::to_string(p.attended) + " instead: K read from the wrong bytes";
        ++rep.wrong_token;
        wrong.push_back(std::move(p));
        continue;
      }
      // V as read: its first wrong group traced like a dequantized row.
      const float* vrow = kit.read_v.data() + ((seq.first_read_row + p.position) * d.heads + kh) * D;
      for (int64_t g = 0; g < d.scale_bytes(); ++g)
        if (!close_to(got + g * kBlockSize, vrow + g * kBlockSize, kBlockSize, 0x1p-9)) {
          v_blocks.push_back(block_at(kit, Side::kV, seq.first_read_row + p.position, kh, g));
          v_values.push_back(got + g * kBlockSize);
          v_owner.push_back(wrong.size());
          break;
        }
      wrong.push_back(std::move(p));
    }
  report_progress(progress, "tracing V rows in the cache", 0.5);
  BlockTracer(kit, owners).trace(v_blocks, v_values);
  for (size_t i = 0; i < v_blocks.size(); ++i) wrong[v_owner[i]].v_block = v_blocks[i];
  for (ProbeRead& p : wrong) {
    if (!p.what.empty()) continue;
    if (p.v_block && p.v_block->data_from) {
      p.what = "V misread: " + p.v_block->what;
      ++rep.v_misread;
    } else {
      p.what = "unidentified";
      ++rep.unidentified;
    }
  }
  const int64_t take = std::min<int64_t>(max_examples, int64_t(wrong.size()));
  for (int64_t i = 0; i < take; ++i) rep.probe_examples.push_back(wrong[size_t(i * int64_t(wrong.size()) / take)]);
  report_progress(progress, "done", 1.0);
  return rep;
}

}  // namespace nvfp4kv::conformance
