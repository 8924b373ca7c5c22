#pragma once
// Device memory with RAII, poisoning and copies, for tests, benchmarks and the CLI.
#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "nvfp4kv/core/cache_buffers.hpp"
#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/harness/cuda_check.hpp"

namespace nvfp4kv::harness {

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    void* p = nullptr;
    NVFP4KV_CUDA_CHECK(cudaMalloc(&p, (count ? count : 1) * sizeof(T)));
    ptr_.reset(static_cast<T*>(p));
  }
  static DeviceBuffer from(const std::vector<T>& host) {
    DeviceBuffer d(host.size());
    d.upload(host);
    return d;
  }
  void upload(const std::vector<T>& host) {
    if (host.size() != count_) throw ArgumentError("DeviceBuffer::upload: size mismatch");
    NVFP4KV_CUDA_CHECK(cudaMemcpy(ptr_.get(), host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  // Every byte set to `byte`: outputs are poisoned before a kernel writes them.
  void fill_bytes(uint8_t byte) { NVFP4KV_CUDA_CHECK(cudaMemset(ptr_.get(), byte, count_ * sizeof(T))); }
  std::vector<T> download() const {
    std::vector<T> h(count_);
    NVFP4KV_CUDA_CHECK(cudaMemcpy(h.data(), ptr_.get(), count_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  T* get() const { return ptr_.get(); }
  size_t size() const { return count_; }

 private:
  struct Free {
    void operator()(T* p) const { cudaFree(p); }
  };
  std::unique_ptr<T, Free> ptr_;
  size_t count_ = 0;
};

// One layer's buffers of a layout on the device, every byte poisoned.
class DeviceCache {
 public:
  DeviceCache(const Layout& layout, uint8_t poison) {
    for (const Buffer& b : layout.buffers) {
      buffers_.emplace_back(size_t(b.bytes));
      buffers_.back().fill_bytes(poison);
    }
  }
  CacheBuffers view() const {
    CacheBuffers v;
    for (size_t i = 0; i < buffers_.size(); ++i) v.ptr[i] = buffers_[i].get();
    v.count = int(buffers_.size());
    return v;
  }
  // Every buffer's bytes from the host (as download gives them back; sizes must match).
  void upload(const std::vector<std::vector<uint8_t>>& host) {
    if (host.size() != buffers_.size()) throw ArgumentError("DeviceCache::upload: buffer count mismatch");
    for (size_t i = 0; i < host.size(); ++i) buffers_[i].upload(host[i]);
  }
  std::vector<std::vector<uint8_t>> download() const {
    std::vector<std::vector<uint8_t>> out;
    for (const auto& b : buffers_) out.push_back(b.download());
    return out;
  }

 private:
  std::vector<DeviceBuffer<uint8_t>> buffers_;
};

// The layout's format's mu (layers x kv heads x D floats) where the kernels read it
// (args.k_mean, required exactly when the format smooths K); one float where it smooths none,
// which no call is given.
inline DeviceBuffer<float> k_mean_on_device(const ValidLayout& layout) {
  return DeviceBuffer<float>::from(layout.format().has_k_mean() ? layout.format().k_mean : std::vector<float>{0.0f});
}

}  // namespace nvfp4kv::harness
