// Test helper for the ml_dtypes cross-check: reads float32 blocks of 16 from
// stdin, quantizes each with the CPU reference, and writes 8 packed data bytes
// and 1 scale byte per block to stdout.
//   usage: nvfp4kv_quantize_blocks GLOBAL_SCALE standard|4over6 < blocks.f32 > out.bin
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "nvfp4kv/reference/quantize.hpp"

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[2], "standard") && std::strcmp(argv[2], "4over6"))) {
    std::fprintf(stderr, "usage: %s GLOBAL_SCALE standard|4over6 < blocks.f32 > out.bin\n", argv[0]);
    return 2;
  }
  const float gs = std::strtof(argv[1], nullptr);
  const auto rule = std::strcmp(argv[2], "4over6") == 0 ? nvfp4kv::ScaleRule::kFourOverSix
                                                        : nvfp4kv::ScaleRule::kStandard;
  std::vector<float> in;
  float buf[4096];
  size_t n;
  while ((n = std::fread(buf, sizeof(float), 4096, stdin)) > 0) in.insert(in.end(), buf, buf + n);
  if (in.size() % 16 != 0) {
    std::fprintf(stderr, "input is not a whole number of 16-float blocks\n");
    return 2;
  }
  const nvfp4kv::reference::DenseShape shape{int64_t(in.size() / 16), 1, 16};
  const auto q = nvfp4kv::reference::quantize(in.data(), nvfp4kv::ElementType::kFloat32, shape, gs, rule);
  for (int64_t b = 0; b < shape.tokens; ++b) {
    std::fwrite(&q.data[size_t(b) * 8], 1, 8, stdout);
    std::fwrite(&q.scales[size_t(b)], 1, 1, stdout);
  }
  return 0;
}
