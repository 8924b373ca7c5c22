// The kit's files: what write_kit writes and load_kit checks (docs/conformance.md, "Files").
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "nvfp4kv/conformance/kit.hpp"
#include "nvfp4kv/conformance/npy.hpp"
#include "nvfp4kv/core/files.hpp"
#include "nvfp4kv/core/layout_diff.hpp"
#include "nvfp4kv/core/version.hpp"
#include "../core/strict_json.hpp"

namespace nvfp4kv::conformance {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kKind = "nvfp4kv-conformance-kit";
// A manifest lists at most 16384 tokens' sequences and one layout: well under 16 MiB, 8 levels deep.
constexpr size_t kMaxManifestBytes = size_t(16) << 20;
constexpr size_t kMaxManifestDepth = 32;

// cache/NAME.bin for a buffer whose name is a plain file name, cache/bufferI.bin otherwise.
std::string buffer_file(const Layout& l, size_t i) {
  const std::string& n = l.buffers[i].name;
  bool plain = !n.empty() && n[0] != '.' && n.size() <= 64;
  for (char c : n) plain = plain && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.');
  return "cache/" + (plain ? n : "buffer" + std::to_string(i)) + ".bin";
}

const char* type_name(ElementType t) { return t == ElementType::kFloat16 ? "fp16" : "bf16"; }

// Whether two layouts place every element alike and size every buffer alike.
std::string layout_mismatch(const Layout& a, const Layout& b) {
  const CacheDims &x = a.dims, &y = b.dims;
  if (x.layers != y.layers || x.pages != y.pages || x.tokens_per_page != y.tokens_per_page || x.heads != y.heads ||
      x.head_dim != y.head_dim)
    return "sizes differ: layers " + std::to_string(x.layers) + ", pages " + std::to_string(x.pages) + ", tokens per page " +
           std::to_string(x.tokens_per_page) + ", heads " + std::to_string(x.heads) + ", head dim " +
           std::to_string(x.head_dim) + " in the kit";
  if (a.buffers.size() != b.buffers.size()) return "the layouts have different buffers";
  if (!(a.codes == b.codes))
    return "the code order differs: " + code_order_text(a.codes) + " in the kit, " + code_order_text(b.codes) + " here";
  for (size_t i = 0; i < a.buffers.size(); ++i)
    if (a.buffers[i].name != b.buffers[i].name || a.buffers[i].bytes != b.buffers[i].bytes ||
        a.buffers[i].per_layer != b.buffers[i].per_layer)
      return "buffer \"" + a.buffers[i].name + "\" differs";
  const auto diffs = map_differences(b, a);
  if (!diffs.empty()) return diffs.front().text("the kit's layout");
  return "";
}

}  // namespace

