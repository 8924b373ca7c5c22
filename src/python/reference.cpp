// The CPU reference for NumPy (and any CPU DLPack array): quantize dense
// (tokens, heads, D) tensors to E2M1 bytes and E4M3 scales, and back.
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <string>

#include "arrays.hpp"
#include "bindings.hpp"
#include "nvfp4kv/conformance/npy.hpp"
#include "nvfp4kv/core/global_scale.hpp"
#include "nvfp4kv/reference/calibrate.hpp"
#include "nvfp4kv/reference/quantize.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace nvfp4kv::python {
namespace {

using Bytes = nb::ndarray<nb::numpy, uint8_t>;
using Floats = nb::ndarray<nb::numpy, float>;

ScaleRule rule_arg(const std::string& rule) {
  if (rule == "standard") return ScaleRule::kStandard;
  if (rule == "4over6") return ScaleRule::kFourOverSix;
  throw ArgumentError("rule: expected \"standard\" or \"4over6\", got \"" + rule + "\"");
}

// A NumPy array that owns a copy of `bytes`.
template <class T, class Out>
Out numpy_copy(const std::vector<T>& values, std::initializer_list<size_t> shape) {
  auto* owned = new std::vector<T>(values);
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return Out(owned->data(), shape, owner);
}

const Place kHost{};

}  // namespace

void bind_reference(nb::module_& m) {
  m.def(
      "_calibrate",
      [](const std::map<std::string, Array>& named, double bits, const std::vector<double>& k_model_kl,
         const std::vector<double>& v_model_kl) {
        std::map<std::string, reference::SampleArray> arrays;
        for (const auto& [name, array] : named) {
          const ArrayFacts x(array);
          require_place(x, name, kHost);
          require_dtype(x, name, {DType::kFloat32});
          require_contiguous(x, name);
          reference::SampleArray& a = arrays[name];
          a.shape.assign(x.shape.begin(), x.shape.end());
          int64_t n = 1;
          for (int64_t d : a.shape) n *= d;
          const float* p = static_cast<const float*>(x.data);
          a.values.assign(p, p + n);
        }
        nb::gil_scoped_release unlocked;
        return calibration_to_json(
            reference::calibrate(reference::samples_from_arrays(arrays, "samples"), bits, {}, {k_model_kl, v_model_kl}));
      },
      "arrays"_a, "bits"_a, "k_model_kl"_a = std::vector<double>{}, "v_model_kl"_a = std::vector<double>{},
      "Calibration JSON from named float32 arrays k_L, v_L (and q_L); model KL of K and V: one per layer, or empty.");
  m.def(
      "_calibrate_file",
      [](const std::string& path, double bits, const std::vector<double>& k_model_kl,
         const std::vector<double>& v_model_kl) {
        nb::gil_scoped_release unlocked;
        return calibration_to_json(reference::calibrate(conformance::read_calibration_samples(path, "samples"), bits,
                                                        {}, {k_model_kl, v_model_kl}));
      },
      "path"_a, "bits"_a, "k_model_kl"_a = std::vector<double>{}, "v_model_kl"_a = std::vector<double>{}, "Calibration JSON from an .npz or .safetensors file of samples (as nvfp4kv calibrate reads it).");
  m.def(
      "_load_calibration",
      [](const std::string& path, int64_t layers, int64_t heads, int64_t head_dim) {
        const Calibration c = load_calibration(path);
        if (layers > 0)
          if (std::string why = calibration_mismatch(c, layers, heads, head_dim); !why.empty())
            throw ArgumentError(path + ": " + why);
        return calibration_to_json(c);
      },
      "path"_a, "layers"_a = 0, "heads"_a = 0, "head_dim"_a = 0,
      "A calibration file, checked (and against a cache's sizes when given), as normalized JSON.");

  m.def(
      "quantize",
      [](const Array& array, float global_scale, const std::string& rule) {
        const ArrayFacts x(array);
        require_place(x, "x", kHost);
        require_dtype(x, "x", {DType::kFloat32, DType::kFloat16, DType::kBFloat16});
        require_ndim(x, "x", {-1, -1, -1});
        require_contiguous(x, "x");
        const reference::DenseShape shape{x.shape[0], x.shape[1], x.shape[2]};
        reference::QuantizedTensor q;
        {
          nb::gil_scoped_release unlocked;
          q = reference::quantize(x.data, element_type(dtype_of(x.dtype)), shape, global_scale, rule_arg(rule));
        }
        const size_t t = size_t(x.shape[0]), h = size_t(x.shape[1]), d = size_t(x.shape[2]);
        return nb::make_tuple(numpy_copy<uint8_t, Bytes>(q.data, {t, h, d / 2}),
                              numpy_copy<uint8_t, Bytes>(q.scales, {t, h, d / 16}), q.non_finite);
      },
      "x"_a, "global_scale"_a, "rule"_a = "standard");

  m.def(
      "dequantize",
      [](const Array& data_array, const Array& scales_array, float global_scale) {
        const ArrayFacts data(data_array), scales(scales_array);
        require_place(data, "data", kHost);
        require_place(scales, "scales", kHost);
        require_dtype(data, "data", {DType::kUInt8});
        require_dtype(scales, "scales", {DType::kUInt8, DType::kE4M3});
        require_ndim(data, "data", {-1, -1, -1});
        const int64_t t = data.shape[0], h = data.shape[1], d = 2 * data.shape[2];
        require_ndim(scales, "scales", {t, h, d / 16});
        if (d % 16 != 0) fail("data", "its last dim (D/2 bytes) must be a multiple of 8, got " + std::to_string(d / 2));
        require_contiguous(data, "data");
        require_contiguous(scales, "scales");
        require_valid_global_scale(global_scale, "global_scale");
        reference::QuantizedTensor q;
        q.shape = {t, h, d};
        q.data.assign(bytes_of(data_array), bytes_of(data_array) + data.nbytes);
        q.scales.assign(bytes_of(scales_array), bytes_of(scales_array) + scales.nbytes);
        std::vector<float> out;
        {
          nb::gil_scoped_release unlocked;
          out = reference::dequantize(q, global_scale);
        }
        return numpy_copy<float, Floats>(out, {size_t(t), size_t(h), size_t(d)});
      },
      "data"_a, "scales"_a, "global_scale"_a);

  m.def("recommend_global_scale", &recommend_global_scale, "amax"_a);
}

}  // namespace nvfp4kv::python
