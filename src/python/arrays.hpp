#pragma once
// The Python front end's argument checks: every array that crosses the boundary
// (DLPack: torch, CuPy, JAX, NumPy; no copy) is checked for shape, dtype,
// device, strides and alignment here, before anything is launched, and a
// failure raises ArgumentError naming the argument, what it is and what was
// expected. Nothing here computes a cache offset: that stays with the layout.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "nvfp4kv/core/error.hpp"
#include "nvfp4kv/core/half.hpp"

namespace nvfp4kv::python {

namespace nb = nanobind;
using Array = nb::ndarray<nb::ro>;       // any DLPack array, read-only or not
using OutArray = nb::ndarray<>;          // a writable one

// Where a cache lives: a CUDA device (its ordinal) or host memory (the CPU reference).
struct Place {
  bool cuda = false;
  int device = 0;
  std::string text() const { return cuda ? "cuda:" + std::to_string(device) : "cpu"; }
};

// DLPack dtype codes by number, so that older nanobind releases (without the
// float8 names) read them the same way.
enum class DType { kUInt8, kInt32, kInt64, kFloat32, kFloat16, kBFloat16, kE4M3, kOther };
DType dtype_of(const nb::dlpack::dtype& t);
const char* dtype_name(DType t);

// What the checks need of an array, read once from whichever ndarray type holds it.
struct ArrayFacts {
  const void* data = nullptr;
  std::vector<int64_t> shape, strides;  // strides in elements
  nb::dlpack::dtype dtype{};
  int device_type = 0, device_id = 0;
  size_t nbytes = 0;
  template <class... Ts>
  explicit ArrayFacts(const nb::ndarray<Ts...>& a)
      : data(a.data()), dtype(a.dtype()), device_type(a.device_type()), device_id(int(a.device_id())), nbytes(a.nbytes()) {
    for (size_t i = 0; i < a.ndim(); ++i) shape.push_back(int64_t(a.shape(i))), strides.push_back(a.stride(i));
  }
  size_t ndim() const { return shape.size(); }
};
std::string describe(const ArrayFacts& a);  // "cuda:0 bfloat16 array of shape (5, 8, 128)"

// The checks, each raising ArgumentError("NAME: ... got ...").
[[noreturn]] void fail(const std::string& name, const std::string& what);
void require_place(const ArrayFacts& a, const std::string& name, const Place& place);
void require_ndim(const ArrayFacts& a, const std::string& name, std::initializer_list<int64_t> shape_or_minus_one);
void require_dtype(const ArrayFacts& a, const std::string& name, const std::vector<DType>& allowed);
void require_contiguous(const ArrayFacts& a, const std::string& name);
void require_aligned(const void* p, const std::string& name, uintptr_t bytes);
// All four at once: on `place`, one of `dtypes`, of `shape` (-1: any), contiguous.
void require_dense(const ArrayFacts& a, const std::string& name, const Place& place, const std::vector<DType>& dtypes,
                   std::initializer_list<int64_t> shape);
// (rows, heads, D) with D and heads dense: returns the row stride in elements.
int64_t require_rows(const ArrayFacts& a, const std::string& name, int64_t heads, int64_t head_dim);

// bf16 / fp16 (and fp32 for the CPU reference) as the operation's ElementType.
ElementType element_type(DType t);

// Base pointers of arrays as the C++ API takes them.
template <class A>
uint8_t* bytes_of(const A& a) {
  return static_cast<uint8_t*>(const_cast<void*>(a.data()));
}

}  // namespace nvfp4kv::python
