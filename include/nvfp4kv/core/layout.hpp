#pragma once
// Layouts as values: describe an NVFP4 KV cache, prove it sound, compare two
// descriptions of the same bytes. See docs/layouts.md for the model and the text form.
#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nvfp4kv/core/cache_buffers.hpp"
#include "nvfp4kv/core/cache_format.hpp"
#include "nvfp4kv/core/error.hpp"
#include "nvfp4kv/core/layout_view.hpp"

namespace nvfp4kv {

// Text from the input as a message quotes it: in double quotes, control
// characters escaped, cut to a short prefix, so a message stays one short line.
std::string quote_text(std::string_view text);

const char* region_name(Region r);          // "k_data", "k_scale", "v_data", "v_scale"
std::optional<Region> region_from_name(std::string_view name);
// "12" for a plain stride, "(4,_):(1,32)" for a nested mode.
std::string mode_text(const Mode& m);
inline constexpr std::array<Region, kRegionCount> kAllRegions = {Region::kKData, Region::kKScale,
                                                                Region::kVData, Region::kVScale};

// Where a layout comes from: the engine code whose index expressions it
// transcribes (docs/layouts.md, "Text form" and "Presets"). Every preset carries one; a
// layout file of one's own may leave it out (then engine is empty).
struct Provenance {
  std::string engine;    // "vLLM", "FlashInfer", ...
  std::string version;   // a release, commit range or date the transcription holds for
  std::string gpu_path;  // the GPU code path that addresses the bytes this way
  std::string role;      // "writer", "reader", "writer and reader" (optional)
  std::vector<std::string> sources;      // "path: what it contributes", one entry per file
  std::vector<std::string> expressions;  // the engine's index expressions, as transcribed
  std::string notes;                     // optional
  bool empty() const { return engine.empty(); }
};

// Indented lines for listings: two lines (who, and the source paths), or with
// full set every field, expressions and notes included.
std::string provenance_text(const Provenance& p, const std::string& indent, bool full);

struct Buffer {
  std::string name;
  int64_t bytes = 0;       // size of one allocation
  bool per_layer = false;  // one allocation per layer (regions in it have no layer stride)
};

// A concrete layout: every size bound, every stride a number. Not yet proven sound.
struct Layout {
  std::string name;
  std::string summary;
  Provenance provenance;
  CacheDims dims;
  std::vector<Buffer> buffers;
  std::array<RegionMap, kRegionCount> regions{};
  CodeOrder codes;  // where a data byte keeps its two E2M1 codes (the standard order by default)

