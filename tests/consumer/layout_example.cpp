// docs/api.md's CPU examples, whole: planning a cache, an engine's layout from JSON,
// checked (the diagnostics of a rejection), compared writer against reader, and the
// CPU reference quantizing one block. Needs no GPU, so CI runs it everywhere; links
// nvfp4kv::reference.
// The regions between two "// [name]" lines are docs/api.md's code blocks.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

// [includes]
#include "nvfp4kv/core/layout.hpp"        // layouts: load_spec, instantiate, check, validate, compare
#include "nvfp4kv/core/plan.hpp"          // plan, PlanRequest
#include "nvfp4kv/reference/quantize.hpp"  // the CPU reference
// [includes]
#include "plan_example.hpp"

int main() try {
  const nvfp4kv::Plan planned = plan_example();
  if (planned.layout.layout().dims.layers != 32) {
    std::printf("FAILED: the plan must hold 32 layers\n");
    return 1;
  }
  {
    // [json]
    using namespace nvfp4kv;
    // An engine's own layout, from a JSON file or a preset name; the sizes the
    // description leaves open are given here. validate() throws LayoutError with
    // the checker's verdict (two colliding elements and the byte) if it is unsound.
    DimsOverride dims;
    dims.layers = 32;
    dims.pages = 4096;
    dims.tokens_per_page = 16;
    dims.heads = 8;
    dims.head_dim = 128;
    const ValidLayout vllm = validate(instantiate(load_spec("vllm-legacy-hnd"), dims));
    std::printf("%s: %s\n", vllm.layout().name.c_str(), vllm.report().summary().c_str());
    // [json]
  }
  // [check]
  using namespace nvfp4kv;
  // A layout from a JSON file or a preset name, with the sizes it leaves open;
  // check() proves it sound or says why not, naming two elements and the byte.
  DimsOverride dims;
  dims.layers = 4;
  dims.pages = 64;
  dims.heads = 1;
  dims.tokens_per_page = 16;
  dims.head_dim = 128;
  const Layout writer = instantiate(load_spec("vllm-packed-nhd-writer"), dims);
  const CheckResult res = check(writer);
  if (!res.valid) std::printf("rejected: %s\n", res.report.summary().c_str());
  // Writer against reader: which elements the two place at different bytes.
  const Layout reader = instantiate(load_spec("vllm-packed-nhd-reader"), dims);
  const CompareReport cmp = compare(writer, reader);
  std::printf("%s\n", cmp.summary(writer.name, reader.name).c_str());
  // [check]
  if (res.valid || cmp.agree || cmp.misplaced == 0) {
    std::printf("FAILED: the vLLM packed NHD pair must be rejected and disagree\n");
    return 1;
  }

  // [quantize]
  // The CPU reference: (tokens, heads, D) floats to E2M1 bytes and E4M3 scales.
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[size_t(i)] = 0.25f * float(i - 8);
  const reference::QuantizedTensor q =
      reference::quantize(x.data(), ElementType::kFloat32, {1, 1, 16}, /*global_scale=*/1.0f, ScaleRule::kStandard);
  const std::vector<float> back = reference::dequantize(q, 1.0f);  // (1, 1, 16)
  // [quantize]
  // Block scale e4m3(2 / 6) = 0.34375: every element within one E2M1 half-step (1) of it.
  std::printf("scale byte 0x%02x, x[3] = %g -> %g\n", q.scales[0], double(x[3]), double(back[3]));
  for (int i = 0; i < 16; ++i)
    if (!(std::fabs(back[size_t(i)] - x[size_t(i)]) <= 0.34375f)) return 1;
  return 0;
} catch (const std::exception& e) {
  std::printf("FAILED: %s\n", e.what());
  return 1;
}
