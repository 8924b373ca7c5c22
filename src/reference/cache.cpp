#include "nvfp4kv/reference/cache.hpp"

#include "nvfp4kv/core/transform.hpp"
#include "nvfp4kv/reference/transform.hpp"

#include <cmath>
#include <limits>
#include <string>

namespace nvfp4kv::reference {

HostCache::HostCache(const Layout& layout, uint8_t fill) {
  if (layout.buffers.size() > size_t(kMaxBuffers))
    throw ArgumentError("HostCache: the layout has " + std::to_string(layout.buffers.size()) +
                        " buffers, at most " + std::to_string(kMaxBuffers) + " are supported");
  for (const Buffer& b : layout.buffers) storage.emplace_back(size_t(b.bytes), fill);
  for (size_t i = 0; i < storage.size(); ++i) buffers.ptr[i] = storage[i].data();
  buffers.count = int(storage.size());
}

namespace {

void require(const std::string& problem, const char* who) {
  if (!problem.empty()) throw ArgumentError(std::string(who) + ": " + problem);
}

void count(DeviceStatus* s, unsigned long long DeviceStatus::*field, unsigned long long n = 1) {
  if (s) s->*field += n;
}

void write_element(void* out, int64_t index, ElementType type, float x) {
  switch (type) {
    case ElementType::kFloat32: static_cast<float*>(out)[index] = x; break;
    case ElementType::kBFloat16: static_cast<uint16_t*>(out)[index] = float_to_bf16(x); break;
    default: static_cast<uint16_t*>(out)[index] = float_to_fp16(x); break;
  }
}

}  // namespace

void read_row(const Layout& l, const CacheBuffers& buffers, Side side, const Coord& at, float global_scale,
              double* out) {
  const CacheDims& d = l.dims;
  const SideRegions reg = side_regions(side);
  Coord c = at;
  if (d.fp8(side)) {  // one E4M3 code per byte, column = element
    for (c.column = 0; c.column < d.head_dim; ++c.column)
      out[c.column] = fp8_decode_element(*element_address(l, buffers, reg.data, c), global_scale);
    return;
  }
  for (int64_t e = 0; e < d.head_dim; ++e) {
    c.column = e / 2;
    const uint8_t byte = l.codes.decode(*element_address(l, buffers, reg.data, c));
    c.column = e / kBlockSize;
    const uint8_t sf = *element_address(l, buffers, reg.scale, c);
    out[e] = dequantize_element(byte, int(e % 2), sf, global_scale);
  }
}

void store(const ValidLayout& valid, const CacheBuffers& buffers, const StoreArgs& a) {
  require(store_problem(valid, buffers, a), "reference::store");
  const CacheFormat& format = valid.format();
  const Layout& l = valid.layout();
  const CacheDims& d = l.dims;
  const LayerFormat layer_format = format.layer(a.layer);
  std::vector<float> row(size_t(d.head_dim));
  const int64_t capacity = d.pages * d.tokens_per_page;
  const float kgs = *a.k_global_scale, vgs = *a.v_global_scale;
  for (int64_t i = 0; i < a.rows.tokens; ++i) {
    const int64_t slot = a.slot(i);
    if (slot < 0) {
      count(a.status, &DeviceStatus::padding);
      continue;
    }
    if (slot >= capacity) {
      count(a.status, &DeviceStatus::out_of_range);
      continue;
    }
    if (!global_scale_usable(kgs) || !global_scale_usable(vgs)) {  // as the kernel: write nothing, count
      count(a.status, &DeviceStatus::bad_global_scale);
      continue;
    }
    count(a.status, &DeviceStatus::stored);
    for (Side side : {Side::kK, Side::kV}) {
      const SideRegions reg = side_regions(side);
      const float gs = *a.global_scale(side);
      const ScaleRule rule = format.implicit() ? a.rule : layer_format.side(side).rule;
      for (int64_t h = 0; h < d.heads; ++h) {
        for (int64_t e = 0; e < d.head_dim; ++e)
          row[size_t(e)] = element_to_float(a.rows.side(side), i * a.rows.token_stride + h * d.head_dim + e, a.type);
        int64_t non_finite = 0;
        transform_row(format, d, a.layer, side, h, row.data(), &non_finite);
        count(a.status, &DeviceStatus::non_finite, (unsigned long long)non_finite);
        if (d.fp8(side)) {  // core/transform.hpp: e4m3(x * (1 / scale)), a NaN or Inf stored as +0 and counted
          const float inv = 1.0f / gs;
          Coord c{a.layer, slot / d.tokens_per_page, slot % d.tokens_per_page, h, 0};
          for (c.column = 0; c.column < d.head_dim; ++c.column) {
            const float x = row[size_t(c.column)];
            count(a.status, &DeviceStatus::non_finite, fp8_input_finite(x) ? 0 : 1);
            *element_address(l, buffers, reg.data, c) = fp8_encode_element(x, inv);
          }
          continue;
        }
        for (int64_t g = 0; g < d.scale_bytes(); ++g) {
          const QuantizedBlock q = quantize_block(row.data() + g * kBlockSize, gs, rule);
          count(a.status, &DeviceStatus::non_finite, q.non_finite);
          Coord c{a.layer, slot / d.tokens_per_page, slot % d.tokens_per_page, h, g};
          *element_address(l, buffers, reg.scale, c) = q.scale;
          for (int j = 0; j < kBlockSize / 2; ++j) {
            c.column = g * (kBlockSize / 2) + j;
            *element_address(l, buffers, reg.data, c) = l.codes.encode(q.packed[j]);  // the layout's code order
          }
        }
      }
    }
  }
}

void gather(const ValidLayout& valid, const CacheBuffers& buffers, const GatherArgs& a) {
  require(gather_problem(valid, buffers, a), "reference::gather");
  const CacheFormat& format = valid.format();
  const Layout& l = valid.layout();
  const CacheDims& d = l.dims;
  std::vector<double> values(size_t(d.head_dim));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const bool scales_ok = global_scale_usable(*a.k_global_scale) && global_scale_usable(*a.v_global_scale);
  const int64_t row = d.heads * d.head_dim;
  const auto fill_nan = [&](Side side, int64_t first_row, int64_t rows) {
    for (int64_t e = 0; e < rows * row; ++e) write_element(a.out(side), first_row * row + e, a.out_type, nan);
  };
  for (int64_t s = 0; s < a.batch.batch; ++s) {
    const SequenceLength len = sequence_length(a.batch, s, d.tokens_per_page);
    const int64_t begin = a.batch.first_row(s);
    if (len.bad) {
      count(a.status, &DeviceStatus::bad_lengths);
      const int64_t beyond = a.batch.raw_length(s) - len.tokens;
      if (beyond > 0)
        for (Side side : {Side::kK, Side::kV}) fill_nan(side, begin + len.tokens, beyond);
    }
    for (int64_t first = 0, entry = 0; first < len.tokens; first += d.tokens_per_page, ++entry) {
      const int64_t tokens = std::min(d.tokens_per_page, len.tokens - first);
      const int64_t page = page_of(a.batch, s, entry, d.pages);
      if (page < 0 || !scales_ok) count(a.status, page < 0 ? &DeviceStatus::bad_pages : &DeviceStatus::bad_global_scale,
                                        (unsigned long long)tokens);
      for (Side side : {Side::kK, Side::kV}) {
        const float gs = *a.global_scale(side);
        if (page < 0 || !global_scale_usable(gs)) {  // never read outside the cache or with a broken scale
          fill_nan(side, begin + first, tokens);
          continue;
        }
        for (int64_t t = 0; t < tokens; ++t)
          for (int64_t h = 0; h < d.heads; ++h) {
            read_row(l, buffers, side, {a.layer, page, t, h, 0}, gs, values.data());
            // Without a transform this is the identity and each value is written exactly as decoded.
            if (!a.stored_values) restore_row_f64(format, d, a.layer, side, h, values.data());
            for (int64_t e = 0; e < d.head_dim; ++e)
              write_element(a.out(side), (begin + first + t) * row + h * d.head_dim + e, a.out_type,
                            float(values[size_t(e)]));
          }
      }
    }
  }
}

GatheredKv gather_sequence(const ValidLayout& layout, const CacheBuffers& buffers, const std::vector<int32_t>& pages,
                           int64_t tokens, int64_t layer, float k_global_scale, float v_global_scale) {
  const CacheDims& d = layout.layout().dims;
  GatheredKv out;
  out.k.resize(size_t(tokens * d.heads * d.head_dim));
  out.v.resize(out.k.size());
  const int32_t cu[2] = {0, int32_t(tokens)};
  GatherArgs a;
  a.batch = {.block_table = pages.data(), .block_table_stride = std::max<int64_t>(1, int64_t(pages.size())),
             .cu_seqlens = cu, .batch = 1};
  a.layer = layer;
  a.k_global_scale = &k_global_scale;
  a.v_global_scale = &v_global_scale;
  a.out_type = ElementType::kFloat32;
  a.k_out = out.k.data();
  a.v_out = out.v.data();
  gather(layout, buffers, a);
  return out;
}

}  // namespace nvfp4kv::reference
