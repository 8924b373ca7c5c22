#include "nvfp4kv/conformance/npy.hpp"

#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "nvfp4kv/core/error.hpp"

namespace nvfp4kv::conformance {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMaxHeader = 65536;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += std::to_string(shape[i]) + (shape.size() == 1 ? "," : i + 1 < shape.size() ? ", " : "");
  return s + ")";
}

template <typename T>
NpyArray npy_of(const std::vector<T>& values, const char* descr, std::vector<int64_t> shape) {
  NpyArray a{descr, std::move(shape), std::vector<uint8_t>(values.size() * sizeof(T))};
  if (!values.empty()) std::memcpy(a.bytes.data(), values.data(), a.bytes.size());  // little-endian hosts only
  return a;
}

// The value of `key` in the header dictionary: the text from after "'key':" up to
// its end (a quoted string, True/False, or a parenthesised tuple).
std::string dict_value(const std::string& header, const std::string& key, const std::string& path) {
  const size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) throw ArgumentError(path + ": .npy header has no '" + key + "'");
  size_t i = header.find(':', k);
  if (i == std::string::npos) throw ArgumentError(path + ": .npy header is malformed near '" + key + "'");
  ++i;
  while (i < header.size() && header[i] == ' ') ++i;
  if (i >= header.size()) throw ArgumentError(path + ": .npy header ends after '" + key + "'");
  if (header[i] == '\'' || header[i] == '"') {
    const size_t end = header.find(header[i], i + 1);
    if (end == std::string::npos) throw ArgumentError(path + ": .npy header has an unterminated string");
    return header.substr(i + 1, end - i - 1);
  }
  if (header[i] == '(') {
    const size_t end = header.find(')', i);
    if (end == std::string::npos) throw ArgumentError(path + ": .npy header has an unterminated shape");
    return header.substr(i, end - i + 1);
  }
  size_t end = i;
  while (end < header.size() && header[end] != ',' && header[end] != '}') ++end;
  return header.substr(i, end - i);
}

}  // namespace

int64_t NpyArray::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int NpyArray::item_bytes() const {
  if (descr.size() < 3) return 0;
  try {
    return std::stoi(descr.substr(2));
  } catch (const std::exception&) {
    return 0;
  }
}

void write_npy(const std::string& path, const NpyArray& a) {
  std::string dict = "{'descr': '" + a.descr + "', 'fortran_order': False, 'shape': " + shape_text(a.shape) + ", }";
  // Magic (6) + version (2) + length (2) + dictionary, padded with spaces and a
  // newline to a multiple of 64 bytes, as NumPy writes it.
  const size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) throw ArgumentError("cannot write " + path);
  out.write(kMagic, 6);
  const char version[2] = {1, 0};
  out.write(version, 2);
  const uint16_t len = uint16_t(dict.size());
  const char len_bytes[2] = {char(len & 0xFF), char(len >> 8)};
  out.write(len_bytes, 2);
  out << dict;
  out.write(reinterpret_cast<const char*>(a.bytes.data()), std::streamsize(a.bytes.size()));
  if (!out) throw ArgumentError("cannot write " + path);
}

NpyArray read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ArgumentError("cannot read " + path);
  char head[10];
  if (!in.read(head, 10) || std::memcmp(head, kMagic, 6) != 0) throw ArgumentError(path + " is not a .npy file");
  const int major = head[6];
  size_t header_len = uint8_t(head[8]) | size_t(uint8_t(head[9])) << 8;
  if (major == 2 || major == 3) {
    char more[2];
    if (!in.read(more, 2)) throw ArgumentError(path + ": truncated .npy header");
    header_len |= size_t(uint8_t(more[0])) << 16 | size_t(uint8_t(more[1])) << 24;
  } else if (major != 1) {
    throw ArgumentError(path + ": .npy format version " + std::to_string(major) + " is not supported (1, 2, 3 are)");
  }
  if (header_len > kMaxHeader) throw ArgumentError(path + ": .npy header of " + std::to_string(header_len) + " bytes is past 64 KiB");
  std::string header(header_len, '\0');
  if (!in.read(header.data(), std::streamsize(header_len))) throw ArgumentError(path + ": truncated .npy header");
  NpyArray a;
  a.descr = dict_value(header, "descr", path);
  if (dict_value(header, "fortran_order", path).find("False") == std::string::npos)
    throw ArgumentError(path + ": Fortran-order arrays are not supported; save it with np.ascontiguousarray");
  if (a.descr.size() < 3 || (a.descr[0] != '<' && a.descr[0] != '|') || a.item_bytes() < 1 || a.item_bytes() > 16)
    throw ArgumentError(path + ": element type '" + a.descr + "' is not a little-endian scalar type");
  const std::string shape = dict_value(header, "shape", path);
  std::stringstream s(shape.substr(1, shape.size() - 2));
  std::string item;
  __extension__ typedef __int128 i128;
  i128 count = 1;
  while (std::getline(s, item, ',')) {
    if (item.find_first_not_of(' ') == std::string::npos) continue;
    int64_t d = -1;
    try {
      d = std::stoll(item);
    } catch (const std::exception&) {
    }
    if (d < 0) throw ArgumentError(path + ": .npy shape " + shape + " is not a tuple of sizes");
    a.shape.push_back(d);
    count *= d;
    if (count > (i128(1) << 40)) throw ArgumentError(path + ": .npy shape " + shape + " is too large");
  }
  const i128 want = count * a.item_bytes();
  a.bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (i128(a.bytes.size()) != want)
    throw ArgumentError(path + ": shape " + shape + " of '" + a.descr + "' needs " + std::to_string(int64_t(want)) +
                " bytes of data, the file holds " + std::to_string(a.bytes.size()));
  return a;
}

NpyArray npy_f32(const std::vector<float>& v, std::vector<int64_t> shape) { return npy_of(v, "<f4", std::move(shape)); }
NpyArray npy_i32(const std::vector<int32_t>& v, std::vector<int64_t> shape) { return npy_of(v, "<i4", std::move(shape)); }
NpyArray npy_i64(const std::vector<int64_t>& v, std::vector<int64_t> shape) { return npy_of(v, "<i8", std::move(shape)); }
NpyArray npy_16bit(const std::vector<uint16_t>& v, ElementType type, std::vector<int64_t> shape) {
  return npy_of(v, type == ElementType::kFloat16 ? "<f2" : "<u2", std::move(shape));
}

std::vector<float> npy_to_floats(const NpyArray& a, const std::string& what) {
  const size_t n = size_t(a.elements());
  std::vector<float> out(n);
  const uint8_t* p = a.bytes.data();
  const std::string kind = a.descr.substr(1);
  if (kind == "f4") {
    std::memcpy(out.data(), p, n * 4);
  } else if (kind == "f8") {
    for (size_t i = 0; i < n; ++i) {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      out[i] = float(d);
    }
  } else if (kind == "f2" || kind == "u2" || kind == "i2" || kind == "V2") {
    for (size_t i = 0; i < n; ++i) {
      const uint16_t b = uint16_t(p[2 * i] | p[2 * i + 1] << 8);
      out[i] = kind == "f2" ? fp16_to_float(b) : bf16_to_float(b);
    }
  } else {
    throw ArgumentError(what + ": element type '" + a.descr +
                "' is not float32, float16 or bfloat16 (bf16 as '<u2'/'<i2' bit patterns or a 2-byte void type)");
  }
  return out;
}

}  // namespace nvfp4kv::conformance
