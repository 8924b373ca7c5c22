#pragma once
// NumPy's .npy files (format version 1.0 written; 1.0, 2.0 and 3.0 read): the
// arrays of the conformance kit, readable by any engine's test without nvfp4kv.
// Little-endian, C order. NumPy has no bfloat16: bf16 arrays are written as
// '<u2' bit patterns (torch: torch.from_numpy(a).view(torch.bfloat16)) and read
// from '<u2', '<i2' or a 2-byte void type ('|V2', as ml_dtypes' bfloat16 saves).
#include <cstdint>
#include <string>
#include <vector>

#include "nvfp4kv/core/half.hpp"
#include "nvfp4kv/reference/calibrate.hpp"

namespace nvfp4kv::conformance {

struct NpyArray {
  std::string descr;           // "<f4", "<f2", "<u2", "<i4", "<i8", "|u1", ...
  std::vector<int64_t> shape;  // () for a scalar
  std::vector<uint8_t> bytes;  // the elements, C order, little-endian
  int64_t elements() const;
  int item_bytes() const;      // from descr
};

// Throws Error naming the file when it cannot be written.
void write_npy(const std::string& path, const NpyArray& array);
// Throws Error naming the file and what is wrong: not a regular file, not .npy, a
// big-endian or Fortran-order array, a shape that does not match the data, a header
// past 64 KiB, data past 4 GiB. Sizes are checked from the header and stat before
// the data is read.
NpyArray read_npy(const std::string& path);
// An array a reader produced, as floats: exactly `shape`, float32, float16 or bf16
// (npy_to_floats' types), anything else refused before its data is read. `what`
// names the file in messages ("--k").
std::vector<float> read_npy_floats(const std::string& path, const std::vector<int64_t>& shape, const std::string& what);

// The arrays of an .npz (numpy.savez: a zip of .npy members, stored, ZIP64 sizes read), in file
// order, each float32, float16 or bf16 as read_npy_floats takes them; names without ".npy".
// The file (at most max_bytes) is read whole. Throws Error naming the file and the member:
// compressed members (savez_compressed), truncation, other element types.
struct NpzMember {
  std::string name;
  NpyArray array;
};
std::vector<NpzMember> read_npz(const std::string& path, int64_t max_bytes, const std::string& what);

// The tensors of a .safetensors file (an 8-byte little-endian header length, a JSON header of
// {name: {dtype, shape, data_offsets}}, then the data), by name; F32, F16 and BF16 only, each as
// an NpyArray ('<f4', '<f2', and bf16 as '<u2' bit patterns) that npy_to_floats reads. The file
// (at most max_bytes) is read whole. Throws Error naming the file and the tensor: a header past
// the file or 100 MiB, a malformed header, another dtype, a shape that does not match its bytes,
// offsets outside the data. Each tensor is read by its own offsets (tensors that overlap or leave
// gaps, which the format's writers never produce, are not refused).
std::vector<NpzMember> read_safetensors(const std::string& path, int64_t max_bytes, const std::string& what);
// read_npz for a zip (an .npz: the file begins with "PK\3\4"), read_safetensors for anything else.
std::vector<NpzMember> read_array_file(const std::string& path, int64_t max_bytes, const std::string& what);

// Calibration samples (k_L, v_L, optionally q_L) from an .npz or a .safetensors file
// (read_array_file, at most kMaxSampleFileBytes), checked by name and shape
// (reference::samples_from_arrays). The CLI and the Python package read them through this.
inline constexpr int64_t kMaxSampleFileBytes = int64_t(8) << 30;
reference::CalibrationSamples read_calibration_samples(const std::string& path, const std::string& what);

NpyArray npy_f32(const std::vector<float>& values, std::vector<int64_t> shape);
NpyArray npy_i32(const std::vector<int32_t>& values, std::vector<int64_t> shape);
NpyArray npy_i64(const std::vector<int64_t>& values, std::vector<int64_t> shape);
// 16-bit elements: bf16 as '<u2' bit patterns, fp16 as '<f2'.
NpyArray npy_16bit(const std::vector<uint16_t>& values, ElementType type, std::vector<int64_t> shape);

// The elements as floats: '<f4', '<f2', and 16-bit integer or void types
// taken as bf16 bit patterns. Throws Error naming `what` for anything else.
std::vector<float> npy_to_floats(const NpyArray& array, const std::string& what);

}  // namespace nvfp4kv::conformance
