#include "nvfp4kv/harness/roundtrip.hpp"

#include <algorithm>

#include "nvfp4kv/core/global_scale.hpp"
#include "nvfp4kv/reference/cache.hpp"
#include "roundtrip_workload.hpp"

namespace nvfp4kv::harness {

bool RoundtripReport::path_ok(const RoundtripPath& p) const {
  return p.ran && !p.refused && p.store.ok() && p.gather_bad == 0 && int64_t(p.status.padding) == expected_padding &&
         int64_t(p.status.out_of_range) == expected_out_of_range;
}

bool RoundtripReport::ok() const { return path_ok(cpu) && (path_ok(gpu) || (!gpu.ran && !gpu.refused)); }

namespace {

RoundtripWorkload make_workload(const CacheDims& d, const RoundtripOptions& opt) {
  RoundtripWorkload w;
  const int64_t capacity = d.pages * d.tokens_per_page;
  const int64_t tokens = opt.tokens > 0 ? std::min(opt.tokens, capacity)
                                        : std::min<int64_t>(std::max<int64_t>(capacity * 3 / 4, 1), 4096);
  w.rows = make_rows(d, tokens, ElementType::kBFloat16, RowPattern::kStructured, opt.seed);
  w.slots = paged_slots(d, tokens, opt.seed + 1, true);
  w.slots.resize(size_t(tokens));  // the same rows as make_rows made (no extra last slot)
  w.block_table = pages_of(d, w.slots);
  w.k_gs = recommend_global_scale(w.rows.k_amax);
  w.v_gs = recommend_global_scale(w.rows.v_amax);
  const int64_t row = d.heads * d.head_dim;
  const reference::DenseShape shape{tokens, d.heads, d.head_dim};
  w.qk = reference::quantize(w.rows.dense(true, row).data(), ElementType::kBFloat16, shape, w.k_gs, ScaleRule::kStandard);
  w.qv = reference::quantize(w.rows.dense(false, row).data(), ElementType::kBFloat16, shape, w.v_gs, ScaleRule::kStandard);
  w.dk = reference::dequantize(w.qk, w.k_gs);
  w.dv = reference::dequantize(w.qv, w.v_gs);
  return w;
}

RoundtripPath cpu_roundtrip(const ValidLayout& valid, const RoundtripWorkload& w, const Progress& progress) {
  const Layout& l = valid.layout();
  const CacheDims& d = l.dims;
  RoundtripPath p;
  reference::HostCache cache(l, kRoundtripPoison);
  StoreArgs s;
  s.rows = {w.rows.k.data(), w.rows.v.data(), w.rows.tokens, w.rows.stride};
  s.type = w.rows.type;
  s.slots = w.slots.data();
  s.slots_are_int64 = true;
  s.k_global_scale = &w.k_gs;
  s.v_global_scale = &w.v_gs;
  s.status = &p.status;
  // In chunks of rows, so that progress can say how far it is.
  constexpr int64_t kChunk = 1024;
  for (int64_t first = 0; first < w.rows.tokens; first += kChunk) {
    report_progress(progress, "storing on the CPU reference", 0.1 + 0.5 * double(first) / double(w.rows.tokens));
    StoreArgs part = s;
    part.rows.tokens = std::min(kChunk, w.rows.tokens - first);
    part.rows.k = w.rows.k.data() + first * w.rows.stride;
    part.rows.v = w.rows.v.data() + first * w.rows.stride;
    part.slots = w.slots.data() + first;
    reference::store(valid, cache.buffers, part);
  }
  report_progress(progress, "auditing every byte of the CPU reference's cache", 0.6);
  p.store = audit_store(valid, 0, w.slots, w.qk, w.qv, cache.storage, kRoundtripPoison);
  report_progress(progress, "gathering on the CPU reference", 0.7);
  // The slots fill the used pages in order, so gathering them as one sequence
  // returns row i at position i; skipped rows are not gathered.
  const reference::GatheredKv g = reference::gather_sequence(
      valid, cache.buffers, w.block_table, int64_t(w.block_table.size()) * d.tokens_per_page, 0, w.k_gs, w.v_gs);
  const int64_t row = d.heads * d.head_dim;
  for (int64_t i = 0; i < int64_t(w.slots.size()); ++i) {
    const int64_t at = gathered_row(w, d, i);
    if (at < 0) continue;
    for (int64_t e = 0; e < row; ++e, p.gather_values += 2) {
      p.gather_bad += g.k[size_t(at * row + e)] != w.dk[size_t(i * row + e)];
      p.gather_bad += g.v[size_t(at * row + e)] != w.dv[size_t(i * row + e)];
    }
  }
  p.ran = true;
  return p;
}

}  // namespace

std::string roundtrip_problem(const Layout& l) {
  const CacheDims& d = l.dims;
  if (!d.fp8(Side::kK) && !d.fp8(Side::kV)) return "";
  return "layout " + quote_text(l.name) + " holds " + (d.fp8(Side::kK) ? "K" : "V") +
         " as fp8_e4m3; the round trip checks NVFP4 pages only so far";
}

RoundtripReport roundtrip(const ValidLayout& valid, const RoundtripOptions& opt) {
  const CacheDims& d = valid.layout().dims;
  if (std::string p = roundtrip_problem(valid.layout()); !p.empty()) throw ArgumentError("roundtrip: " + p);
  report_progress(opt.progress, "making and quantizing the rows", 0.0);
  const RoundtripWorkload w = make_workload(d, opt);
  RoundtripReport r;
  r.layout = valid.layout().name;
  r.tokens = w.rows.tokens;
  r.heads = d.heads;
  r.head_dim = d.head_dim;
  for (int64_t s : w.slots) {
    r.expected_padding += s < 0;
    r.expected_out_of_range += s >= d.pages * d.tokens_per_page;
  }
  r.cpu = cpu_roundtrip(valid, w, opt.progress);
  report_progress(opt.progress, "the GPU path", 0.9);
  if (opt.use_gpu) r.gpu = gpu_roundtrip(valid, w);
  else r.gpu.why_not = "not asked for (--cpu-only)";
  return r;
}

}  // namespace nvfp4kv::harness
