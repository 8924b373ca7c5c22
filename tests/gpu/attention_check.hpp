#pragma once
// What the attention GPU tests share: comparing a kernel's 16-bit outputs and
// its LSE with the fp64 reference's (NaN where the reference marks a row, never
// the poison a test filled the output with), and an attention call captured in a
// CUDA graph for replays.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "nvfp4kv/api/result.hpp"
#include "nvfp4kv/core/half.hpp"
#include "nvfp4kv/harness/cuda_check.hpp"

namespace nvfp4kv::testing {

template <typename... T>
std::string cat(const T&... parts) {
  std::ostringstream s;
  (s << ... << parts);
  return s.str();
}

struct Comparison {
  double rel_l2 = 0, max_abs = 0, lse_max_abs = 0;
  int64_t unwritten = 0;     // outputs still holding the 0xFFFF poison
  int64_t nan_mismatch = 0;  // NaN (or an infinite LSE) on one side only
  int64_t nan_rows = 0;      // (row, head)s the reference marks NaN
};

// The first `count` outputs (rows of `dim`) and, with got_lse, the first
// `lse_count` LSE values.
inline Comparison compare_attention(const std::vector<uint16_t>& got, const std::vector<double>& want, size_t count,
                                    int64_t dim, ElementType type, const std::vector<float>* got_lse,
                                    const std::vector<double>& want_lse, size_t lse_count) {
  Comparison o;
  double num = 0, den = 0;
  for (size_t i = 0; i < count; ++i) {
    const float x = type == ElementType::kBFloat16 ? bf16_to_float(got[i]) : fp16_to_float(got[i]);
    const double w = want[i];
    if (std::isnan(w) || std::isnan(x)) {
      o.nan_mismatch += std::isnan(w) != std::isnan(x);
      o.nan_rows += std::isnan(w) && i % size_t(dim) == 0;
      continue;
    }
    o.unwritten += got[i] == 0xFFFF;
    num += (x - w) * (x - w);
    den += w * w;
    o.max_abs = std::max(o.max_abs, std::fabs(x - w));
  }
  o.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (got_lse)
    for (size_t i = 0; i < lse_count; ++i) {
      const double w = want_lse[i], x = (*got_lse)[i];
      if (std::isnan(w) || std::isnan(x)) o.nan_mismatch += std::isnan(w) != std::isnan(x);
      else if (std::isinf(w) || std::isinf(x)) o.nan_mismatch += w != x;
      else o.lse_max_abs = std::max(o.lse_max_abs, std::fabs(x - w));
    }
  return o;
}

// One attention call captured in a CUDA graph on a stream of its own: `launch(stream)`
// returns the call's Result (captured()); replay() launches the graph and waits for it.
class CapturedGraph {
 public:
  template <typename Launch>
  explicit CapturedGraph(Launch launch) {
    NVFP4KV_CUDA_CHECK(cudaStreamCreate(&stream_));
    NVFP4KV_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
    captured_ = launch(stream_);
    NVFP4KV_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph_));
    if (captured_.ok()) NVFP4KV_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  ~CapturedGraph() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
    cudaStreamDestroy(stream_);
  }
  const Result& captured() const { return captured_; }
  void replay() const {
    NVFP4KV_CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
    NVFP4KV_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  Result captured_;
};

}  // namespace nvfp4kv::testing
