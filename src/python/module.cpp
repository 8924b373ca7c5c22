// nvfp4kv._core: the module, its exceptions and what it was built with.
#include <nanobind/stl/string.h>

#include <cctype>
#include <string>

#include "arrays.hpp"
#include "bindings.hpp"
#if NVFP4KV_HAVE_CUDA
#include "nvfp4kv/api/kv_cache.hpp"
#endif

namespace nb = nanobind;

namespace nvfp4kv::python {

namespace {

// The library words its messages for the CLI (--pages, --layout); from Python the same
// things are keyword arguments (pages=, layout=).
std::string keyword_message(std::string m) {
  static const char* const kFlags[] = {"tokens-per-page", "head-dim", "q-heads", "layers", "layer", "pages", "heads",
                                       "tokens", "layout", "dtype", "seed", "examples"};
  for (const char* flag : kFlags) {
    const std::string f = std::string("--") + flag;
    std::string keyword = std::string(flag) + "=";
    for (char& c : keyword) c = c == '-' ? '_' : c;
    for (size_t at = m.find(f); at != std::string::npos; at = m.find(f, at)) {
      const size_t end = at + f.size();
      if (end < m.size() && (std::isalnum(static_cast<unsigned char>(m[end])) || m[end] == '-')) {
        at = end;  // a longer flag (--tokens-per-page for --tokens)
        continue;
      }
      m.replace(at, f.size(), keyword);
      at += keyword.size();
    }
  }
  return m;
}

}  // namespace

void bind_errors(nb::module_& m) {
  // Most derived last: nanobind tries the newest translator first.
  auto error = nb::exception<Error>(m, "Error", PyExc_RuntimeError);
  auto layout_error = nb::exception<LayoutError>(m, "LayoutError", error);
  auto argument_error = nb::exception<ArgumentError>(m, "ArgumentError", error);
  nb::exception<UnsupportedError>(m, "UnsupportedError", error);
  nb::exception<CudaError>(m, "CudaError", error);
  // Newest of all: the two whose messages name arguments, said as keywords.
  static nb::handle layout_type = layout_error, argument_type = argument_error;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const LayoutError& e) {
      PyErr_SetString(layout_type.ptr(), keyword_message(e.what()).c_str());
    } catch (const ArgumentError& e) {
      PyErr_SetString(argument_type.ptr(), keyword_message(e.what()).c_str());
    }
  });
  // A Cache's buffers and global scales are DLPack arrays that keep the Cache alive; a
  // torch tensor made from one may outlive nanobind's own teardown at interpreter exit,
  // which nanobind would report as leaked instances. Python frees them; nothing leaks.
  nb::set_leak_warnings(false);
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
  m.attr("build_info") = NVFP4KV_BUILD_INFO;  // the same line as nvfp4kv --version
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
  m.attr("build_info") = NVFP4KV_BUILD_INFO;
  m.def(
      "cuda_device_available", [] { return nb::make_tuple(false, std::string("nvfp4kv was built without CUDA")); },
      "(available, why not): whether a CUDA device that runs the kernels is here.");
#endif
}