  const RegionMap& region(Region r) const { return regions[size_t(r)]; }
  int64_t offset(Region r, const Coord& c) const { return region_offset(region(r), c); }
  TileMap tile(Region r, int64_t layer, int64_t page, int64_t head) const {
    return tile_of(region(r), layer, page, head);
  }
  // Layers whose bytes live in the same allocation (1 for per-layer buffers).
  int64_t layers_in(const Buffer& b) const { return b.per_layer ? 1 : dims.layers; }
  // Bytes of all allocations, over all layers (throws LayoutError unless evaluable).
  int64_t total_bytes() const;
};

// "k_data[layer 0, page 0, token 8, head 0, byte 0]" (group instead of byte for scales).
std::string describe_element(Region r, const Coord& c);

// The named code orders: "standard" (element 2j in the low nibble, each code s e1 e0 m
// from bit 3 down), "high-first" (element 2j in the high nibble: what a packing
// instruction whose first operand lands high writes) and "fp16-split" (element 2j as
// the high byte of an FP16 would hold it, sign at bit 7 and e1 e0 m at bits 3..1;
// element 2j + 1 with its sign at bit 0 and e1 e0 m at bits 6..4: a decoder places
// both with fewer operations). code_order_name gives "" for an order without a name.
std::optional<CodeOrder> code_order_named(std::string_view name);
std::string code_order_name(const CodeOrder& order);
// "standard", or the bit lists for an unnamed order: "even [0,1,2,3] odd [4,5,6,7]".
std::string code_order_text(const CodeOrder& order);
// Why these eight bit positions are not a code order ("" when they are): each of 0..7 once.
std::string code_order_problem(const CodeOrder& order);

// Rewrites a scale region whose (page, head) plane is linear and contiguous
// (token stride D/16, column stride 1) into TensorRT-LLM's 4-token interleave
// of that plane, (t/4)*4*sd + 4g + t%4. Throws LayoutError otherwise.
void interleave_scale_plane(Layout& layout, Region r);

struct Collision {
  Region a, b;
  Coord coord_a, coord_b;
  std::string buffer;
  int64_t byte = 0;
  std::string message() const;
};

// Why these sizes cannot describe a cache ("" when they can): layers, pages,
// tokens per page and heads >= 1, head dim a positive multiple of 16. The one
// statement of the rule; instantiate, check, plan and the reference use it.
std::string dims_problem(const CacheDims& d);
std::string head_dim_problem(int64_t head_dim);

// Every offset, stride, size and count of a layout lies within +-2^62, so int64
// arithmetic on them, and on the difference of two, never overflows.
inline constexpr int64_t kOffsetLimit = int64_t(1) << 62;
// The most elements one proof, comparison or byte map enumerates; larger is refused up front.
inline constexpr int64_t kMaxEnumerated = int64_t(1) << 23;

// Why the offsets of this layout cannot all be computed ("" when they can): the
// sizes (dims_problem), 1 to kMaxBuffers buffers, each region in one of them, inner extents
// >= 1, and every stride, partial sum of an offset, buffer size, total and element
// count within kOffsetLimit, worked out in 128 bits. The one statement of what makes
// a layout evaluable: instantiate establishes it, and check, compare and byte_map
// refuse a layout without it, so nothing evaluates an offset of a layout that lacks
// it. Soundness (strides >= 0, bounds, no shared byte) stays check()'s.
std::string evaluation_problem(const Layout& layout);
// Throws LayoutError naming the layout and its evaluation_problem, if it has one.
void require_evaluable(const Layout& layout);

struct CheckReport {
  bool ok = false;
  // Not ok, but not shown unsound either: the proof would need more work than its
  // bounds allow at these sizes (the first problem says which bound).
  bool undecided = false;
  std::vector<std::string> problems;     // human-readable, the first one is the verdict
  std::optional<Collision> collision;    // the first collision found (see docs/layouts.md)
  std::vector<std::string> colliding_pairs;  // e.g. "k_data/k_scale", within one page cell
  std::array<RegionAccess, kRegionCount> access{};
  int64_t elements = 0;  // logical elements covered by the proof (all layers, all pages)
  int64_t elements_enumerated = 0;  // elements visited explicitly to prove it
  double seconds = 0;
  std::string summary() const;
};

// A layout that passed check(). Only check() can make one; kernels take only this.
class ValidLayout {
 public:
  const Layout& layout() const { return layout_; }
  const CheckReport& report() const { return report_; }
  // What the bytes mean (cache_format.hpp); implicit (plain NVFP4) unless with_format set one.
  const CacheFormat& format() const { return format_; }
  LayoutView view() const;

