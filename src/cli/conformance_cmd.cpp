// nvfp4kv conformance gen | check-write | check-read: an engine's own writer and
// reader against a layout (docs/conformance.md). The conformance library does the
// work; this reads and writes files and prints.
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli.hpp"
#include "nvfp4kv/conformance/check.hpp"
#include "nvfp4kv/conformance/npy.hpp"
#include "nvfp4kv/core/files.hpp"
#include "nvfp4kv/core/names.hpp"

namespace nvfp4kv::cli {
namespace {

using namespace conformance;

std::vector<OptionSpec> options(std::vector<OptionSpec> first, std::vector<OptionSpec> more) {
  std::vector<OptionSpec> o = std::move(first);
  for (const OptionSpec& x : size_options()) o.push_back(x);
  o.insert(o.end(), more.begin(), more.end());
  o.push_back(kJsonOption);
  return o;
}

const CommandSpec& gen_spec() {
  static const CommandSpec s{
      "conformance gen", "",
      "Generate a conformance kit: K and V rows whose every block carries a recoverable signature, a slot mapping\n"
      "with padding over shuffled pages, global scales, the cache nvfp4kv's reference writes through the layout,\n"
      "and inputs and expected outputs for a reader (dequantized rows and decode-attention probes).",
      options({{"layout", "LAYOUT", "the layout the engine claims (a preset or a JSON file; required)"}},
              {{"out", "DIR", "where to write the kit (created if missing; required)"},
               {"tokens", "T", "rows to store (default: half the cache, at most 512)"},
               {"dtype", "bf16|fp16", "element type of the rows and queries (default bf16)"},
               {"layer", "L", "the layer to write (default 0)"},
               {"q-heads", "H", "query heads of the attention probes (default: the kv heads)"},
               {"seed", "S", "seed of the sequences and the page order (default 1)"}}),
      "The files are described in DIR/manifest.json and docs/conformance.md."};
  return s;
}

const CommandSpec& write_spec() {
  static const CommandSpec s{
      "conformance check-write", "",
      "Check an engine's writer: the buffers it wrote after storing the kit's rows, region by region: exact,\n"
      "rounding-only (explained by a named rounding policy) or misplaced, with where each misplaced element\n"
      "landed, the writer's real map, and every byte written outside the stored rows' cells.",
      options({{"layout", "LAYOUT", "the layout the kit was generated for (required)"}},
              {{"dir", "DIR", "the kit (required)"},
               {"cache", "BUFFER=FILE", "a buffer as the writer left it, raw bytes (FILE alone for a one-buffer layout)", true},
               {"inferred", "FILE", "write the writer's map as a layout file (for nvfp4kv layout compare / check)"},
               {"examples", "N", "misplaced elements to show per region (default 8)"}}),
      "Sizes default to the kit's; given ones must agree with it."};
  return s;
}

const CommandSpec& read_spec() {
  static const CommandSpec s{
      "conformance check-read", "",
      "Check an engine's reader on the kit's cache: its dequantized K and V rows (--k, --v) or its decode attention\n"
      "over the kit's probes (--out). Names the data and scale bytes each misread block used, and the reader's map.",
      options({{"layout", "LAYOUT", "the layout the kit was generated for (required)"}},
              {{"dir", "DIR", "the kit (required)"},
               {"k", "FILE", ".npy (tokens, heads, D): K as the reader dequantized it, in sequence order"},
               {"v", "FILE", ".npy (tokens, heads, D): V likewise"},
               {"out", "FILE", ".npy (probes, q_heads, D): the reader's decode attention over the probes"},
               {"inferred", "FILE", "write the reader's map as a layout file"},
               {"examples", "N", "misread blocks or probes to show (default 8)"}}),
      "Arrays may be float32, float16 or bf16 (as uint16 bit patterns). Sizes default to the kit's."};
  return s;
}

std::string dims_text(const CacheDims& d) {
  std::ostringstream s;
  s << "layers " << d.layers << ", pages " << d.pages << ", tokens/page " << d.tokens_per_page << ", heads " << d.heads
    << ", head dim " << d.head_dim;
  return s.str();
}

std::string required(const Args& a, const char* name) {
  const auto v = a.get(name);
  if (!v) throw UsageError(std::string("--") + name + " is required");
  return *v;
}

// The layout at the kit's sizes: sizes given must be the kit's, and so must the ones the layout fixes.
std::pair<ValidLayout, KitManifest> kit_layout(const Args& a, const std::string& dir) {
  const KitManifest m = read_manifest(dir);
  const DimsOverride given = dims_from(a);
  const CacheDims& k = m.dims;
  for (auto [v, kit, flag] : {std::tuple{given.layers, k.layers, "--layers"}, {given.pages, k.pages, "--pages"},
                              {given.tokens_per_page, k.tokens_per_page, "--tokens-per-page"},
                              {given.heads, k.heads, "--heads"}, {given.head_dim, k.head_dim, "--head-dim"}})
    if (v && *v != kit)
      throw UsageError(std::string(flag) + " " + std::to_string(*v) + " contradicts the kit in " + dir + ", generated at " +
                       dims_text(k) + " (leave the sizes out or give those)");
  for (auto [v, kit, flag] : {std::tuple{given.k_element, k.k_element, "--k-element"}, {given.v_element, k.v_element, "--v-element"}})
    if (v && *v != kit)
      throw UsageError(std::string(flag) + " " + element_format_name(*v) + " contradicts the kit in " + dir +
                       ", whose pages hold " + element_format_name(kit) + " (conformance kits hold NVFP4 pages only so far)");
  Layout l;
  try {
    l = instantiate(load_spec(required(a, "layout")), {k.layers, k.pages, k.tokens_per_page, k.heads, k.head_dim});
  } catch (const LayoutError& e) {
    throw LayoutError(std::string(e.what()) + " (the kit in " + dir + " was generated at " + dims_text(k) + ")");
  }
  CheckResult res = check(l);
  if (!res.valid) throw LayoutError("layout \"" + l.name + "\": " + res.report.summary());
  return {*res.valid, m};
}

int examples(const Args& a) {
  const int64_t n = a.integer("examples").value_or(8);
  if (n < 0 || n > 10000) throw UsageError("--examples must be in [0, 10000], got " + std::to_string(n));
  return int(n);
}

void write_layout_file(const std::string& path, const Layout& l) {
  require_writable_path(path, "--inferred");
  std::ofstream out(path);
  out << to_json(l) << "\n";
  if (!out) throw ArgumentError("cannot write " + path);
}

// --inferred FILE: the inferred map where there is one, the layout itself where nothing was wrong,
// nothing where a wrong region's map could not be inferred. The path written, if any.
std::optional<std::string> write_inferred(const Args& a, const std::optional<Layout>& inferred, bool wrong, const Layout& l) {
  const auto path = a.get("inferred");
  if (!path || (wrong && !inferred)) return std::nullopt;
  write_layout_file(*path, inferred ? *inferred : l);
  return path;
}

int cmd_gen(const Args& a) {
  if (!a.positional().empty()) throw UsageError("unexpected argument " + quote_text(a.positional()[0]));
  const std::string out = required(a, "out");
  const LoadedLayout ld = load_layout(required(a, "layout"), dims_from(a), {1});
  CheckResult res = check(ld.layout);
  if (res.report.undecided) throw LayoutError("layout " + ld.layout.name + ": " + res.report.summary());
  const bool json = a.flag("json");
  if (!res.valid) {
    if (json) print_json("conformance gen", {{"layout", ld.layout.name}, {"ok", false}, {"check", check_json(res.report)}});
    else
      std::cout << "layout \"" << ld.layout.name << "\" is " << res.report.summary()
                << "\nconformance needs a sound layout: describe the bytes the engine's configurator allocates\n";
    return verdict_code(res.report);
  }
  KitOptions o;
  // Given counts are used as given: a nonpositive one is an error, never the default.
  const auto count = [&](const char* name) -> int64_t {
    const auto v = a.integer(name);
    if (v && *v < 1) throw UsageError(std::string("--") + name + " must be at least 1, got " + std::to_string(*v));
    return v.value_or(0);  // 0: the kit picks its default
  };
  o.tokens = count("tokens");
  o.layer = a.integer("layer").value_or(0);
  o.q_heads = count("q-heads");
  o.seed = uint64_t(a.integer("seed").value_or(1));
  const std::string dtype = a.get("dtype").value_or("bf16");
  if (dtype != "bf16" && dtype != "fp16") throw UsageError("--dtype expects bf16 or fp16, got " + quote_text(dtype));
  o.type = dtype == "fp16" ? ElementType::kFloat16 : ElementType::kBFloat16;
  Kit kit;
  {
    StderrProgress progress("conformance gen");
    progress.callback()("generating the kit", 0.0);
    kit = generate(*res.valid, o);
    progress.callback()("writing the files", 0.8);
    write_kit(kit, out);
  }
  const CacheDims& d = kit.dims();
  const int64_t stored = int64_t(kit.read_rows.size());
  int64_t isolating = 0;
  for (uint8_t x : kit.probe_isolates) isolating += x;
  std::string buffers;
  for (const Buffer& b : kit.layout().buffers) buffers += " --cache " + b.name + "=FILE";
  const std::string layout_arg = required(a, "layout");
  if (json) {
    print_json("conformance gen", {{"layout", kit.layout().name},
                                    {"ok", true},
                                    {"check", check_json(res.report)},
                                    {"dir", out},
                                    {"dims", dims_json(d)},
                                    {"assumed", ld.assumed},
                                    {"layer", kit.options.layer},
                                    {"dtype", dtype},
                                    {"rows", kit.rows},
                                    {"tokens", stored},
                                    {"padding_rows", kit.rows - stored},
                                    {"sequences", int64_t(kit.sequences.size())},
                                    {"probes", kit.probes()},
                                    {"q_heads", kit.q_heads},
                                    {"probe_outputs_isolating", isolating},
                                    {"k_global_scale", kit.k_global_scale},
                                    {"v_global_scale", kit.v_global_scale},
                                    {"poison", kPoison},
                                    {"probe_blocks", kit.probe_blocks},
                                    {"scale_rows_unique", kit.scale_rows_unique}});
    return kExitOk;
  }
  if (!ld.assumed.empty()) std::cout << assumed_line(ld.assumed) << "\n";
  std::cout << "conformance kit for \"" << kit.layout().name << "\" (" << dims_text(d) << "), layer " << kit.options.layer
            << ", " << dtype << " -> " << out << "/\n"
            << "  " << kit.rows << " rows: " << stored << " stored in " << kit.sequences.size()
            << " sequences over shuffled pages, " << kit.rows - stored << " padding rows (slot -1)\n"
            << "  global scales (dequant multipliers): K " << kit.k_global_scale << ", V " << kit.v_global_scale
            << "; reciprocals " << 1.0f / kit.k_global_scale << ", " << 1.0f / kit.v_global_scale
            << " (FlashInfer global_sf, TensorRT-LLM kv_scale_orig_quant)\n"
            << "  " << kit.probe_blocks << " stored blocks carry a rounding probe: a reciprocal-multiply writer stores "
            << kit.bytes_differing[size_t(RoundingPolicy::kReciprocalMultiply)] << " bytes unlike nvfp4kv, a fast-math one about "
            << kit.bytes_differing[size_t(RoundingPolicy::kFastMathDivision)] << "\n"
            << "  " << kit.probes() << " attention probes x " << kit.q_heads << " query heads, " << isolating << " of "
            << kit.probe_isolates.size() << " singling out one token; softmax scale " << kit.softmax_scale << "\n"
            << "next:\n"
            << "  writer: fill each buffer with 0x88, store k.npy / v.npy through slot_mapping.npy into layer "
            << kit.options.layer << " with the global scales above, write each buffer raw to a file, then\n"
            << "    nvfp4kv conformance check-write --layout " << layout_arg << " --dir " << out << buffers << "\n"
            << "  reader: read cache/ as the sequences of block_tables.npy and seq_lens.npy, save K and V as .npy, then\n"
            << "    nvfp4kv conformance check-read --layout " << layout_arg << " --dir " << out << " --k FILE --v FILE\n"
            << "  or run decode attention over probe_q.npy, probe_block_tables.npy, probe_seq_lens.npy, then\n"
            << "    nvfp4kv conformance check-read --layout " << layout_arg << " --dir " << out << " --out FILE\n";
  return kExitOk;
}

int cmd_check_write(const Args& a) {
  if (!a.positional().empty()) throw UsageError("unexpected argument " + quote_text(a.positional()[0]));
  const std::string dir = required(a, "dir");
  const auto [valid, manifest] = kit_layout(a, dir);
  const Layout& l = valid.layout();
  // --cache BUFFER=FILE for each buffer (FILE alone when there is one).
  std::vector<std::optional<std::string>> files(l.buffers.size());
  std::vector<std::string> names;
  for (const Buffer& b : l.buffers) names.push_back(b.name);
  for (const std::string& c : a.get_all("cache")) {
    const size_t eq = c.find('=');
    std::string buffer = eq == std::string::npos ? "" : c.substr(0, eq);
    const std::string file = eq == std::string::npos ? c : c.substr(eq + 1);
    if (buffer.empty()) {
      if (l.buffers.size() != 1)
        throw UsageError("--cache " + quote_text(c) + ": the layout has " + std::to_string(l.buffers.size()) +
                         " buffers; name each, BUFFER=FILE");
      buffer = l.buffers[0].name;
    }
    const auto it = std::find(names.begin(), names.end(), buffer);
    if (it == names.end())
      throw UsageError("--cache: the layout has no buffer " + quote_text(buffer) + did_you_mean(buffer, names));
    if (files[size_t(it - names.begin())]) throw UsageError("--cache: buffer \"" + buffer + "\" is given twice");
    files[size_t(it - names.begin())] = file;
  }
  std::vector<std::vector<uint8_t>> dumps;
  for (size_t i = 0; i < files.size(); ++i) {
    if (!files[i]) throw UsageError("--cache " + names[i] + "=FILE is missing: the writer's copy of every buffer is needed");
    // A regular file no larger than the buffer, refused from its size before it is read.
    dumps.push_back(read_regular_file(*files[i], l.buffers[i].bytes, "--cache " + names[i]));
  }
  WriteReport r;
  {
    StderrProgress progress("conformance check-write");
    progress.callback()("loading the kit", 0.0);
    const Kit kit = load_kit(dir, valid);
    r = check_write(kit, dumps, examples(a), progress.callback());
  }
  const auto misplaced = [&] {
    for (const RegionWriteReport& x : r.regions)
      if (x.verdict == RegionVerdict::kMisplaced) return true;
    return false;
  };
  const std::optional<std::string> inferred = write_inferred(a, r.writer_layout, misplaced(), l);
  if (a.flag("json")) {
    Json j = Json::parse(r.json());
    j["dims"] = dims_json(l.dims);
    if (inferred) j["inferred_file"] = *inferred;
    std::cout << json_envelope("conformance check-write", j.dump()) << "\n";
  } else {
    std::cout << r.text() << "\n";
    if (const auto path = a.get("inferred"))
      std::cout << (r.writer_layout ? "the writer's map written to " + *path + "; nvfp4kv layout compare " + *path + " " +
                                          required(a, "layout") + " compares it"
                    : inferred    ? "no region misplaced: the layout written to " + *path
                                  : "nothing written to " + *path + ": the writer's map is not known for every misplaced region")
                << "\n";
  }
  return r.ok() ? kExitOk : kExitVerdict;
}

int cmd_check_read(const Args& a) {
  if (!a.positional().empty()) throw UsageError("unexpected argument " + quote_text(a.positional()[0]));
  const std::string dir = required(a, "dir");
  const auto k = a.get("k"), v = a.get("v"), out = a.get("out");
  if (out && (k || v)) throw UsageError("give --k and --v (dequantized rows) or --out (attention), not both");
  if (!out && !(k && v)) throw UsageError("give --k FILE and --v FILE (dequantized rows), or --out FILE (attention over the probes)");
  const auto [valid, manifest] = kit_layout(a, dir);
  ReadReport r;
  {
    StderrProgress progress("conformance check-read");
    progress.callback()("loading the kit", 0.0);
    const Kit kit = load_kit(dir, valid);
    // Each array exactly the shape the kit's readers produce, as Python's check_read takes it.
    const int64_t R = int64_t(kit.read_rows.size()), H = kit.dims().heads, D = kit.dims().head_dim;
    if (out) {
      r = check_read_attention(kit, read_npy_floats(*out, {kit.probes(), kit.q_heads, D}, "--out"), examples(a),
                               progress.callback());
    } else {
      const std::vector<float> k_rows = read_npy_floats(*k, {R, H, D}, "--k");
      r = check_read_rows(kit, k_rows, read_npy_floats(*v, {R, H, D}, "--v"), examples(a), progress.callback());
    }
  }
  const Layout& l = valid.layout();
  const std::optional<std::string> inferred = write_inferred(a, r.reader_layout, !r.ok(), l);
  if (a.flag("json")) {
    Json j = Json::parse(r.json());
    j["dims"] = dims_json(l.dims);
    if (inferred) j["inferred_file"] = *inferred;
    std::cout << json_envelope("conformance check-read", j.dump()) << "\n";
  } else {
    std::cout << r.text() << "\n";
    if (const auto path = a.get("inferred"))
      std::cout << (r.reader_layout ? "the reader's map written to " + *path
                    : inferred    ? "nothing misread: the layout written to " + *path
                                  : "nothing written to " + *path + ": the reader's map is not known")
                << "\n";
  }
  return r.ok() ? kExitOk : kExitVerdict;
}

}  // namespace

int run_conformance(const std::vector<std::string>& argv) {
  static const std::vector<Subcommand> subs = {
      {"gen", "gen --layout LAYOUT [sizes] --out DIR                      inputs for an engine's own writer and reader",
       gen_spec, cmd_gen},
      {"check-write", "check-write --layout LAYOUT --dir DIR --cache BUFFER=FILE ...  what its writer did", write_spec,
       cmd_check_write},
      {"check-read", "check-read --layout LAYOUT --dir DIR (--k FILE --v FILE | --out FILE)  what its reader read",
       read_spec, cmd_check_read}};
  return run_group("conformance", subs, argv, "; docs/conformance.md walks through them.");
}

}  // namespace nvfp4kv::cli
