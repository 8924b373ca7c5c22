// docs/api.md's layout example, whole: an engine's layout described in JSON,
// checked (the diagnostics of a rejection), compared writer against reader, and
// the CPU reference quantizing one block. Needs no GPU; links nvfp4kv::reference.
// The regions between two "// [name]" lines are docs/api.md's code blocks.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/reference/quantize.hpp"

int main() try {
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
