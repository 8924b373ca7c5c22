#pragma once
// Whether the current device runs this library's kernels as built for sm_90 or
// newer. The answer depends on the architectures the library was compiled for
// (an engine's CMAKE_CUDA_ARCHITECTURES), not only on the GPU: a build for
// "80" alone runs its compute_80 PTX on an H100, where every kernel body is a
// trap (device.cuh). The launchers ask before any launch.
#include <string>

namespace nvfp4kv::kernels {

// "" when the kernels can run on the current device; otherwise why not, naming
// the device's and the image's architectures. One query per device, then cached.
std::string device_arch_problem();

}  // namespace nvfp4kv::kernels
