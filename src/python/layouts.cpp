// The layout contract from Python: load, instantiate, check, compare, plan, show.
// Thin: every rule and every message is core's.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"
#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/core/plan.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace nvfp4kv::python {
namespace {

Region region_arg(const std::string& name) {
  if (auto r = region_from_name(name)) return *r;
  throw ArgumentError("region: expected k_data, k_scale, v_data or v_scale, got \"" + name + "\"");
}

nb::dict access_dict(const std::array<RegionAccess, kRegionCount>& access) {
  nb::dict d;
  for (Region r : kAllRegions) {
    const RegionAccess& a = access[size_t(r)];
    nb::dict one;
    one["vector_bytes"] = a.vector_bytes;
    one["dense_plane"] = a.dense_plane;
    one["plane_align"] = a.plane_align;
    d[region_name(r)] = one;
  }
  return d;
}

nb::dict per_region(const std::array<int64_t, kRegionCount>& counts) {
  nb::dict d;
  for (Region r : kAllRegions) d[region_name(r)] = counts[size_t(r)];
  return d;
}

// "nvfp4" or "fp8_e4m3" (None: the description's own, else nvfp4).
std::optional<ElementFormat> element_arg(const std::optional<std::string>& name, const char* what) {
  if (!name) return std::nullopt;
  if (std::optional<ElementFormat> f = element_format_named(*name)) return f;
  throw ArgumentError(std::string(what) + ": expected \"nvfp4\" or \"fp8_e4m3\", got " + quote_text(*name));
}

DimsOverride dims_of(std::optional<int64_t> layers, std::optional<int64_t> pages, std::optional<int64_t> tokens_per_page,
                     std::optional<int64_t> heads, std::optional<int64_t> head_dim,
                     const std::optional<std::string>& k_element, const std::optional<std::string>& v_element) {
  return DimsOverride{layers,   pages, tokens_per_page, heads, head_dim, element_arg(k_element, "k_element"),
                      element_arg(v_element, "v_element")};
}

}  // namespace

