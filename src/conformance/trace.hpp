#pragma once
// Where the kit's blocks are in a set of buffers (a writer's dump), found by their
// signatures: each block's data key (bytes 0..6) anywhere, each row of scales at
// the strides a writer plausibly uses. Private to check-write.
#include <vector>

#include "nvfp4kv/conformance/infer.hpp"
#include "nvfp4kv/conformance/kit.hpp"

namespace nvfp4kv::conformance {

struct ScaleRowLanding {
  Location at;
  int64_t stride = 1;
  int64_t groups = 0;  // consecutive groups from 0 that match
};

struct Trace {
  std::vector<std::vector<Location>> data;               // per block: where its data key is
  std::vector<std::vector<ScaleRowLanding>> scale_rows;  // per row id (row, head, side): where its scales are
  std::vector<std::vector<int32_t>> at;                  // per buffer byte: block * 9 + byte (8: its scale), or -1
  // Where block b's scale was found (through its row's landings).
  std::vector<Location> scale_of(const Kit& kit, const BlockId& b) const;
  // What the buffers hold at a byte: "poison (never written)", "v_data of row 3 (...), byte 9", "0x5a (no signature)".
  std::string describe(const Kit& kit, const std::vector<std::vector<uint8_t>>& buffers, const Location& at) const;
  // Where region r's elements of the stored rows were found, for fit_region.
  std::vector<Observation> observations(const Kit& kit, Region r) const;
};

Trace trace_kit(const Kit& kit, const std::vector<std::vector<uint8_t>>& buffers);

// The strides a row of scales is searched at: 1, 2, 4, the page size and the
// layout's own scale column strides.
std::vector<int64_t> scale_row_strides(const Layout& l);

}  // namespace nvfp4kv::conformance
