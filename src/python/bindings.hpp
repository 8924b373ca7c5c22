#pragma once
// The Python extension nvfp4kv._core, one file per part of the library it
// exposes; python/nvfp4kv wraps it (streams, frameworks, the layout contract).
#include <nanobind/nanobind.h>

#include "nvfp4kv/core/error.hpp"

namespace nvfp4kv::python {

void bind_errors(nanobind::module_& m);       // module.cpp
void bind_layouts(nanobind::module_& m);      // layouts.cpp
void bind_reference(nanobind::module_& m);    // reference.cpp
void bind_cache(nanobind::module_& m);        // cache.cpp
void bind_conformance(nanobind::module_& m);  // conformance.cpp

// Launcher failures (api/result.hpp) as Python exceptions.
struct UnsupportedError : Error {
  using Error::Error;
};
struct CudaError : Error {
  using Error::Error;
};

}  // namespace nvfp4kv::python
