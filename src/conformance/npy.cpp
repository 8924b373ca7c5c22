#include "nvfp4kv/conformance/npy.hpp"

#include <cstring>
#include <map>
#include <fstream>
#include <sstream>

#include "nvfp4kv/core/error.hpp"
#include "nvfp4kv/core/files.hpp"
#include "nvfp4kv/core/layout.hpp"
#include "../core/strict_json.hpp"

namespace nvfp4kv::conformance {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMaxHeader = 65536;
constexpr int64_t kMaxNpyBytes = int64_t(1) << 32;  // 4 GiB: far past any kit array

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

namespace {

// The kinds npy_to_floats converts (after the byte-order character).
bool float_kind(const std::string& descr) {
  const std::string k = descr.substr(1);
  return k == "f4" || k == "f2" || k == "u2" || k == "i2" || k == "V2";
}

const char* kFloatKinds = "float32, float16 or bfloat16 (bf16 as '<u2'/'<i2' bit patterns or a 2-byte void type)";

// An .npy held in memory (a member of an .npz), read as RegularFile reads a file.
class MemorySource {
 public:
  MemorySource(const uint8_t* data, int64_t size, std::string label) : data_(data), size_(size), label_(std::move(label)) {}
  int64_t size() const { return size_; }
  int64_t remaining() const { return size_ - position_; }
  void read(void* to, int64_t bytes) {
    if (bytes > remaining()) throw ArgumentError(label_ + ": truncated");
    std::memcpy(to, data_ + position_, size_t(bytes));
    position_ += bytes;
  }
  const std::string& label() const { return label_; }

 private:
  const uint8_t* data_;
  int64_t size_, position_ = 0;
  std::string label_;
};

// read_npy from `in` (a RegularFile or a MemorySource), refusing data past `max_data_bytes`
// and, given `want_shape`, any other shape, and with `floats_only` any type npy_to_floats does
// not take: all before the data is read. The size must be the header's plus the shape's before
// a byte of the data is read or allocated.
template <class Source>
NpyArray read_npy_from(Source& in, int64_t max_data_bytes, const std::vector<int64_t>* want_shape, bool floats_only) {
  const std::string& name = in.label();
  char head[10];
  if (in.size() < 10) throw ArgumentError(name + " is not a .npy file");
  in.read(head, 10);
  if (std::memcmp(head, kMagic, 6) != 0) throw ArgumentError(name + " is not a .npy file");
  const int major = head[6];
  size_t header_len = uint8_t(head[8]) | size_t(uint8_t(head[9])) << 8;
  if (major == 2 || major == 3) {
    char more[2];
    if (in.remaining() < 2) throw ArgumentError(name + ": truncated .npy header");
    in.read(more, 2);
    header_len |= size_t(uint8_t(more[0])) << 16 | size_t(uint8_t(more[1])) << 24;
  } else if (major != 1) {
    throw ArgumentError(name + ": .npy format version " + std::to_string(major) + " is not supported (1, 2, 3 are)");
  }
  if (header_len > kMaxHeader) throw ArgumentError(name + ": .npy header of " + std::to_string(header_len) + " bytes is past 64 KiB");
  if (int64_t(header_len) > in.remaining()) throw ArgumentError(name + ": truncated .npy header");
  std::string header(header_len, '\0');
  in.read(header.data(), int64_t(header_len));
  NpyArray a;
  a.descr = dict_value(header, "descr", name);
  if (dict_value(header, "fortran_order", name).find("False") == std::string::npos)
    throw ArgumentError(name + ": Fortran-order arrays are not supported; save it with np.ascontiguousarray");
  if (a.descr.size() < 3 || (a.descr[0] != '<' && a.descr[0] != '|') || a.item_bytes() < 1 || a.item_bytes() > 16)
    throw ArgumentError(name + ": element type '" + a.descr + "' is not a little-endian scalar type");
  if (floats_only && !float_kind(a.descr))
    throw ArgumentError(name + ": element type '" + a.descr + "' is not " + kFloatKinds +
                        ": save what the reader produced, in its own type, without widening it");
  const std::string shape = dict_value(header, "shape", name);
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
    if (d < 0) throw ArgumentError(name + ": .npy shape " + shape + " is not a tuple of sizes");
    a.shape.push_back(d);
    count *= d;
    if (count > (i128(1) << 40)) throw ArgumentError(name + ": .npy shape " + shape + " is too large");
  }
  if (want_shape && a.shape != *want_shape)
    throw ArgumentError(name + " has shape " + shape_text(a.shape) + "; it must be " + shape_text(*want_shape) +
                        " (same element count is not enough: the axes are read as named)");
  const i128 want = count * a.item_bytes();
  if (want > max_data_bytes)
    throw ArgumentError(name + ": shape " + shape + " of '" + a.descr + "' is " + std::to_string(int64_t(want)) +
                        " bytes of data, past the " + std::to_string(max_data_bytes) + " expected");
  if (i128(in.remaining()) != want)
    throw ArgumentError(name + ": shape " + shape + " of '" + a.descr + "' needs " + std::to_string(int64_t(want)) +
                        " bytes of data, the file holds " + std::to_string(in.remaining()));
  a.bytes.resize(size_t(want));
  in.read(a.bytes.data(), int64_t(want));
  return a;
}

// A regular file only (a FIFO or a device is refused unopened), sized from fstat.
NpyArray read_npy_bounded(const std::string& path, int64_t max_data_bytes, const std::vector<int64_t>* want_shape,
                          bool floats_only, const std::string& what) {
  RegularFile in(path, what);
  return read_npy_from(in, max_data_bytes, want_shape, floats_only);
}

uint32_t le32(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24; }
uint16_t le16(const uint8_t* p) { return uint16_t(p[0] | p[1] << 8); }
uint64_t le64(const uint8_t* p) { return uint64_t(le32(p)) | uint64_t(le32(p + 4)) << 32; }

}  // namespace

