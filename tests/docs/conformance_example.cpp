#include <iostream>

#include "nvfp4kv/conformance/check.hpp"

int main() {
  using namespace nvfp4kv;
  const ValidLayout layout = validate(instantiate(load_spec("vllm-packed-nhd-rows"), {1, 16, 16, 2, 128}));
  const conformance::Kit kit = conformance::generate(layout, {});  // or conformance::load_kit(dir, layout)
  // The engine stores kit.k and kit.v (of kit.options.type) through kit.slots into buffers
  // filled with conformance::kPoison; here nvfp4kv's own store stands in for its dump.
  const std::vector<std::vector<uint8_t>> dumps = kit.cache;
  const conformance::WriteReport report = conformance::check_write(kit, dumps);
  std::cout << report.text() << "\n";
  return report.ok() ? 0 : 1;
}
