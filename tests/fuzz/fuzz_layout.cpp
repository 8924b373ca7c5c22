// libFuzzer target over the layout text loader and the validator. Invariants:
// no crash, no hang, and never an accepted layout that the exhaustive
// byte-ownership map shows to overlap or leave its buffer.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "../cpu/brute_force.hpp"
#include "nvfp4kv/core/layout.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  // The first 5 bytes pick small sizes (so the brute-force oracle stays cheap); the rest is the text.
  const nvfp4kv::DimsOverride dims{1 + data[0] % 3, 1 + data[1] % 4, 1 + data[2] % 9, 1 + data[3] % 4,
                                   16 * (1 + data[4] % 5)};
  const std::string_view text(reinterpret_cast<const char*>(data + 5), size - 5);
  nvfp4kv::Layout layout;
  try {
    layout = nvfp4kv::instantiate(nvfp4kv::parse_layout_spec(text), dims);
  } catch (const nvfp4kv::LayoutError&) {
    return 0;
  }
  for (const auto& b : layout.buffers)
    if (b.bytes > (int64_t(1) << 24)) return 0;  // the oracle allocates the buffers
  const nvfp4kv::CheckResult result = nvfp4kv::check(layout);
  if (!result.report.ok) return 0;
  const auto bf = nvfp4kv::testing::brute_force(layout, int64_t(1) << 22);
  if (bf.overlap || bf.out_of_bounds) {
    std::fprintf(stderr, "accepted a layout the ownership map rejects:\n%s\n", nvfp4kv::to_json(layout).c_str());
    std::abort();
  }
  return 0;
}
