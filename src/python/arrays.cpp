#include "arrays.hpp"

#include <sstream>

namespace nvfp4kv::python {

DType dtype_of(const nb::dlpack::dtype& t) {
  if (t.lanes != 1) return DType::kOther;
  const int code = t.code, bits = t.bits;
  if (code == 1 && bits == 8) return DType::kUInt8;
  if (code == 0 && bits == 32) return DType::kInt32;
  if (code == 0 && bits == 64) return DType::kInt64;
  if (code == 2 && bits == 32) return DType::kFloat32;
  if (code == 2 && bits == 16) return DType::kFloat16;
  if (code == 4 && bits == 16) return DType::kBFloat16;
  if (code == 10 && bits == 8) return DType::kE4M3;  // kDLFloat8_e4m3fn
  return DType::kOther;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kUInt8: return "uint8";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kE4M3: return "float8_e4m3fn";
    default: return "an unsupported dtype";
  }
}

namespace {

std::string device_text(const ArrayFacts& a) {
  switch (a.device_type) {
    case nb::device::cpu::value: return "cpu";
    case nb::device::cuda::value: return "cuda:" + std::to_string(a.device_id);
    case nb::device::cuda_host::value: return "cuda_host";
    case nb::device::cuda_managed::value: return "cuda_managed:" + std::to_string(a.device_id);
    default: return "device type " + std::to_string(a.device_type);
  }
}

std::string shape_text(const ArrayFacts& a) {
  std::ostringstream s;
  s << "(";
  for (size_t i = 0; i < a.ndim(); ++i) s << (i ? ", " : "") << a.shape[i];
  s << (a.ndim() == 1 ? ",)" : ")");
  return s.str();
}

}  // namespace

std::string describe(const ArrayFacts& a) {
  const nb::dlpack::dtype t = a.dtype;
  const DType d = dtype_of(t);
  // DLPack's codes by number: 0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool (NumPy's and torch's names).
  static const char* const kCodeNames[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  std::string dt = dtype_name(d);
  if (d == DType::kOther) {
    dt = t.code == 6 ? std::string("bool")
         : t.code < 7 ? kCodeNames[t.code] + std::to_string(t.bits)
                      : "dtype code " + std::to_string(t.code) + " of " + std::to_string(t.bits) + " bits";
    if (t.lanes != 1) dt += " x" + std::to_string(t.lanes);
  }
  return device_text(a) + " " + dt + " array of shape " + shape_text(a);
}

void fail(const std::string& name, const std::string& what) { throw ArgumentError(name + ": " + what); }

void require_place(const ArrayFacts& a, const std::string& name, const Place& place) {
  const int t = a.device_type;
  const bool ok = place.cuda ? ((t == nb::device::cuda::value || t == nb::device::cuda_managed::value) &&
                                a.device_id == place.device)
                             : (t == nb::device::cpu::value || t == nb::device::cuda_host::value);
  if (!ok) fail(name, "must be on the cache's device " + place.text() + ", got a " + describe(a));
}

void require_ndim(const ArrayFacts& a, const std::string& name, std::initializer_list<int64_t> shape) {
  bool ok = a.ndim() == shape.size();
  size_t i = 0;
  for (int64_t want : shape) {
    if (ok && want >= 0 && a.shape[i] != want) ok = false;
    ++i;
  }
  if (ok) return;
  std::ostringstream s;
  s << "expected shape (";
  i = 0;
  for (int64_t want : shape) s << (i++ ? ", " : "") << (want >= 0 ? std::to_string(want) : std::string("*"));
  s << (shape.size() == 1 ? ",)" : ")") << ", got a " << describe(a);
  fail(name, s.str());
}

void require_dtype(const ArrayFacts& a, const std::string& name, const std::vector<DType>& allowed) {
  const DType d = dtype_of(a.dtype);
  std::string list;
  for (DType t : allowed) {
    if (t == d) return;
    list += (list.empty() ? "" : " or ") + std::string(dtype_name(t));
  }
  fail(name, "expected " + list + ", got a " + describe(a));
}

void require_contiguous(const ArrayFacts& a, const std::string& name) {
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape[i] != 1 && a.strides[i] != expect)
      fail(name, "must be contiguous (row-major, no gaps), got strides that are not, for a " + describe(a));
    expect *= a.shape[i];
  }
}

void require_dense(const ArrayFacts& a, const std::string& name, const Place& place, const std::vector<DType>& dtypes,
                   std::initializer_list<int64_t> shape) {
  require_place(a, name, place);
  require_dtype(a, name, dtypes);
  require_ndim(a, name, shape);
  require_contiguous(a, name);
}

void require_aligned(const void* p, const std::string& name, uintptr_t bytes) {
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0)
    fail(name, "must start at a " + std::to_string(bytes) + "-byte aligned address (the kernels read it in " +
                   std::to_string(bytes) + "-byte pieces)");
}

int64_t require_rows(const ArrayFacts& a, const std::string& name, int64_t heads, int64_t head_dim) {
  require_ndim(a, name, {-1, heads, head_dim});
  if (a.shape[2] > 1 && a.strides[2] != 1)
    fail(name, "the head dim must be contiguous (stride 1), got stride " + std::to_string(a.strides[2]));
  if (a.shape[1] > 1 && a.strides[1] != head_dim)
    fail(name, "heads must be packed (stride D = " + std::to_string(head_dim) + "), got stride " +
                   std::to_string(a.strides[1]));
  const int64_t row = a.shape[0] > 1 ? a.strides[0] : heads * head_dim;
  if (row < heads * head_dim)
    fail(name, "rows overlap: token stride " + std::to_string(row) + " < heads * D = " + std::to_string(heads * head_dim));
  return row;
}

ElementType element_type(DType t) {
  return t == DType::kBFloat16 ? ElementType::kBFloat16 : t == DType::kFloat16 ? ElementType::kFloat16 : ElementType::kFloat32;
}

}  // namespace nvfp4kv::python
