#pragma once
// What the GPU launchers return. They never throw (engines call them every step,
// often inside CUDA-graph capture); every argument is checked before anything is
// launched, and a failed check launches nothing and says which argument and why.
#include <string>

namespace nvfp4kv {

enum class Status { kOk, kInvalidArgument, kUnsupported, kCudaError };

struct [[nodiscard]] Result {
  Status status = Status::kOk;
  std::string message;
  bool ok() const { return status == Status::kOk; }
};

}  // namespace nvfp4kv
