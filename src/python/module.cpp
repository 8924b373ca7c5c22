// nvfp4kv._core: the module, its exceptions and what it was built with.
#include <nanobind/stl/string.h>

#include <string>

#include "arrays.hpp"
#include "bindings.hpp"
#if NVFP4KV_HAVE_CUDA
#include "nvfp4kv/api/kv_cache.hpp"
#endif

namespace nb = nanobind;

namespace nvfp4kv::python {

void bind_errors(nb::module_& m) {
  // Most derived last: nanobind tries the newest translator first.
  auto error = nb::exception<Error>(m, "Error", PyExc_RuntimeError);
  nb::exception<LayoutError>(m, "LayoutError", error);
  nb::exception<ArgumentError>(m, "ArgumentError", error);
  nb::exception<UnsupportedError>(m, "UnsupportedError", error);
  nb::exception<CudaError>(m, "CudaError", error);
}

}  // namespace nvfp4kv::python

NB_MODULE(_core, m) {
  using namespace nvfp4kv::python;
  m.doc() = "nvfp4kv's C++ library; use the nvfp4kv package, which wraps it.";
  bind_errors(m);
  bind_layouts(m);
  bind_reference(m);
  bind_cache(m);
  bind_conformance(m);
#if NVFP4KV_HAVE_CUDA
  m.attr("has_cuda") = true;
  m.attr("build_info") = "nvfp4kv " NVFP4KV_VERSION ": CUDA kernels for " NVFP4KV_CUDA_ARCHS
                         " (nvcc " NVFP4KV_NVCC_VERSION "), layouts, planning, the CPU reference";
  m.def(
      "cuda_device_available",
      [] {
        std::string why;
        const bool ok = nvfp4kv::cuda_device_available(&why);
        return nb::make_tuple(ok, why);
      },
      "(available, why not): whether a CUDA device that runs the kernels is here.");
#else
  m.attr("has_cuda") = false;
  m.attr("build_info") = "nvfp4kv " NVFP4KV_VERSION
                         ": CPU only (no CUDA compiler at build time): layouts, planning, the CPU reference";
  m.def(
      "cuda_device_available", [] { return nb::make_tuple(false, std::string("nvfp4kv was built without CUDA")); },
      "(available, why not): whether a CUDA device that runs the kernels is here.");
#endif
}