void write_kit(const Kit& kit, const std::string& dir) {
  const Layout& l = kit.layout();
  const CacheDims& d = l.dims;
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "cache", ec);
  if (ec) throw ArgumentError("cannot create " + dir + ": " + ec.message());
  const auto path = [&](const std::string& name) { return (fs::path(dir) / name).string(); };
  const int64_t R = int64_t(kit.read_rows.size()), B = kit.probes(), H = d.heads, D = d.head_dim;
  json files = json::object();
  const auto npy = [&](const std::string& name, const NpyArray& a, const std::string& what) {
    write_npy(path(name), a);
    files[name] = what;
  };
  const std::string t = type_name(kit.options.type);
  const std::string t_is = kit.options.type == ElementType::kFloat16 ? "fp16" : "bf16 as uint16 bit patterns";
  // The writer's inputs.
  npy("k.npy", npy_16bit(kit.k, kit.options.type, {kit.rows, H, D}), "(rows, heads, D) " + t_is + ": K rows to store");
  npy("v.npy", npy_16bit(kit.v, kit.options.type, {kit.rows, H, D}), "(rows, heads, D) " + t_is + ": V rows to store");
  const auto floats = [&](const std::vector<uint16_t>& x) {
    std::vector<float> f(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      f[i] = kit.options.type == ElementType::kFloat16 ? fp16_to_float(x[i]) : bf16_to_float(x[i]);
    return f;
  };
  npy("k.f32.npy", npy_f32(floats(kit.k), {kit.rows, H, D}), "(rows, heads, D) float32: k.npy's values, exactly");
  npy("v.f32.npy", npy_f32(floats(kit.v), {kit.rows, H, D}), "(rows, heads, D) float32: v.npy's values, exactly");
  npy("slot_mapping.npy", npy_i64(kit.slots, {kit.rows}), "(rows) int64: page * tokens_per_page + position; -1 is padding");
  npy("k_global_scale.npy", npy_f32({kit.k_global_scale}, {1}), "(1) float32: K's dequant multiplier");
  npy("v_global_scale.npy", npy_f32({kit.v_global_scale}, {1}), "(1) float32: V's dequant multiplier");
  // The sequences, as block tables (vLLM) and as page lists (FlashInfer).
  const int64_t S = int64_t(kit.sequences.size());
  size_t widest = 1;
  for (const KitSequence& s : kit.sequences) widest = std::max(widest, s.pages.size());
  std::vector<int32_t> table(size_t(S) * widest, -1), lens, cu = {0}, indptr = {0}, indices, last;
  for (int64_t s = 0; s < S; ++s) {
    const KitSequence& q = kit.sequences[size_t(s)];
    std::copy(q.pages.begin(), q.pages.end(), table.begin() + s * int64_t(widest));
    lens.push_back(int32_t(q.length));
    cu.push_back(cu.back() + int32_t(q.length));
    indices.insert(indices.end(), q.pages.begin(), q.pages.end());
    indptr.push_back(int32_t(indices.size()));
    last.push_back(int32_t(q.length - (int64_t(q.pages.size()) - 1) * d.tokens_per_page));
  }
  npy("block_tables.npy", npy_i32(table, {S, int64_t(widest)}), "(sequences, pages) int32: each sequence's pages in order; -1 past its end");
  npy("seq_lens.npy", npy_i32(lens, {S}), "(sequences) int32: tokens per sequence");
  npy("cu_seqlens.npy", npy_i32(cu, {S + 1}), "(sequences + 1) int32: sequence i is rows [cu[i], cu[i+1]) of a reader's dense output");
  npy("kv_indptr.npy", npy_i32(indptr, {S + 1}), "(sequences + 1) int32: FlashInfer's page-list offsets");
  npy("kv_indices.npy", npy_i32(indices, {int64_t(indices.size())}), "(pages used) int32: FlashInfer's page lists");
  npy("kv_last_page_len.npy", npy_i32(last, {S}), "(sequences) int32: FlashInfer's tokens in each last page");
  // What the reader should produce.
  npy("expected_k.f32.npy", npy_f32(kit.read_k, {R, H, D}), "(tokens, heads, D) float32: the cache's K rows in sequence order, dequantized");
  npy("expected_v.f32.npy", npy_f32(kit.read_v, {R, H, D}), "(tokens, heads, D) float32: the cache's V rows in sequence order, dequantized");
  // Attention probes.
  std::vector<int32_t> probe_table(static_cast<size_t>(B) * widest), probe_lens(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t s = kit.probe_sequence[size_t(b)];
    std::copy(table.begin() + s * int64_t(widest), table.begin() + (s + 1) * int64_t(widest), probe_table.begin() + b * int64_t(widest));
    probe_lens[size_t(b)] = int32_t(kit.sequences[size_t(s)].length);
  }
  npy("probe_q.npy", npy_16bit(kit.q, kit.options.type, {B, kit.q_heads, D}), "(probes, q_heads, D) " + t_is + ": one decode query per probe");
  npy("probe_q.f32.npy", npy_f32(floats(kit.q), {B, kit.q_heads, D}), "(probes, q_heads, D) float32: probe_q.npy's values, exactly");
  npy("probe_block_tables.npy", npy_i32(probe_table, {B, int64_t(widest)}), "(probes, pages) int32: the pages each probe attends over");
  npy("probe_seq_lens.npy", npy_i32(probe_lens, {B}), "(probes) int32: the tokens each probe attends over");
  npy("probe_expected_out.f32.npy", npy_f32(kit.expected_out, {B, kit.q_heads, D}),
      "(probes, q_heads, D) float32: fp64 reference decode attention over the cache");
  // The cache, as nvfp4kv's reference writes it.
  json buffers = json::array();
  for (size_t i = 0; i < l.buffers.size(); ++i) {
    const std::string f = buffer_file(l, i);
    std::ofstream out(path(f), std::ios::binary);
    out.write(reinterpret_cast<const char*>(kit.cache[i].data()), std::streamsize(kit.cache[i].size()));
    if (!out) throw ArgumentError("cannot write " + path(f));
    buffers.push_back({{"name", l.buffers[i].name}, {"file", f}, {"bytes", l.buffers[i].bytes}});
  }
  {
    std::ofstream out(path("layout.json"));
    out << to_json(l) << "\n";
    if (!out) throw ArgumentError("cannot write " + path("layout.json"));
  }
  json seqs = json::array();
  for (const KitSequence& s : kit.sequences) seqs.push_back({{"pages", s.pages}, {"length", s.length}});
  int64_t isolating = 0;
  for (uint8_t x : kit.probe_isolates) isolating += x;
  json m = {
      {"kind", kKind},
      {"version", kKitVersion},
      {"generator", std::string("nvfp4kv ") + kVersion},
      {"layout", json::parse(to_json(l))},
      {"dims", {{"layers", d.layers}, {"pages", d.pages}, {"tokens_per_page", d.tokens_per_page}, {"heads", d.heads}, {"head_dim", d.head_dim}}},
      {"layer", kit.options.layer},
      {"dtype", t},
      {"seed", kit.options.seed},
      {"tokens", int64_t(kit.read_rows.size())},
      {"rows", kit.rows},
      {"q_heads", kit.q_heads},
      {"poison", kPoison},
      {"global_scale",
       {{"k", kit.k_global_scale},
        {"v", kit.v_global_scale},
        {"k_quant", 1.0f / kit.k_global_scale},
        {"v_quant", 1.0f / kit.v_global_scale},
        {"convention", "k and v multiply stored values back (vLLM k_scale/v_scale, TensorRT-LLM kv_scale_quant_orig); "
                       "k_quant and v_quant are their float32 reciprocals (FlashInfer global_sf, TensorRT-LLM kv_scale_orig_quant)"}}},
      {"softmax_scale", kit.softmax_scale},
      {"sequences", seqs},
      {"buffers", buffers},
      {"files", files},
      {"signatures",
       {{"scale_rows_unique", kit.scale_rows_unique},
        {"probe_blocks", kit.probe_blocks},
        {"bytes_differing",
         {{policy_name(RoundingPolicy::kReciprocalMultiply), kit.bytes_differing[size_t(RoundingPolicy::kReciprocalMultiply)]},
          {policy_name(RoundingPolicy::kFastMathDivision), kit.bytes_differing[size_t(RoundingPolicy::kFastMathDivision)]}}}}},
      {"probes", {{"count", B}, {"isolating", isolating}, {"margin", kProbeMargin}}}};
  std::ofstream out(path("manifest.json"));
  out << m.dump(2) << "\n";
  if (!out) throw ArgumentError("cannot write " + path("manifest.json"));
}

