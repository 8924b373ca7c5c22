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

// The layout's format's per-channel vectors, mu and lambda (layers x kv heads x D floats
// each), where the kernels read them: give() sets args.k_mean and args.k_channel_scale to the
// device copies the format has and to null where it has none (what every call requires).
class FormatVectors {
 public:
  explicit FormatVectors(const CacheFormat& f)
      : mean_(DeviceBuffer<float>::from(f.has_k_mean() ? f.k_mean : std::vector<float>{0.0f})),
        scale_(DeviceBuffer<float>::from(f.has_k_channel_scale() ? f.k_channel_scale : std::vector<float>{1.0f})),
        has_mean_(f.has_k_mean()),
        has_scale_(f.has_k_channel_scale()) {}
  explicit FormatVectors(const ValidLayout& layout) : FormatVectors(layout.format()) {}

  const float* mean() const { return has_mean_ ? mean_.get() : nullptr; }
  const float* channel_scale() const { return has_scale_ ? scale_.get() : nullptr; }
  // StoreArgs, GatherArgs, DecodeArgs or PrefillArgs.
  template <typename Args>
  void give(Args& a) const {
    a.k_mean = mean();
    a.k_channel_scale = channel_scale();
  }

 private:
  DeviceBuffer<float> mean_, scale_;
  bool has_mean_, has_scale_;
};

}  // namespace nvfp4kv::harness
