#pragma once
// The decode kernel's instances, one translation unit per head dim (decode_d64.cu,
// decode_d128.cu, decode_d256.cu), so that they compile in parallel; each covers the
// query types, soft-cap, query rows, routes and code orders of its head dim
// (kernel.cuh, dispatch_dim). decode.cu's host side reaches them through these.
#include <cuda_runtime_api.h>

#include "params.hpp"

namespace nvfp4kv::kernels::decode {

// Launches the call's instance of head dim kD (one stream, no sync).
template <int kD>
cudaError_t launch_dim(const DecodeParams& p, cudaStream_t stream);

// Blocks of the call's instance of head dim kD that fit on one SM at p.geometry's
// shared memory.
template <int kD>
cudaError_t occupancy_dim(const DecodeParams& p, int* per_sm);

extern template cudaError_t launch_dim<64>(const DecodeParams&, cudaStream_t);
extern template cudaError_t launch_dim<128>(const DecodeParams&, cudaStream_t);
extern template cudaError_t launch_dim<256>(const DecodeParams&, cudaStream_t);
extern template cudaError_t occupancy_dim<64>(const DecodeParams&, int*);
extern template cudaError_t occupancy_dim<128>(const DecodeParams&, int*);
extern template cudaError_t occupancy_dim<256>(const DecodeParams&, int*);

}  // namespace nvfp4kv::kernels::decode