KitManifest read_manifest(const std::string& dir) {
  const std::string file = (fs::path(dir) / "manifest.json").string();
  std::error_code ec;
  if (!fs::exists(file, ec)) throw ArgumentError("cannot read " + file + " (is " + dir + " a kit from nvfp4kv conformance gen?)");
  // The layout loader's bounds: a regular file of bounded size, nesting and no duplicate keys, so
  // a hostile manifest is refused while parsing, never recursed into afterwards.
  json m;
  try {
    m = detail::parse_json_strict(read_text_file(file, kMaxManifestBytes, "the kit's manifest"),
                                  {"manifest", kMaxManifestBytes, kMaxManifestDepth, false});
  } catch (const ArgumentError& e) {
    throw ArgumentError(file + ": " + e.what());
  }
  try {
    if (m.value("kind", "") != kKind) throw ArgumentError(file + " is not an nvfp4kv conformance kit manifest");
    KitManifest r;
    r.version = m.at("version").get<int>();
    if (r.version != kKitVersion)
      throw ArgumentError(file + " has kit version " + std::to_string(r.version) + "; this nvfp4kv reads version " +
                  std::to_string(kKitVersion) + ": generate the kit again");
    r.layout_json = m.at("layout").dump();
    const json& d = m.at("dims");
    r.dims = {d.at("layers").get<int64_t>(), d.at("pages").get<int64_t>(), d.at("tokens_per_page").get<int64_t>(),
              d.at("heads").get<int64_t>(), d.at("head_dim").get<int64_t>()};
    r.options.layer = m.at("layer").get<int64_t>();
    const std::string t = m.at("dtype").get<std::string>();
    if (t != "bf16" && t != "fp16") throw ArgumentError(file + ": dtype \"" + t + "\" is not bf16 or fp16");
    r.options.type = t == "fp16" ? ElementType::kFloat16 : ElementType::kBFloat16;
    r.options.seed = m.at("seed").get<uint64_t>();
    r.options.tokens = m.at("tokens").get<int64_t>();
    r.options.q_heads = m.at("q_heads").get<int64_t>();
    return r;
  } catch (const json::exception& e) {
    throw ArgumentError(file + ": " + e.what());
  }
}

Kit load_kit(const std::string& dir, const ValidLayout& valid) {
  const KitManifest m = read_manifest(dir);
  const Layout& l = valid.layout();
  const Layout made = instantiate(parse_layout_spec(m.layout_json), {});
  if (const std::string why = layout_mismatch(made, l); !why.empty())
    throw ArgumentError(dir + " was generated for layout \"" + made.name + "\", which places bytes unlike \"" + l.name + "\": " + why +
                "; give the --layout and sizes it was generated with");
  Kit kit = generate(valid, m.options);
  for (size_t i = 0; i < l.buffers.size(); ++i) {
    const std::string f = (fs::path(dir) / buffer_file(l, i)).string();
    if (read_regular_file(f, int64_t(kit.cache[i].size()), "the kit's cache") != kit.cache[i])
      throw ArgumentError(f + " is not the cache this nvfp4kv generates from " + dir +
                  "/manifest.json (modified, or written by another version); generate the kit again");
  }
  return kit;
}

}  // namespace nvfp4kv::conformance
