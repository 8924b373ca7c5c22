// The decode kernel's instances of head dim 128 (instances.hpp).
#include "kernel.cuh"

namespace nvfp4kv::kernels::decode {

template cudaError_t launch_dim<128>(const DecodeParams&, cudaStream_t);
template cudaError_t occupancy_dim<128>(const DecodeParams&, int*);

}  // namespace nvfp4kv::kernels::decode
