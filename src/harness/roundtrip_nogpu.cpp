// Built without a CUDA compiler: the GPU path of the round trip cannot run.
#include "roundtrip_workload.hpp"

namespace nvfp4kv::harness {

RoundtripPath gpu_roundtrip(const ValidLayout&, const RoundtripWorkload&) {
  RoundtripPath p;
  p.why_not = "nvfp4kv was built without CUDA (no nvcc at configure time)";
  return p;
}

}  // namespace nvfp4kv::harness
