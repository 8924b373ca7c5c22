#include "nvfp4kv/core/plan.hpp"

#include <sstream>

namespace nvfp4kv {

__extension__ typedef __int128 i128;
namespace {

std::string bytes_text(int64_t b) {
  std::ostringstream s;
  s.precision(3);
  if (b >= (int64_t(1) << 30)) s << double(b) / double(int64_t(1) << 30) << " GiB";
  else if (b >= (int64_t(1) << 20)) s << double(b) / double(int64_t(1) << 20) << " MiB";
  else if (b >= 1024) s << double(b) / 1024.0 << " KiB";
  else s << b << " B";
  return s.str();
}

// The page count a request asks for: given, or as many as the budget holds after
// `fixed` bytes at `per_page` bytes each (all layers).
int64_t pages_of(const PlanRequest& q, i128 per_page, int64_t fixed, const std::string& what) {
  const auto fail = [](const std::string& m) { throw LayoutError("plan: " + m); };
  if (q.pages) {
    if (*q.pages < 1) fail("page count must be >= 1, got " + std::to_string(*q.pages));
    return *q.pages;
  }
  if (*q.memory_bytes < 1) fail("memory budget must be > 0 bytes, got " + std::to_string(*q.memory_bytes));
  const int64_t pages = int64_t((i128(*q.memory_bytes) - fixed) / per_page);
  if (pages < 1)
    fail("a budget of " + bytes_text(*q.memory_bytes) + " holds no page" + what + ": one page of all " +
         std::to_string(q.layers) + " layers needs " + std::to_string(int64_t(per_page + fixed)) +
         " bytes; raise the budget or lower tokens per page");
  return pages;
}

// A layout of one's own: what one page adds is the size at two pages minus the
// size at one; whatever does not grow with pages is fixed.
Plan plan_own(const PlanRequest& q, int64_t heads, int64_t first_head) {
  const auto fail = [](const std::string& m) { throw LayoutError("plan: " + m); };
  const auto at = [&](int64_t pages) {
    return instantiate(*q.layout, {q.layers, pages, q.tokens_per_page, heads, q.head_dim});
  };
  const Layout one = at(1), two = at(2);
  const int64_t per_page = two.total_bytes() - one.total_bytes();
  const int64_t fixed = one.total_bytes() - per_page;
  if (per_page < 1 || fixed < 0)
    fail("layout \"" + one.name + "\" does not grow by a whole page per page (" + std::to_string(one.total_bytes()) +
         " B at one page, " + std::to_string(two.total_bytes()) + " B at two); its buffer sizes must be linear in P");
  const int64_t pages = pages_of(q, per_page, fixed, " of layout \"" + one.name + "\"");
  if (i128(per_page) * pages + fixed > i128(INT64_MAX) / 4)
    fail("the allocation overflows 64-bit sizes; lower the page count or budget");
  const Layout l = at(pages);
  const CheckResult res = check(l);
  if (!res.valid) fail("layout \"" + l.name + "\" at " + std::to_string(pages) + " pages is " + res.report.summary());
  Plan p{*res.valid, heads, first_head, per_page / std::max<int64_t>(1, l.dims.layers), per_page,
         pages * l.dims.tokens_per_page, l.total_bytes()};
  p.fixed_bytes = fixed;
  p.native = false;
  return p;
}

}  // namespace

Plan plan(const PlanRequest& q) {
  auto fail = [](const std::string& m) { throw LayoutError("plan: " + m); };
  if (q.layers < 1) fail("layers must be >= 1, got " + std::to_string(q.layers));
  if (q.kv_heads < 1) fail("kv heads must be >= 1, got " + std::to_string(q.kv_heads));
  if (const std::string p = head_dim_problem(q.head_dim); !p.empty())
    fail(p + "; pad the head dim up to " + std::to_string(uint64_t((i128(std::max<int64_t>(q.head_dim, 1)) + 15) / 16 * 16)));
  if (q.tokens_per_page < 1) fail("tokens per page must be >= 1, got " + std::to_string(q.tokens_per_page));
  if (q.interleave_v_scales && q.tokens_per_page % 4 != 0)
    fail("interleaved V scales need tokens per page % 4 == 0, got " + std::to_string(q.tokens_per_page) +
         "; use a multiple of 4 or linear V scales");
  if (q.tp_size < 1) fail("tensor-parallel size must be >= 1, got " + std::to_string(q.tp_size));
  if (q.tp_rank < 0 || q.tp_rank >= q.tp_size)
    fail("tensor-parallel rank must be in [0, " + std::to_string(q.tp_size) + "), got " + std::to_string(q.tp_rank));
  int64_t heads_per_rank = 0, first_head = 0;
  if (q.kv_heads % q.tp_size == 0) {
    heads_per_rank = q.kv_heads / q.tp_size;
    first_head = q.tp_rank * heads_per_rank;  // < kv_heads
  } else if (q.tp_size % q.kv_heads == 0) {
    heads_per_rank = 1;  // more ranks than kv heads: each head is replicated on tp / kv_heads ranks
    first_head = q.tp_rank / (q.tp_size / q.kv_heads);
  } else {
    fail("tensor-parallel size " + std::to_string(q.tp_size) + " and " + std::to_string(q.kv_heads) +
         " kv heads: one must divide the other; use a tensor-parallel size that divides " + std::to_string(q.kv_heads) +
         " or is a multiple of it");
  }
  if (q.memory_bytes && q.pages) fail("give either a memory budget or a page count, not both");
  if (!q.memory_bytes && !q.pages) fail("give a memory budget (--memory) or a page count (--pages)");
  if (q.interleave_v_scales && q.v_element == ElementFormat::kFp8E4M3)
    fail("interleaved V scales need V in NVFP4; V in fp8_e4m3 has no block scales");
  if (q.layout) {
    if (q.cross_layer || q.interleave_v_scales)
      fail("cross-layer and interleaved V scales shape the native layout; a layout of one's own says both itself");
    if (q.k_element != ElementFormat::kNvfp4 || q.v_element != ElementFormat::kNvfp4)
      fail("element formats shape the native layout; a layout of one's own says them itself (\"elements\")");
    return plan_own(q, heads_per_rank, first_head);
  }
  // Bytes of one page of one layer, from the native layout itself.
  // (The layout's evaluation rule bounds heads, head dim and page size: sizes past it are refused here.)
  const auto native = [&](const char* name, const DimsOverride& dims) {
    try {
      return instantiate(preset_spec(name), dims);
    } catch (const LayoutError& e) {
      throw LayoutError(std::string("plan: ") + e.what());
    }
  };
  const Layout one = native("nvfp4kv-native",
                            {1, 1, q.tokens_per_page, heads_per_rank, q.head_dim, q.k_element, q.v_element});
  const int64_t page_layer = one.buffers[0].bytes;
  const i128 page_all = i128(page_layer) * q.layers;
  if (page_all > kOffsetLimit)
    fail("one page of all " + std::to_string(q.layers) + " layers needs more than " + std::to_string(kOffsetLimit) +
         " bytes (2^62), the bound on any size; lower the layers, heads or tokens per page");
  const int64_t pages = pages_of(q, page_all, 0, "");
  const i128 total = page_all * pages;
  if (total > i128(INT64_MAX) / 4 || i128(pages) * q.tokens_per_page > INT64_MAX / 4)
    fail("the allocation overflows 64-bit sizes; lower the page count or budget");
  Layout layout = native(q.cross_layer ? "nvfp4kv-native-layers" : "nvfp4kv-native",
                         {q.layers, pages, q.tokens_per_page, heads_per_rank, q.head_dim, q.k_element, q.v_element});
  if (q.interleave_v_scales) interleave_scale_plane(layout, Region::kVScale);
  return Plan{validate(layout), heads_per_rank, first_head, page_layer, int64_t(page_all),
              pages * q.tokens_per_page, int64_t(total)};
}

std::string Plan::summary() const {
  const Layout& l = layout.layout();
  const CacheDims& d = l.dims;
  const int64_t useful = d.heads * d.tokens_per_page * d.row_bytes();
  std::ostringstream s;
  s << "layout          " << l.name
    << (l.buffers.size() > 1 ? " (" + std::to_string(l.buffers.size()) + " buffers)"
        : l.buffers[0].per_layer ? std::string(" (one buffer per layer)") : std::string(" (one buffer, all layers)")) << "\n"
    << "kv heads/rank   " << heads_per_rank << " (global "
    << (heads_per_rank == 1 ? "head " + std::to_string(first_head)
                            : "heads " + std::to_string(first_head) + ".." + std::to_string(first_head + heads_per_rank - 1))
    << ")\n"
    << "page            " << d.tokens_per_page << " tokens, " << bytes_per_page_per_layer << " B per layer ("
    << useful << " B of data and scales), " << bytes_per_page << " B over " << d.layers << " layers\n"
    << "pages           " << d.pages << "\n"
    << "token capacity  " << token_capacity << "\n"
    << "total           " << total_bytes << " B (" << bytes_text(total_bytes) << ")";
  if (l.dims.layers > 1 || !l.buffers[0].per_layer || l.buffers.size() > 1) {
    s << "\nallocation      ";
    for (size_t i = 0; i < l.buffers.size(); ++i) {
      const Buffer& b = l.buffers[i];
      s << (i ? ", " : "") << (l.buffers.size() > 1 ? "\"" + b.name + "\" " : std::string())
        << (b.per_layer ? std::to_string(d.layers) + " x " : std::string("1 x ")) << b.bytes << " B";
    }
  }
  if (fixed_bytes > 0) s << "\nfixed           " << fixed_bytes << " B that do not grow with pages";
  if (!native) return s.str();
  if (d.fp8(Side::kK) || d.fp8(Side::kV))
    s << "\nelements        K " << element_format_name(d.k_element) << ", V " << element_format_name(d.v_element);
  s << "\nper (page, head) one contiguous " << l.region(Region::kKData).head << " B span (K then V), rows "
    << layout.report().access[0].vector_bytes << "-byte aligned";
  return s.str();
}

}  // namespace nvfp4kv
