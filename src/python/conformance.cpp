// The conformance kit from Python (docs/conformance.md): generate or load a kit,
// check an engine's dumped buffers and its reader's output against it. NumPy in,
// the library's reports out; python/nvfp4kv/conformance.py wraps these.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "nvfp4kv/conformance/check.hpp"
#include "nvfp4kv/core/names.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace nvfp4kv::python {
namespace {

using conformance::Kit;
using conformance::ReadReport;
using conformance::WriteReport;
using View = nb::ndarray<nb::numpy, nb::ro>;

const Place kHost{};

// A read-only NumPy view of one of the kit's arrays, keeping the kit alive.
template <class T>
View view(nb::handle kit, const std::vector<T>& values, std::initializer_list<size_t> shape,
          nb::dlpack::dtype type = nb::dtype<T>()) {
  return View(values.data(), shape, kit, {}, type);
}

const Kit& kit_of(nb::handle self) { return nb::cast<const Kit&>(self); }

// A getter of a one-dimensional member as a view.
template <class T>
auto flat_view(std::vector<T> Kit::*member) {
  return [member](nb::handle self) {
    const std::vector<T>& values = kit_of(self).*member;
    return view(self, values, {values.size()});
  };
}

// bf16 rows as their uint16 bit patterns (NumPy has no bf16), fp16 as float16: the kit's .npy files.
View rows16(nb::handle self, const std::vector<uint16_t>& values, int64_t rows, int64_t heads) {
  const Kit& kit = kit_of(self);
  const nb::dlpack::dtype fp16{uint8_t(nb::dlpack::dtype_code::Float), 16, 1};
  return view(self, values, {size_t(rows), size_t(heads), size_t(kit.dims().head_dim)},
              kit.options.type == ElementType::kFloat16 ? fp16 : nb::dtype<uint16_t>());
}

int examples_arg(int max_examples) {
  if (max_examples < 0 || max_examples > 10000)
    throw ArgumentError("max_examples: expected 0 to 10000, got " + std::to_string(max_examples));
  return max_examples;
}

// One dump, as check_write takes it: a host uint8 array, contiguous, exactly the buffer's bytes.
std::vector<uint8_t> dump_of(nb::handle h, const std::string& name, const Buffer& buffer) {
  Array array;
  if (!nb::try_cast(h, array))
    fail(name,
         "expected a uint8 array (NumPy or any CPU DLPack array), got " + std::string(nb::type_name(h.type()).c_str()));
  const ArrayFacts a(array);
  require_place(a, name, kHost);
  require_dtype(a, name, {DType::kUInt8});
  require_contiguous(a, name);
  if (int64_t(a.nbytes) != buffer.bytes)
    fail(name, "holds " + std::to_string(a.nbytes) + " bytes; buffer \"" + buffer.name + "\" of the layout is " +
                   std::to_string(buffer.bytes) + (buffer.per_layer ? " (one layer's allocation)" : ""));
  const uint8_t* p = bytes_of(array);
  return {p, p + a.nbytes};
}

// The engine's buffers: a list (or tuple) of one array per layout buffer, in the
// layout's order; a dict of buffer name -> array; or one array for a one-buffer layout.
std::vector<std::vector<uint8_t>> dumps_of(const Kit& kit, nb::handle buffers) {
  const Layout& l = kit.layout();
  std::vector<std::string> names;
  std::string listed;
  for (const Buffer& b : l.buffers) {
    names.push_back(b.name);
    listed += (listed.empty() ? "\"" : ", \"") + b.name + "\"";
  }
  std::vector<std::vector<uint8_t>> dumps;
  if (nb::isinstance<nb::dict>(buffers)) {
    const nb::dict given = nb::borrow<nb::dict>(buffers);
    for (auto [key, value] : given) {
      if (!nb::isinstance<nb::str>(key)) fail("buffers", "dict keys are the layout's buffer names (" + listed + ")");
      const std::string name = nb::cast<std::string>(key);
      if (std::find(names.begin(), names.end(), name) == names.end())
        fail("buffers",
             "the layout has no buffer \"" + name + "\"" + did_you_mean(name, names) + "; its buffers: " + listed);
    }
    for (size_t i = 0; i < names.size(); ++i) {
      if (!given.contains(names[i].c_str()))
        fail("buffers",
             "no array for buffer \"" + names[i] + "\": the writer's copy of every buffer (" + listed + ") is needed");
      dumps.push_back(dump_of(given[names[i].c_str()], "buffers[\"" + names[i] + "\"]", l.buffers[i]));
    }
    return dumps;
  }
  if (nb::isinstance<nb::list>(buffers) || nb::isinstance<nb::tuple>(buffers)) {
    if (nb::len(buffers) != names.size())
      fail("buffers", "expected " + std::to_string(names.size()) + " array(s), one per layout buffer (" + listed +
                          "), got " + std::to_string(nb::len(buffers)));
    for (size_t i = 0; i < names.size(); ++i)
      dumps.push_back(dump_of(buffers[i], "buffers[" + std::to_string(i) + "]", l.buffers[i]));
    return dumps;
  }
  if (names.size() != 1)
    fail("buffers", "the layout has " + std::to_string(names.size()) + " buffers (" + listed +
                        "): give a list of one array per buffer, or a dict of name -> array");
  dumps.push_back(dump_of(buffers, "buffers", l.buffers[0]));
  return dumps;
}

// A reader's output as the floats check-read takes: a host float32, float16 or
// bfloat16 array of `shape`, contiguous.
std::vector<float> floats_of(const Array& array, const std::string& name, std::initializer_list<int64_t> shape) {
  const ArrayFacts a(array);
  require_dense(a, name, kHost, {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, shape);
  const ElementType type = element_type(dtype_of(a.dtype));
  size_t n = 1;
  for (int64_t s : a.shape) n *= size_t(s);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = element_to_float(a.data, int64_t(i), type);
  return out;
}

std::string dtype_text(ElementType t) { return t == ElementType::kFloat16 ? "fp16" : "bf16"; }

void bind_kit(nb::module_& m) {
  nb::class_<Kit>(m, "ConformanceKit", "A conformance kit (docs/conformance.md); nvfp4kv.conformance.Kit wraps it.")
      .def_prop_ro("layout", [](const Kit& k) { return *k.valid; })
      .def_prop_ro("dtype", [](const Kit& k) { return dtype_text(k.options.type); })
      .def_prop_ro("layer", [](const Kit& k) { return k.options.layer; })
      .def_prop_ro("seed", [](const Kit& k) { return k.options.seed; })
      .def_ro("k_global_scale", &Kit::k_global_scale)
      .def_ro("v_global_scale", &Kit::v_global_scale)
      .def_ro("rows", &Kit::rows)
      .def_prop_ro("k", [](nb::handle s) { return rows16(s, kit_of(s).k, kit_of(s).rows, kit_of(s).dims().heads); })
      .def_prop_ro("v", [](nb::handle s) { return rows16(s, kit_of(s).v, kit_of(s).rows, kit_of(s).dims().heads); })
      .def_prop_ro("slots", flat_view(&Kit::slots))
      .def_prop_ro("row_sequence", flat_view(&Kit::row_sequence))
      .def_prop_ro("row_position", flat_view(&Kit::row_position))
      .def_prop_ro(
          "sequences",
          [](const Kit& k) {
            std::vector<std::tuple<std::vector<int32_t>, int64_t, int64_t>> out;
            for (const conformance::KitSequence& s : k.sequences) out.emplace_back(s.pages, s.length, s.first_read_row);
            return out;
          },
          "(pages, length, first_read_row) of each sequence.")
      .def_prop_ro(
          "cache",
          [](nb::handle s) {
            const Kit& k = kit_of(s);
            nb::list out;
            for (const std::vector<uint8_t>& b : k.cache) out.append(view(s, b, {b.size()}));
            return out;
          },
          "The expected buffers, one flat uint8 view per layout buffer.")
      .def_prop_ro("read_rows", flat_view(&Kit::read_rows))
      .def_prop_ro("read_k",
                   [](nb::handle s) {
                     const Kit& k = kit_of(s);
                     return view(s, k.read_k, {k.read_rows.size(), size_t(k.dims().heads), size_t(k.dims().head_dim)});
                   })
      .def_prop_ro("read_v",
                   [](nb::handle s) {
                     const Kit& k = kit_of(s);
                     return view(s, k.read_v, {k.read_rows.size(), size_t(k.dims().heads), size_t(k.dims().head_dim)});
                   })
      .def_ro("q_heads", &Kit::q_heads)
      .def_ro("softmax_scale", &Kit::softmax_scale)
      .def_prop_ro("q", [](nb::handle s) { return rows16(s, kit_of(s).q, kit_of(s).probes(), kit_of(s).q_heads); })
      .def_prop_ro("probe_sequence", flat_view(&Kit::probe_sequence))
      .def_prop_ro("probe_position", flat_view(&Kit::probe_position))
      .def_prop_ro("probe_isolates",
                   [](nb::handle s) {
                     const Kit& k = kit_of(s);
                     return view(s, k.probe_isolates, {size_t(k.probes()), size_t(k.q_heads)});
                   })
      .def_prop_ro("expected_out",
                   [](nb::handle s) {
                     const Kit& k = kit_of(s);
                     return view(s, k.expected_out, {size_t(k.probes()), size_t(k.q_heads), size_t(k.dims().head_dim)});
                   })
      .def_ro("scale_rows_unique", &Kit::scale_rows_unique)
      .def_ro("probe_blocks", &Kit::probe_blocks)
      .def_prop_ro("bytes_differing",
                   [](const Kit& k) {
                     nb::dict d;
                     for (int p = 0; p < conformance::kRoundingPolicyCount; ++p)
                       d[conformance::policy_name(conformance::RoundingPolicy(p))] = k.bytes_differing[size_t(p)];
                     return d;
                   })
      .def(
          "write",
          [](const Kit& k, const std::string& dir) {
            nb::gil_scoped_release unlocked;
            conformance::write_kit(k, dir);
          },
          "dir"_a);
}

void bind_reports(nb::module_& m) {
  nb::class_<WriteReport>(m, "ConformanceWriteReport",
                          "check_write's report; nvfp4kv.conformance.WriteReport wraps it.")
      .def_prop_ro("ok", &WriteReport::ok)
      .def("text", &WriteReport::text)
      .def("json", &WriteReport::json)
      .def_ro("writer_layout", &WriteReport::writer_layout)
      .def_prop_ro("writer_layout_json",
                   [](const WriteReport& r) -> std::optional<std::string> {
                     if (!r.writer_layout) return std::nullopt;
                     return to_json(*r.writer_layout);
                   })
      .def_ro("writer_layout_check", &WriteReport::writer_layout_check);

  nb::class_<ReadReport>(m, "ConformanceReadReport", "check_read's report; nvfp4kv.conformance.ReadReport wraps it.")
      .def_prop_ro("ok", &ReadReport::ok)
      .def_ro("mode", &ReadReport::mode)
      .def("text", &ReadReport::text)
      .def("json", &ReadReport::json)
      .def_ro("reader_layout", &ReadReport::reader_layout)
      .def_prop_ro("reader_layout_json", [](const ReadReport& r) -> std::optional<std::string> {
        if (!r.reader_layout) return std::nullopt;
        return to_json(*r.reader_layout);
      });
}

}  // namespace

void bind_conformance(nb::module_& m) {
  bind_kit(m);
  bind_reports(m);
  m.attr("conformance_poison") = conformance::kPoison;

  m.def(
      "conformance_kit_dims",
      [](const std::string& dir) {
        const CacheDims d = conformance::read_manifest(dir).dims;
        return std::make_tuple(d.layers, d.pages, d.tokens_per_page, d.heads, d.head_dim);
      },
      "dir"_a, "(layers, pages, tokens_per_page, heads, head_dim) of the kit in dir, from its manifest.");

  m.def(
      "conformance_generate",
      [](const ValidLayout& layout, int64_t tokens, const std::string& dtype, int64_t layer, int64_t q_heads,
         uint64_t seed) {
        if (tokens < 0)
          throw ArgumentError("tokens: expected 0 (half the cache, at most 512) or a count, got " +
                              std::to_string(tokens));
        if (q_heads < 0)
          throw ArgumentError("q_heads: expected 0 (the kv heads) or a count, got " + std::to_string(q_heads));
        if (dtype != "bf16" && dtype != "fp16")
          throw ArgumentError("dtype: expected \"bf16\" or \"fp16\", got \"" + dtype + "\"");
        conformance::KitOptions o;
        o.tokens = tokens;
        o.type = dtype == "fp16" ? ElementType::kFloat16 : ElementType::kBFloat16;
        o.layer = layer;
        o.q_heads = q_heads;
        o.seed = seed;
        nb::gil_scoped_release unlocked;
        return conformance::generate(layout, o);
      },
      "layout"_a, "tokens"_a, "dtype"_a, "layer"_a, "q_heads"_a, "seed"_a);

  m.def(
      "conformance_load_kit",
      [](const std::string& dir, const ValidLayout& layout) {
        nb::gil_scoped_release unlocked;
        return conformance::load_kit(dir, layout);
      },
      "dir"_a, "layout"_a);

  m.def(
      "conformance_check_write",
      [](const Kit& kit, nb::handle buffers, int max_examples) {
        const int n = examples_arg(max_examples);
        const std::vector<std::vector<uint8_t>> dumps = dumps_of(kit, buffers);
        nb::gil_scoped_release unlocked;
        return conformance::check_write(kit, dumps, n);
      },
      "kit"_a, "buffers"_a, "max_examples"_a);

  m.def(
      "conformance_check_read_rows",
      [](const Kit& kit, const Array& k, const Array& v, int max_examples) {
        const int n = examples_arg(max_examples);
        const int64_t R = int64_t(kit.read_rows.size()), H = kit.dims().heads, D = kit.dims().head_dim;
        const std::vector<float> kf = floats_of(k, "k", {R, H, D}), vf = floats_of(v, "v", {R, H, D});
        nb::gil_scoped_release unlocked;
        return conformance::check_read_rows(kit, kf, vf, n);
      },
      "kit"_a, "k"_a, "v"_a, "max_examples"_a);

  m.def(
      "conformance_check_read_attention",
      [](const Kit& kit, const Array& out, int max_examples) {
        const int n = examples_arg(max_examples);
        const std::vector<float> o = floats_of(out, "out", {kit.probes(), kit.q_heads, kit.dims().head_dim});
        nb::gil_scoped_release unlocked;
        return conformance::check_read_attention(kit, o, n);
      },
      "kit"_a, "out"_a, "max_examples"_a);
}

}  // namespace nvfp4kv::python
