#pragma once
// Conformance of nvfp4kv's own store and gather through one layout: rows stored
// on the CPU reference and on the GPU (when there is one), every byte audited
// against the dense reference quantization, then gathered back and compared bit
// for bit. `nvfp4kv roundtrip` and the demo print this report.
#include <string>

#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/core/progress.hpp"
#include "nvfp4kv/core/status.hpp"
#include "nvfp4kv/harness/audit.hpp"

namespace nvfp4kv::harness {

struct RoundtripOptions {
  int64_t tokens = 0;  // 0: fill about 3/4 of the cache, at most 4096 tokens
  uint64_t seed = 1;
  bool use_gpu = true;
  Progress progress;  // told each stage, and how far the CPU store is
};

// One path (the CPU reference or the GPU).
struct RoundtripPath {
  bool ran = false;
  std::string why_not;  // when it did not run: why
  bool refused = false;  // it ran but refused the arguments (a failure)
  StoreAudit store;
  int64_t gather_values = 0, gather_bad = 0;  // values compared with the reference dequantization
  DeviceStatus status;
};

struct RoundtripReport {
  std::string layout;
  int64_t tokens = 0, heads = 0, head_dim = 0;
  int64_t expected_padding = 0, expected_out_of_range = 0;  // skipped rows the workload holds
  RoundtripPath cpu, gpu;
  bool path_ok(const RoundtripPath& p) const;
  bool ok() const;  // the CPU path passed, and the GPU path passed or could not run
};

RoundtripReport roundtrip(const ValidLayout& layout, const RoundtripOptions& options);
// Why roundtrip refuses this layout ("" when it takes it): its expected bytes are NVFP4 blocks,
// so a side that holds FP8 is refused (ArgumentError from roundtrip).
std::string roundtrip_problem(const Layout& layout);

}  // namespace nvfp4kv::harness