 private:
  friend struct CheckResult check(const Layout& layout);
  friend ValidLayout with_format(const ValidLayout& layout, CacheFormat format);
  ValidLayout(Layout l, CheckReport r) : layout_(std::move(l)), report_(std::move(r)) {}
  Layout layout_;
  CheckReport report_;
  CacheFormat format_;
};

// The same proven layout with a format attached, after format_problem found none
// against its sizes (throws LayoutError naming the field).
ValidLayout with_format(const ValidLayout& layout, CacheFormat format);

struct CheckResult {
  CheckReport report;
  std::optional<ValidLayout> valid;  // set iff report.ok
};

// Exact over the whole allocation: bounds, preconditions, no shared byte between
// any two elements of any regions, layers and pages. Never samples.
CheckResult check(const Layout& layout);
// A mode whose inner extent exceeds its coordinate's extent places x at x * inner stride
// (x % inner == x): it is that plain stride, and instantiate and check make it one, so the
// 4-token interleave at 1 to 3 tokens per page is judged as the plain stride it is.
Layout with_plain_modes(Layout l);

// Throws LayoutError with the report's verdict unless the layout is sound.
ValidLayout validate(const Layout& layout);

// ---- writer vs reader -------------------------------------------------------
struct Misplacement {
  Region region;
  Coord coord;
  std::string writer_buffer, reader_buffer;
  int64_t writer_byte = 0, reader_byte = 0;
};

struct CompareReport {
  bool agree = false;
  int64_t elements = 0;     // all layers, pages, regions
  int64_t misplaced = 0;    // elements the two place at different (buffer, byte)
  std::array<int64_t, kRegionCount> misplaced_per_region{};
  std::vector<Misplacement> examples;  // a few, spread over regions and rows (spread_examples)
  // Whether the two keep a data byte's two codes at the same bits (CodeOrder); when not,
  // every data element is misread wherever its byte lies, and agree is false.
  bool codes_agree = true;
  std::string writer_codes, reader_codes;  // code_order_text of each
  std::string summary(const std::string& writer_name, const std::string& reader_name) const;
};

// Exact count over the full domain. Both layouts must describe the same dims.
CompareReport compare(const Layout& writer, const Layout& reader, int max_examples = 5);

// ---- text form ----------------------------------------------------------------
// Sizes a layout file may leave open. A size the file fixes may be repeated but not
// contradicted: instantiate throws when a set one differs from the file's.
struct DimsOverride {
  std::optional<int64_t> layers, pages, tokens_per_page, heads, head_dim;
  // The element format of K's and of V's bytes ("elements"), by the same rule.
  std::optional<ElementFormat> k_element, v_element;
};


// A parsed layout description with strides still as expressions over
// L P N H D dd sd F kd ks vd vs (docs/layouts.md).
struct LayoutSpec {
  std::string name, summary;
  Provenance provenance;
  DimsOverride defaults;
  std::vector<std::pair<std::string, std::string>> lets;  // named sub-expressions, in order
  struct BufferSpec {
    std::string name;
    std::optional<std::string> bytes;  // expression; absent: exactly what the regions need
    bool per_layer = false;
  };
  std::vector<BufferSpec> buffers;
  // A mode as expressions: a plain stride has inner "1" (docs/layouts.md).
  struct ModeSpec {
    std::string inner = "1", inner_stride = "0", stride;
  };
  struct RegionSpec {
    bool given = false;  // a scale region may be left out where its side holds FP8 (no block scales)
    std::string buffer, offset, layer, page, head;
    ModeSpec token, column;
  };
  std::array<RegionSpec, kRegionCount> regions;
  CodeOrder codes;  // "codes": a name or {"even": [m, e0, e1, s], "odd": [...]} bit positions
};

LayoutSpec parse_layout_spec(std::string_view json_text);          // throws LayoutError
Layout instantiate(const LayoutSpec& spec, const DimsOverride& dims);  // throws LayoutError
// The sizes instantiate would take from neither the file nor `dims` (today only
// layers, which defaults to 1), as "layers 1": what a command assumed, to say so.
std::vector<std::string> assumed_sizes(const LayoutSpec& spec, const DimsOverride& dims);
std::string to_json(const Layout& layout);                          // concrete, numbers only

// ---- presets --------------------------------------------------------------------
struct PresetInfo {
  std::string name, summary;
  Provenance provenance;
  std::vector<std::string> former_names;  // names this preset had before; they still load it
};
std::vector<PresetInfo> list_presets();
// A preset by its name or a former name; throws LayoutError naming the presets.
LayoutSpec preset_spec(std::string_view name);
bool is_preset_name(std::string_view name);  // a preset's name or former name
// A preset name, or a path to a JSON file.
LayoutSpec load_spec(std::string_view name_or_path);

// ---- byte map -------------------------------------------------------------------
// A picture of one page (layer, page) per buffer: which region owns each byte.
std::string byte_map(const Layout& layout, int64_t layer = 0, int64_t page = 0, int max_lines = 40);

}  // namespace nvfp4kv
