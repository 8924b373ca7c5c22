#pragma once
// check-write and check-read: an engine's own writer and reader against the layout
// it claims, through the kit (kit.hpp). Each returns a report that says, per region,
// what is right, what differs only by rounding, and where each wrong byte came from
// or went to, plus the map the engine really used, as a layout (docs/conformance.md).
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "nvfp4kv/conformance/infer.hpp"
#include "nvfp4kv/conformance/kit.hpp"
#include "nvfp4kv/core/layout_diff.hpp"
#include "nvfp4kv/core/progress.hpp"

namespace nvfp4kv::conformance {

// ---- check-write ----------------------------------------------------------------
enum class RegionVerdict : uint8_t { kExact, kRoundingOnly, kMisplaced };
const char* verdict_name(RegionVerdict v);  // "exact", "rounding-only", "misplaced"

// One element of a stored row that the writer did not put where the layout says.
struct ElementPlace {
  Region region;
  Coord coord;                    // (layer, page, position, head, byte or group) by the layout
  int64_t row = 0;                // input row
  Location expected;              // the layout's byte
  std::optional<Location> found;  // where its content is in the dump (by its signature)
  std::string expected_holds;     // what the dump holds at the layout's byte
  // Not found: where the writer's inferred map puts it, and what is there now (what overwrote it).
  std::optional<Location> writer_at;
  std::string writer_holds;
};

struct RegionWriteReport {
  Region region = Region::kKData;
  RegionVerdict verdict = RegionVerdict::kExact;
  int64_t bytes = 0;                    // bytes the stored rows own in this region
  int64_t exact = 0, rounding = 0, wrong = 0;
  int64_t found_elsewhere = 0, not_found = 0;  // of the wrong bytes
  std::optional<RoundingPolicy> policy;        // explains every rounding difference (the most general one needed)
  std::vector<ElementPlace> examples;          // of wrong bytes, spread over the stored rows
  std::optional<RegionFit> writer_map;         // misplaced regions: the map inferred from where elements were found
};

// Bytes the writer changed outside the stored rows' cells, in runs of consecutive bytes.
struct TouchedRun {
  Location first;
  int64_t bytes = 0;
  std::string owner;  // the layout's element at the first byte ("" when none owns it)
  std::string holds;  // what was written there, when its signature says: "v_data of row 12 (...)"
};

struct WriteReport {
  std::string layout;
  std::vector<std::string> buffers;  // the layout's buffer names, for Location::buffer
  std::array<RegionWriteReport, kRegionCount> regions;
  std::vector<TouchedRun> outside_cells;   // bytes no element of the layout owns
  std::vector<TouchedRun> unstored_cells;  // bytes of cells no stored row owns: other pages, positions, layers
  int64_t outside_bytes = 0, unstored_bytes = 0;
  int64_t misplaced_there = 0;  // of those, bytes holding a stored row's element (misplaced, above)
  std::vector<int64_t> padding_rows_written;  // padding rows (slot -1) whose bytes are in the dump
  std::vector<Region> not_inferred;           // misplaced regions whose map could not be inferred (no element found)
  std::optional<Layout> writer_layout;        // the layout with each misplaced region's inferred map; none unless all were
  std::string writer_layout_check;            // check()'s verdict on it
  std::vector<MapDifference> differences;     // writer_layout against the layout
  bool ok() const;                            // every region exact or rounding-only, nothing else touched
  std::string text() const;
  std::string json() const;                   // the report object of docs/cli-json.md
};

// dumps: the engine's buffers after storing the kit's rows (slots, global scales
// and layer as the kit gives them) into buffers filled with kPoison, indexed and
// sized like the layout's. Throws ArgumentError when they are not.
WriteReport check_write(const Kit& kit, const std::vector<std::vector<uint8_t>>& dumps, int max_examples = 8,
                        const Progress& progress = {});

// ---- check-read -----------------------------------------------------------------
// One block of 16 elements the reader got wrong, and what it read instead.
struct BlockRead {
  Side side = Side::kK;
  int64_t read_row = 0, row = 0, head = 0, group = 0;  // row in the reader's output; input row
  Coord cell;                                         // (layer, page, position, head, group)
  std::string what;            // "data and scale", "data", "scale", "zeros", "non-finite", "unidentified"
  std::optional<Location> data_from;   // the 8 bytes its codes came from
  std::string data_owner;              // what the layout keeps there
  std::optional<uint8_t> scale_code;   // the scale it used, and where that was when found
  std::optional<Location> scale_from;
  std::string scale_owner;
  bool aliased = false;  // data read from the layout's scale bytes, or a scale from its data bytes
};

struct SideReadReport {
  int64_t elements = 0, correct = 0;
  int64_t blocks = 0, blocks_misread = 0;
  int64_t wrong_data = 0, wrong_scale = 0, aliased = 0, unidentified = 0;  // of the misread blocks
};

// One attention probe (query head) whose output is not the token it singles out.
struct ProbeRead {
  int64_t probe = 0, q_head = 0, sequence = 0, position = 0;
  std::string what;                      // "attended to position P" (K misread), "V misread", "unidentified"
  int64_t attended = -1;                 // the position whose V came out instead
  std::optional<BlockRead> v_block;      // the first wrong group of V, traced
  double rel_l2 = 0;                     // against the expected output
};

struct ReadReport {
  std::string layout;
  std::vector<std::string> buffers;  // the layout's buffer names, for Location::buffer
  std::string mode;  // "rows" (dequantized rows) or "attention" (decode attention over the probes)
  std::array<SideReadReport, 2> sides;
  std::vector<BlockRead> examples;
  // attention
  int64_t probe_rows = 0, probe_correct = 0, wrong_token = 0, v_misread = 0, non_finite = 0, unidentified = 0;
  int64_t not_isolating = 0;  // probes (of all) whose query does not single out one token: checked as a whole
  std::vector<ProbeRead> probe_examples;
  // The reader's map, inferred from where the misread blocks' bytes came from.
  std::array<std::optional<RegionFit>, kRegionCount> reader_maps;
  std::vector<Region> not_inferred;  // misread regions whose map could not be inferred
  std::optional<Layout> reader_layout;  // the layout with each misread region's map; none unless all were inferred
  std::vector<MapDifference> differences;
  bool ok() const;
  std::string text() const;
  std::string json() const;
};

// k, v: the reader's output, (tokens, heads, D) in sequence order (the kit's
// cu_seqlens) as floats. Throws ArgumentError when the sizes are not the kit's.
ReadReport check_read_rows(const Kit& kit, const std::vector<float>& k, const std::vector<float>& v, int max_examples = 8,
                           const Progress& progress = {});
// out: the reader's decode attention over the kit's probes, (probes, q_heads, D).
ReadReport check_read_attention(const Kit& kit, const std::vector<float>& out, int max_examples = 8,
                                const Progress& progress = {});

// "k_data of row 12 (page 3, position 4), head 1, bytes 8..15": a block's content by its name.
std::string describe_block(const Kit& kit, const BlockId& b, bool scale);

}  // namespace nvfp4kv::conformance