NpyArray read_npy(const std::string& path) { return read_npy_bounded(path, kMaxNpyBytes, nullptr, false, ""); }

std::vector<float> read_npy_floats(const std::string& path, const std::vector<int64_t>& shape, const std::string& what) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return npy_to_floats(read_npy_bounded(path, 4 * n, &shape, true, what), what + " (" + path + ")");
}

std::vector<NpzMember> read_npz(const std::string& path, int64_t max_bytes, const std::string& what) {
  const std::vector<uint8_t> zip = read_regular_file(path, max_bytes, what);
  const std::string name = what + " (" + path + ")";
  std::vector<NpzMember> out;
  size_t at = 0;
  // Local file headers in order (numpy.savez writes one per array, then the central directory).
  while (at + 4 <= zip.size() && le32(&zip[at]) == 0x04034b50u) {
    if (at + 30 > zip.size()) throw ArgumentError(name + ": truncated .npz (zip) entry header");
    const uint8_t* h = &zip[at];
    const uint16_t flags = le16(h + 6), method = le16(h + 8), name_len = le16(h + 26), extra_len = le16(h + 28);
    uint64_t size = le32(h + 18), raw = le32(h + 22);
    if (at + 30 + name_len + extra_len > zip.size()) throw ArgumentError(name + ": truncated .npz (zip) entry header");
    std::string member(reinterpret_cast<const char*>(h + 30), name_len);
    for (size_t e = at + 30 + name_len; e + 4 <= at + 30 + name_len + extra_len;) {  // the ZIP64 sizes
      const uint16_t id = le16(&zip[e]), len = le16(&zip[e + 2]);
      if (id == 1 && len >= 16 && e + 4 + 16 <= zip.size()) raw = le64(&zip[e + 4]), size = le64(&zip[e + 12]);
      e += 4 + size_t(len);
    }
    if (method != 0)
      throw ArgumentError(name + ": member " + quote_text(member) +
                          " is compressed; save the samples with numpy.savez (not savez_compressed)");
    if (flags & 8) throw ArgumentError(name + ": member " + quote_text(member) + " has no sizes in its header");
    const size_t data = at + 30 + name_len + extra_len;
    if (size != raw || size > zip.size() - data) throw ArgumentError(name + ": member " + quote_text(member) + " is truncated");
    if (member.size() < 5 || member.substr(member.size() - 4) != ".npy")
      throw ArgumentError(name + ": member " + quote_text(member) + " is not an .npy array");
    MemorySource source(&zip[data], int64_t(size), name + " member " + member);
    out.push_back({member.substr(0, member.size() - 4), read_npy_from(source, max_bytes, nullptr, true)});
    at = data + size;
  }
  if (out.empty()) throw ArgumentError(name + " is not an .npz file (no zip entries)");
  return out;
}

