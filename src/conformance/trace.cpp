#include "trace.hpp"

#include <algorithm>
#include <cstdio>

#include "nvfp4kv/conformance/check.hpp"

namespace nvfp4kv::conformance {

std::vector<int64_t> scale_row_strides(const Layout& l) {
  std::vector<int64_t> s = {1, 2, 4, l.dims.tokens_per_page};
  for (Region r : {Region::kKScale, Region::kVScale}) {
    const Mode& c = l.region(r).column;
    s.push_back(c.is_plain() ? c.stride : c.inner_stride);
  }
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  s.erase(std::remove_if(s.begin(), s.end(), [](int64_t x) { return x < 1; }), s.end());
  return s;
}

Trace trace_kit(const Kit& kit, const std::vector<std::vector<uint8_t>>& buffers) {
  const CacheDims& d = kit.dims();
  const int64_t sd = d.scale_bytes();
  Trace t;
  t.data.resize(size_t(kit.block_count()));
  t.scale_rows.resize(size_t(kit.rows * d.heads * 2));
  for (const auto& b : buffers) t.at.emplace_back(b.size(), -1);
  // Data: bytes 0..6 of every block (padding rows' too), at any offset.
  std::vector<Pattern> keys(size_t(kit.block_count()));
  std::vector<uint8_t> last(keys.size());  // byte 7's low nibble (a check digit; the high one may be a rounding probe)
  for (int64_t b = 0; b < kit.block_count(); ++b) {
    const BlockId id = kit.block(b);
    float x[kBlockSize];
    kit.block_values(id, x);
    const QuantizedBlock q = quantize_block_as(RoundingPolicy::kNvfp4kv, x, kit.global_scale(id.side));
    std::copy(q.packed, q.packed + 7, keys[size_t(b)].bytes.begin());
    keys[size_t(b)].length = 7;
    last[size_t(b)] = q.packed[7] & 15u;
  }
  const auto data_hits = find_patterns(buffers, keys);
  for (int64_t b = 0; b < kit.block_count(); ++b)
    for (const Location& at : data_hits[size_t(b)]) {
      t.data[size_t(b)].push_back(at);
      const std::vector<uint8_t>& buf = buffers[size_t(at.buffer)];
      for (int j = 0; j < 8; ++j) {
        const int64_t o = at.byte + j;
        if (o >= int64_t(buf.size()) || t.at[size_t(at.buffer)][size_t(o)] >= 0) continue;
        if (j == 7 && (buf[size_t(o)] & 15u) != last[size_t(b)]) continue;
        t.at[size_t(at.buffer)][size_t(o)] = int32_t(b * 9 + j);
      }
    }
  // Scales: each row's first min(sd, 8) codes, starting with its marker, at each stride.
  if (sd >= 2) {
    bool marker[256] = {};
    for (int c = 0; c < 256; ++c) marker[c] = is_row_marker(uint8_t(c));
    const std::vector<int64_t> strides = scale_row_strides(kit.layout());
    std::vector<Pattern> rows;
    for (int64_t rid = 0; rid < kit.rows * d.heads * 2; ++rid)
      for (int64_t stride : strides) {
        Pattern p;
        p.length = int(std::min<int64_t>(sd, 8));
        p.stride = stride;
        for (int g = 0; g < p.length; ++g) p.bytes[size_t(g)] = signature_scale(d, rid, g);
        rows.push_back(p);
      }
    const auto row_hits = find_patterns(buffers, rows, nullptr, marker);
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t rid = int64_t(i / strides.size());
      for (const Location& at : row_hits[i]) {
        ScaleRowLanding land{at, rows[i].stride, 0};
        const std::vector<uint8_t>& buf = buffers[size_t(at.buffer)];
        while (land.groups < sd) {
          const int64_t o = at.byte + land.groups * land.stride;
          if (o >= int64_t(buf.size()) || buf[size_t(o)] != signature_scale(d, rid, land.groups)) break;
          ++land.groups;
        }
        const int64_t row = rid / (2 * d.heads), head = (rid / 2) % d.heads;
        for (int64_t g = 0; g < land.groups; ++g) {
          int32_t& slot = t.at[size_t(at.buffer)][size_t(at.byte + g * land.stride)];
          if (slot < 0) slot = int32_t(kit.block_index({row, head, Side(rid % 2), g}) * 9 + 8);
        }
        t.scale_rows[size_t(rid)].push_back(land);
      }
    }
  }
  return t;
}

std::vector<Location> Trace::scale_of(const Kit& kit, const BlockId& b) const {
  std::vector<Location> out;
  const int64_t rid = (b.row * kit.dims().heads + b.head) * 2 + int64_t(b.side);
  for (const ScaleRowLanding& l : scale_rows[size_t(rid)])
    if (b.group < l.groups) out.push_back({l.at.buffer, l.at.byte + b.group * l.stride});
  return out;
}

std::string Trace::describe(const Kit& kit, const std::vector<std::vector<uint8_t>>& buffers, const Location& where) const {
  const uint8_t byte = buffers[size_t(where.buffer)][size_t(where.byte)];
  if (byte == kPoison) return "poison (never written)";
  const int64_t n = at[size_t(where.buffer)][size_t(where.byte)];
  char hex[40];
  std::snprintf(hex, sizeof hex, "0x%02x (no signature)", byte);
  if (n < 0) return hex;
  const BlockId b = kit.block(n / 9);
  const int64_t j = n % 9;
  std::string s = describe_block(kit, b, j == 8);
  if (j < 8) s = s.substr(0, s.rfind(", bytes ")) + ", byte " + std::to_string(b.group * 8 + j);
  return s;
}

std::vector<Observation> Trace::observations(const Kit& kit, Region r) const {
  std::vector<Observation> obs;
  const CacheDims& d = kit.dims();
  const Side side = (r == Region::kKData || r == Region::kKScale) ? Side::kK : Side::kV;
  for (int64_t row = 0; row < kit.rows; ++row) {
    const auto cell = kit.cell(row);
    if (!cell) continue;
    for (int64_t h = 0; h < d.heads; ++h) {
      if (!is_scale(r)) {
        for (int64_t g = 0; g < d.scale_bytes(); ++g)
          for (const Location& at : data[size_t(kit.block_index({row, h, side, g}))])
            for (int64_t j = 0; j < 7; ++j) obs.push_back({cell->first, cell->second, h, g * 8 + j, {at.buffer, at.byte + j}});
        continue;
      }
      for (const ScaleRowLanding& l : scale_rows[size_t((row * d.heads + h) * 2 + int64_t(side))])
        for (int64_t g = 0; g < l.groups; ++g)
          obs.push_back({cell->first, cell->second, h, g, {l.at.buffer, l.at.byte + g * l.stride}});
    }
  }
  return obs;
}

}  // namespace nvfp4kv::conformance