void bind_layouts(nb::module_& m) {
  nb::class_<CacheDims>(m, "Dims", "The sizes of a cache: layers, pages, tokens per page (N), kv heads (H), head dim (D).")
      .def_ro("layers", &CacheDims::layers)
      .def_ro("pages", &CacheDims::pages)
      .def_ro("tokens_per_page", &CacheDims::tokens_per_page)
      .def_ro("heads", &CacheDims::heads)
      .def_ro("head_dim", &CacheDims::head_dim)
      .def_prop_ro("k_element", [](const CacheDims& d) { return element_format_name(d.k_element); },
                   "What K's bytes hold: \"nvfp4\" or \"fp8_e4m3\" (one E4M3 byte per value, no block scales).")
      .def_prop_ro("v_element", [](const CacheDims& d) { return element_format_name(d.v_element); },
                   "What V's bytes hold: \"nvfp4\" or \"fp8_e4m3\".")
      .def("__repr__", [](const CacheDims& d) {
        std::string elements;
        if (d.fp8(Side::kK) || d.fp8(Side::kV))
          elements = std::string(", k_element='") + element_format_name(d.k_element) + "', v_element='" +
                     element_format_name(d.v_element) + "'";
        return "Dims(layers=" + std::to_string(d.layers) + ", pages=" + std::to_string(d.pages) +
               ", tokens_per_page=" + std::to_string(d.tokens_per_page) + ", heads=" + std::to_string(d.heads) +
               ", head_dim=" + std::to_string(d.head_dim) + elements + ")";
      });

  nb::class_<Buffer>(m, "BufferInfo", "One allocation of a layout: its name, bytes, and whether there is one per layer.")
      .def_ro("name", &Buffer::name)
      .def_ro("bytes", &Buffer::bytes)
      .def_ro("per_layer", &Buffer::per_layer)
      .def("__repr__", [](const Buffer& b) {
        return "BufferInfo(name='" + b.name + "', bytes=" + std::to_string(b.bytes) +
               ", per_layer=" + (b.per_layer ? "True" : "False") + ")";
      });

  nb::class_<Layout>(m, "Layout",
                     "A concrete layout: every size bound, every stride a number; not yet proven sound (see check).")
      .def_ro("name", &Layout::name)
      .def_ro("summary", &Layout::summary)
      .def_ro("dims", &Layout::dims)
      .def_ro("buffers", &Layout::buffers)
      .def_prop_ro("total_bytes", &Layout::total_bytes, "Bytes of all allocations over all layers.")
      .def(
          "address",
          [](const Layout& l, const std::string& region, int64_t layer, int64_t page, int64_t token, int64_t head,
             int64_t column) {
            const Region r = region_arg(region);
            if (!l.dims.holds(r))
              throw ArgumentError("address: " + region + " holds nothing: its side holds fp8_e4m3 (no block scales)");
            const Coord c{layer, page, token, head, column};
            return std::make_pair(l.buffers.at(size_t(l.region(r).buffer)).name, l.offset(r, c));
          },
          "region"_a, "layer"_a, "page"_a, "token"_a, "head"_a, "column"_a,
          "(buffer name, byte) of one element: column is byte j of a data row or group g of a scale row.")
      .def("to_json", [](const Layout& l) { return to_json(l); }, "The concrete layout as JSON, every number evaluated.")
      .def(
          "byte_map", [](const Layout& l, int64_t layer, int64_t page, int max_lines) { return byte_map(l, layer, page, max_lines); },
          "layer"_a = 0, "page"_a = 0, "max_lines"_a = 40,
          "A picture of one page per buffer: K k V v per region's data and scales, ! for a byte owned twice.")
      .def("__repr__", [](const Layout& l) { return "<Layout '" + l.name + "'>"; });

  nb::class_<LayoutSpec>(m, "LayoutSpec", "A parsed layout description whose sizes may still be open.")
      .def_ro("name", &LayoutSpec::name)
      .def_ro("summary", &LayoutSpec::summary)
      .def(
          "instantiate",
          [](const LayoutSpec& s, std::optional<int64_t> layers, std::optional<int64_t> pages,
             std::optional<int64_t> tokens_per_page, std::optional<int64_t> heads, std::optional<int64_t> head_dim,
             std::optional<std::string> k_element, std::optional<std::string> v_element) {
            return instantiate(s, dims_of(layers, pages, tokens_per_page, heads, head_dim, k_element, v_element));
          },
          "layers"_a = nb::none(), "pages"_a = nb::none(), "tokens_per_page"_a = nb::none(), "heads"_a = nb::none(),
          "head_dim"_a = nb::none(), "k_element"_a = nb::none(), "v_element"_a = nb::none(),
          "Binds the open sizes and element formats (given ones override the description's own; one it fixes may "
          "be repeated, not contradicted).")
      .def("__repr__", [](const LayoutSpec& s) { return "<LayoutSpec '" + s.name + "'>"; });

  m.def("parse_layout_spec", &parse_layout_spec, "text"_a, "A layout description from JSON text.");
  m.def("load_spec", &load_spec, "name_or_path"_a, "A preset by name, or a JSON file by path.");
  m.def(
      "list_presets",
      [] {
        std::vector<std::pair<std::string, std::string>> out;
        for (const PresetInfo& p : list_presets()) out.emplace_back(p.name, p.summary);
        return out;
      },
      "(name, summary) of every built-in layout.");

  nb::class_<CheckReport>(m, "CheckReport", "What check() proved, or why it rejected a layout.")
      .def_ro("ok", &CheckReport::ok)
      .def_ro("undecided", &CheckReport::undecided,
              "Not ok, but not shown unsound: the proof would pass its bounds at these sizes.")
      .def_ro("problems", &CheckReport::problems, "Human-readable; the first is the verdict.")
      .def_prop_ro(
          "collision",
          [](const CheckReport& r) -> std::optional<std::string> {
            return r.collision ? std::optional<std::string>(r.collision->message()) : std::nullopt;
          },
          "The first two elements found sharing a byte, as a sentence, or None.")
      .def_ro("colliding_pairs", &CheckReport::colliding_pairs, "Region pairs that collide within one page, e.g. 'k_data/v_data'.")
      .def_prop_ro("access", [](const CheckReport& r) { return access_dict(r.access); },
                   "Per region: widest vector access, dense planes, plane alignment.")
      .def_ro("elements", &CheckReport::elements)
      .def_ro("elements_enumerated", &CheckReport::elements_enumerated)
      .def_ro("seconds", &CheckReport::seconds)
      .def("summary", &CheckReport::summary)
      .def("__repr__", [](const CheckReport& r) { return "<CheckReport " + r.summary() + ">"; });

  nb::class_<ValidLayout>(m, "ValidLayout", "A layout that passed check(): the only kind a Cache or a kernel accepts.")
      .def_prop_ro("layout", &ValidLayout::layout)
      .def_prop_ro("report", &ValidLayout::report)
      .def_prop_ro("name", [](const ValidLayout& v) { return v.layout().name; })
      .def_prop_ro("dims", [](const ValidLayout& v) { return v.layout().dims; })
      .def_prop_ro("format_json", [](const ValidLayout& v) { return format_to_json(v.format()); },
                   "The cache format it carries, as JSON text (docs/format.md, \"Cache formats\").")
      .def_prop_ro("bits_per_value", [](const ValidLayout& v) {
            return v.format().implicit() ? bits_per_value(v.layout().dims) : bits_per_value(v.format(), v.layout().dims.layers);
          },
                   "Bits per stored value under its format (4.5 for plain NVFP4).")
      .def("__repr__", [](const ValidLayout& v) { return "<ValidLayout '" + v.layout().name + "'>"; });

  m.def(
      "_with_format", [](const ValidLayout& v, std::string_view text) { return with_format(v, parse_format(text)); },
      "layout"_a, "format_json"_a,
      "The layout with a cache format attached (JSON text), checked against its sizes; raises naming the field.");

  m.def(
      "check",
      [](const Layout& l) {
        CheckResult res = check(l);
        return std::make_pair(std::move(res.report), std::move(res.valid));
      },
      "layout"_a, "(report, ValidLayout or None): the exact proof over the whole allocation.");

  nb::class_<Misplacement>(m, "Misplacement", "One element a writer and a reader place at different bytes.")
      .def_prop_ro("region", [](const Misplacement& x) { return std::string(region_name(x.region)); })
      .def_prop_ro("coord",
                   [](const Misplacement& x) {
                     return nb::make_tuple(x.coord.layer, x.coord.page, x.coord.token, x.coord.head, x.coord.column);
                   },
                   "(layer, page, token, head, column)")
      .def_ro("writer_buffer", &Misplacement::writer_buffer)
      .def_ro("writer_byte", &Misplacement::writer_byte)
      .def_ro("reader_buffer", &Misplacement::reader_buffer)
      .def_ro("reader_byte", &Misplacement::reader_byte);

  nb::class_<CompareReport>(m, "CompareReport", "Writer against reader, exactly over all layers and pages.")
      .def_ro("agree", &CompareReport::agree)
      .def_ro("elements", &CompareReport::elements)
      .def_ro("misplaced", &CompareReport::misplaced)
      .def_ro("codes_agree", &CompareReport::codes_agree)
      .def_prop_ro("misplaced_per_region", [](const CompareReport& r) { return per_region(r.misplaced_per_region); })
      .def_ro("examples", &CompareReport::examples)
      .def("summary", &CompareReport::summary, "writer_name"_a, "reader_name"_a);

  m.def("compare", &compare, "writer"_a, "reader"_a, "max_examples"_a = 5);

  nb::class_<Plan>(m, "Plan", "nvfp4kv's native layout for a model and a memory budget, with its capacity.")
      .def_ro("layout", &Plan::layout)
      .def_ro("heads_per_rank", &Plan::heads_per_rank)
      .def_ro("first_head", &Plan::first_head)
      .def_prop_ro(
          "rank_heads",
          [](const Plan& p) { return nb::module_::import_("builtins").attr("range")(p.first_head, p.first_head + p.heads_per_rank); },
          "The global kv heads this rank holds, as a range (it may be large).")
      .def_ro("bytes_per_page_per_layer", &Plan::bytes_per_page_per_layer)
      .def_ro("bytes_per_page", &Plan::bytes_per_page)
      .def_ro("token_capacity", &Plan::token_capacity)
      .def_ro("total_bytes", &Plan::total_bytes)
      .def("summary", &Plan::summary);

  m.def(
      "plan",
      [](int64_t layers, int64_t kv_heads, int64_t head_dim, int64_t tokens_per_page, std::optional<int64_t> memory_bytes,
         std::optional<int64_t> pages, int64_t tp_size, int64_t tp_rank, bool cross_layer, bool interleave_v_scales,
         const std::string& k_element, const std::string& v_element) {
        PlanRequest r;
        r.layers = layers;
        r.kv_heads = kv_heads;
        r.head_dim = head_dim;
        r.tokens_per_page = tokens_per_page;
        r.memory_bytes = memory_bytes;
        r.pages = pages;
        r.tp_size = tp_size;
        r.tp_rank = tp_rank;
        r.cross_layer = cross_layer;
        r.interleave_v_scales = interleave_v_scales;
        r.k_element = *element_arg(k_element, "plan: k_element");
        r.v_element = *element_arg(v_element, "plan: v_element");
        return plan(r);
      },
      "layers"_a, "kv_heads"_a, "head_dim"_a, "tokens_per_page"_a = 16, "memory_bytes"_a = nb::none(),
      "pages"_a = nb::none(), "tp_size"_a = 1, "tp_rank"_a = 0, "cross_layer"_a = false,
      "interleave_v_scales"_a = false, "k_element"_a = "nvfp4", "v_element"_a = "nvfp4");
}

}  // namespace nvfp4kv::python