std::vector<NpzMember> read_safetensors(const std::string& path, int64_t max_bytes, const std::string& what) {
  const std::vector<uint8_t> file = read_regular_file(path, max_bytes, what);
  const std::string name = what + " (" + path + ")";
  if (file.size() < 8) throw ArgumentError(name + " is not a .safetensors file (shorter than its 8-byte header length)");
  const uint64_t header = le64(file.data());
  constexpr uint64_t kMaxHeader = uint64_t(100) << 20;  // what the format's own readers accept
  if (header > file.size() - 8 || header > kMaxHeader)
    throw ArgumentError(name + " is not a .safetensors file: its header length " + std::to_string(header) +
                        " runs past the file's " + std::to_string(file.size()) + " bytes (or past 100 MiB)");
  const std::string_view text(reinterpret_cast<const char*>(file.data() + 8), size_t(header));
  const std::string root = name + " header";
  const nlohmann::json doc = detail::parse_json_strict(text, {root, size_t(header) + 1, 8, false});
  if (!doc.is_object()) throw ArgumentError(name + ": the header is not a JSON object");
  const uint64_t data = 8 + header, data_bytes = file.size() - data;
  std::vector<NpzMember> out;
  for (const auto& item : doc.items()) {
    // Named copies, not structured bindings: a lambda below captures them (clang refuses bindings there).
    const std::string key = item.key();
    const nlohmann::json& t = item.value();
    if (key == "__metadata__") continue;
    const std::string where = name + ": tensor " + quote_text(key);
    const auto has = [&](const char* field) { return t.is_object() && t.contains(field); };
    if (!has("dtype") || !has("shape") || !has("data_offsets") || !t["dtype"].is_string() || !t["shape"].is_array() ||
        !t["data_offsets"].is_array() || t["data_offsets"].size() != 2)
      throw ArgumentError(where + " needs \"dtype\" (a string), \"shape\" and \"data_offsets\" (two numbers)");
    const std::string dtype = t["dtype"].get<std::string>();
    NpyArray a;
    if (dtype == "F32") a.descr = "<f4";
    else if (dtype == "F16") a.descr = "<f2";
    else if (dtype == "BF16") a.descr = "<u2";  // bf16 bit patterns, as npy_to_floats takes them
    else throw ArgumentError(where + " has dtype " + quote_text(dtype) + "; samples are F32, F16 or BF16");
    uint64_t elements = 1;
    for (const nlohmann::json& d : t["shape"]) {
      if (!d.is_number_unsigned()) throw ArgumentError(where + ": shape entries must be non-negative integers");
      const uint64_t extent = d.get<uint64_t>();
      if (extent > data_bytes || (extent > 0 && elements > data_bytes / extent))
        throw ArgumentError(where + ": its shape holds more elements than the file has bytes");
      elements *= extent;
      a.shape.push_back(int64_t(extent));
    }
    const nlohmann::json& off = t["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw ArgumentError(where + ": data_offsets must be non-negative integers");
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_bytes)
      throw ArgumentError(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                          ") lie outside the " + std::to_string(data_bytes) + " bytes of data");
    if (end - begin != elements * uint64_t(a.item_bytes()))
      throw ArgumentError(where + ": shape and dtype need " + std::to_string(elements * uint64_t(a.item_bytes())) +
                          " bytes, data_offsets give " + std::to_string(end - begin));
    a.bytes.assign(file.begin() + int64_t(data + begin), file.begin() + int64_t(data + end));
    out.push_back({key, std::move(a)});
  }
  if (out.empty()) throw ArgumentError(name + " holds no tensors");
  return out;
}

std::vector<NpzMember> read_array_file(const std::string& path, int64_t max_bytes, const std::string& what) {
  // By content: an .npz is a zip (its first bytes "PK\3\4"), anything else is read as safetensors.
  char magic[4] = {};
  {
    std::ifstream f(path, std::ios::binary);
    f.read(magic, 4);
  }
  if (std::memcmp(magic, "PK\3\4", 4) == 0) return read_npz(path, max_bytes, what);
  return read_safetensors(path, max_bytes, what);
}

reference::CalibrationSamples read_calibration_samples(const std::string& path, const std::string& what) {
  std::map<std::string, reference::SampleArray> arrays;
  for (NpzMember& m : read_array_file(path, kMaxSampleFileBytes, what))
    arrays[m.name] = {m.array.shape, npy_to_floats(m.array, m.name)};
  return reference::samples_from_arrays(arrays, what + " " + path);
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
    if (n > 0) std::memcpy(out.data(), p, n * 4);  // an empty array has no data pointer
  } else if (float_kind(a.descr)) {
    for (size_t i = 0; i < n; ++i) {
      const uint16_t b = uint16_t(p[2 * i] | p[2 * i + 1] << 8);
      out[i] = kind == "f2" ? fp16_to_float(b) : bf16_to_float(b);
    }
  } else {
    throw ArgumentError(what + ": element type '" + a.descr + "' is not " + kFloatKinds);
  }
  return out;
}

}  // namespace nvfp4kv::conformance
