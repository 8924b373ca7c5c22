#include "nvfp4kv/reference/cache.hpp"

#include <stdexcept>
#include <string>

#include "nvfp4kv/core/global_scale.hpp"

namespace nvfp4kv::reference {

HostCache::HostCache(const Layout& layout, uint8_t fill) {
  if (layout.buffers.size() > size_t(kMaxBuffers)) throw std::invalid_argument("HostCache: too many buffers");
  for (const Buffer& b : layout.buffers) storage.emplace_back(size_t(b.bytes), fill);
  for (size_t i = 0; i < storage.size(); ++i) buffers.ptr[i] = storage[i].data();
  buffers.count = int(storage.size());
}

namespace {

void require_buffers(const Layout& l, const CacheBuffers& b, int64_t layer, const char* who) {
  if (b.count != int(l.buffers.size()))
    throw std::invalid_argument(std::string(who) + ": layout has " + std::to_string(l.buffers.size()) +
                                " buffers, got " + std::to_string(b.count));
  if (layer < 0 || layer >= l.dims.layers)
    throw std::invalid_argument(std::string(who) + ": layer " + std::to_string(layer) + " outside [0, " +
                                std::to_string(l.dims.layers) + ")");
}

}  // namespace

StoreCounts store(const ValidLayout& valid, const CacheBuffers& buffers, const StoreParams& p) {
  const Layout& l = valid.layout();
  const CacheDims& d = l.dims;
  require_buffers(l, buffers, p.layer, "reference::store");
  require_valid_global_scale(p.k_global_scale, "reference::store K");
  require_valid_global_scale(p.v_global_scale, "reference::store V");
  if (p.rows.token_stride < d.heads * d.head_dim)
    throw std::invalid_argument("reference::store: token stride smaller than heads * head_dim");
  StoreCounts counts;
  const int64_t capacity = d.pages * d.tokens_per_page;
  for (int64_t i = 0; i < p.rows.tokens; ++i) {
    const int64_t slot = p.slots[i];
    if (slot < 0) {
      ++counts.padding;
      continue;
    }
    if (slot >= capacity) {
      ++counts.out_of_range;
      continue;
    }
    ++counts.stored;
    for (int side = 0; side < 2; ++side) {
      const void* src = side == 0 ? p.rows.k : p.rows.v;
      const float gs = side == 0 ? p.k_global_scale : p.v_global_scale;
      const Region data = side == 0 ? Region::kKData : Region::kVData;
      const Region scale = side == 0 ? Region::kKScale : Region::kVScale;
      for (int64_t h = 0; h < d.heads; ++h)
        for (int64_t g = 0; g < d.scale_bytes(); ++g) {
          float x[kBlockSize];
          for (int e = 0; e < kBlockSize; ++e)
            x[e] = element_to_float(src, i * p.rows.token_stride + h * d.head_dim + g * kBlockSize + e, p.type);
          const QuantizedBlock q = quantize_block(x, gs, p.rule);
          counts.non_finite += q.non_finite;
          Coord c{p.layer, slot / d.tokens_per_page, slot % d.tokens_per_page, h, g};
          *element_address(l, buffers, scale, c) = q.scale;
          for (int j = 0; j < kBlockSize / 2; ++j) {
            c.column = g * (kBlockSize / 2) + j;
            *element_address(l, buffers, data, c) = q.packed[j];
          }
        }
    }
  }
  return counts;
}

GatheredKv gather(const ValidLayout& valid, const CacheBuffers& buffers, const GatherParams& p) {
  const Layout& l = valid.layout();
  const CacheDims& d = l.dims;
  require_buffers(l, buffers, p.layer, "reference::gather");
  GatheredKv out;
  out.k.resize(size_t(p.tokens * d.heads * d.head_dim));
  out.v.resize(out.k.size());
  for (int64_t i = 0; i < p.tokens; ++i) {
    const int64_t page = p.block_table[i / d.tokens_per_page];
    if (page < 0 || page >= d.pages)
      throw std::invalid_argument("reference::gather: block table entry " + std::to_string(page) + " outside [0, " +
                                  std::to_string(d.pages) + ")");
    for (int side = 0; side < 2; ++side) {
      const float gs = side == 0 ? p.k_global_scale : p.v_global_scale;
      const Region data = side == 0 ? Region::kKData : Region::kVData;
      const Region scale = side == 0 ? Region::kKScale : Region::kVScale;
      std::vector<float>& dst = side == 0 ? out.k : out.v;
      for (int64_t h = 0; h < d.heads; ++h)
        for (int64_t e = 0; e < d.head_dim; ++e) {
          const Coord cd{p.layer, page, i % d.tokens_per_page, h, e / 2};
          const Coord cs{p.layer, page, i % d.tokens_per_page, h, e / kBlockSize};
          const uint8_t byte = *element_address(l, buffers, data, cd);
          const uint8_t sf = *element_address(l, buffers, scale, cs);
          dst[size_t((i * d.heads + h) * d.head_dim + e)] = dequantize_element(byte, int(e % 2), sf, gs);
        }
    }
  }
  return out;
}

}  // namespace nvfp4kv::reference
