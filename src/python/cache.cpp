// nvfp4kv._core.Cache: the buffers of one validated layout (allocated here or
// adopted from the caller), its per-layer global scales and its status
// counters, with the operations on them. On a CUDA device the operations are
// the GPU API's (kernels on the given stream, no synchronisation, no allocation,
// so they can be captured in a CUDA graph); in host memory they are the CPU
// reference's. Both take core's argument structs, built here by field name from
// arrays checked in arrays.cpp.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <tuple>
#include <utility>

#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/core/ops.hpp"
#include "nvfp4kv/reference/attention.hpp"
#include "nvfp4kv/reference/cache.hpp"
#if NVFP4KV_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "nvfp4kv/api/decode.hpp"
#include "nvfp4kv/api/prefill.hpp"
#include "nvfp4kv/api/kv_cache.hpp"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace nvfp4kv::python {
namespace {

#if NVFP4KV_HAVE_CUDA
void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CudaError(std::string(what) + ": " + cudaGetErrorString(e));
}

// Makes `device` current for the scope of a call, and restores the caller's.
class DeviceGuard {
 public:
  explicit DeviceGuard(const Place& p) {
    if (!p.cuda) return;
    cuda_ok(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ == p.device)
      previous_ = -1;
    else
      cuda_ok(cudaSetDevice(p.device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

void raise_for(const Result& r) {
  switch (r.status) {
    case Status::kOk: return;
    case Status::kInvalidArgument: throw ArgumentError(r.message);
    case Status::kUnsupported: throw UnsupportedError(r.message);
    case Status::kCudaError: throw CudaError(r.message);
  }
}
#else
class DeviceGuard {
 public:
  explicit DeviceGuard(const Place&) {}
};
#endif

// Memory this cache owns: host bytes, or a device allocation freed on its device.
class Allocation {
 public:
  Allocation(const Place& place, size_t bytes) : place_(place) {
    const size_t n = bytes ? bytes : 1;
    if (!place.cuda) {
      host_.assign(n, 0);
      ptr_ = host_.data();
      return;
    }
#if NVFP4KV_HAVE_CUDA
    DeviceGuard on(place);
    void* p = nullptr;
    cuda_ok(cudaMalloc(&p, n), "cudaMalloc");
    ptr_ = static_cast<uint8_t*>(p);
    cuda_ok(cudaMemset(p, 0, n), "cudaMemset");
#else
    throw UnsupportedError("this nvfp4kv was built without CUDA: a cache on a CUDA device needs the kernels");
#endif
  }
  ~Allocation() {
#if NVFP4KV_HAVE_CUDA
    if (place_.cuda && ptr_) {
      int previous = 0;
      (void)cudaGetDevice(&previous);
      (void)cudaSetDevice(place_.device);
      (void)cudaFree(ptr_);
      (void)cudaSetDevice(previous);
    }
#endif
  }
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
  uint8_t* get() const { return ptr_; }

 private:
  Place place_;
  std::vector<uint8_t> host_;
  uint8_t* ptr_ = nullptr;
};

ScaleRule rule_arg(const std::string& rule) {
  if (rule == "standard") return ScaleRule::kStandard;
  if (rule == "4over6") return ScaleRule::kFourOverSix;
  throw ArgumentError("rule: expected \"standard\" or \"4over6\", got \"" + rule + "\"");
}

// device < 0: the current one.
Place place_of(bool cuda, int device) {
  if (!cuda) return Place{};
#if NVFP4KV_HAVE_CUDA
  if (device < 0) cuda_ok(cudaGetDevice(&device), "cudaGetDevice");
#endif
  return Place{true, device};
}

class Cache {
 public:
  Cache(const ValidLayout& layout, bool cuda, int device, std::optional<nb::list> buffers,
        std::optional<Array> global_scales)
      : layout_(layout), place_(place_of(cuda, device)) {
    const Layout& l = layout_.layout();
    if (l.buffers.size() > size_t(kMaxBuffers))
      throw ArgumentError("layout \"" + l.name + "\" has " + std::to_string(l.buffers.size()) +
                          " buffers, at most " + std::to_string(kMaxBuffers) + " are supported");
    if (buffers)
      adopt(*buffers);
    else
      allocate();
    if (global_scales) {
      const ArrayFacts s(*global_scales);
      require_dense(s, "global_scales", place_, {DType::kFloat32}, {l.dims.layers, 2});
      scales_ = reinterpret_cast<float*>(bytes_of(*global_scales));
      adopted_.push_back(*global_scales);
    } else {
      owned_.push_back(std::make_unique<Allocation>(place_, size_t(l.dims.layers) * 2 * sizeof(float)));
      scales_ = reinterpret_cast<float*>(owned_.back()->get());
      set_global_scales(std::vector<float>(size_t(l.dims.layers), 1.0f), std::vector<float>(size_t(l.dims.layers), 1.0f));
    }
    owned_.push_back(std::make_unique<Allocation>(place_, sizeof(DeviceStatus)));
    status_ = reinterpret_cast<DeviceStatus*>(owned_.back()->get());
#if NVFP4KV_HAVE_CUDA
    // The kernels take a format's K smoothing and channel-scale rows from device memory:
    // copies of the layout's own values, made once (the CPU reference reads the format itself).
    if (place_.cuda) {
      const auto upload = [&](const std::vector<float>& values) -> const float* {
        if (values.empty()) return nullptr;
        const size_t bytes = values.size() * sizeof(float);
        owned_.push_back(std::make_unique<Allocation>(place_, bytes));
        DeviceGuard on(place_);
        cuda_ok(cudaMemcpy(owned_.back()->get(), values.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
        return reinterpret_cast<const float*>(owned_.back()->get());
      };
      k_mean_ = upload(layout_.format().k_mean);
      k_channel_scale_ = upload(layout_.format().k_channel_scale);
    }
#endif
  }

  Cache(const Cache&) = delete;  // owns device memory
  Cache& operator=(const Cache&) = delete;

  const ValidLayout& layout() const { return layout_; }
  std::string device() const { return place_.text(); }

  // ---- the operations ---------------------------------------------------------
  void store(const Array& k_array, const Array& v_array, const Array& slots_array, int64_t layer,
             const std::string& rule, uintptr_t stream, std::optional<Array> k_scale, std::optional<Array> v_scale) {
    const ArrayFacts k(k_array), v(v_array), slots(slots_array);
    const CacheDims& d = layout_.layout().dims;
    require_layer(layer);
    const std::vector<DType> types = row_types();
    require_place(k, "k", place_);
    require_place(v, "v", place_);
    require_place(slots, "slots", place_);
    require_dtype(k, "k", types);
    const int64_t stride = require_rows(k, "k", d.heads, d.head_dim);
    const int64_t tokens = k.shape[0];
    require_ndim(v, "v", {tokens, d.heads, d.head_dim});
    if (dtype_of(v.dtype) != dtype_of(k.dtype))
      fail("v", std::string("must have k's dtype ") + dtype_name(dtype_of(k.dtype)) + ", got a " + describe(v));
    if (require_rows(v, "v", d.heads, d.head_dim) != stride && tokens > 1)
      fail("v", "must have k's token stride " + std::to_string(stride) + " elements, got " + std::to_string(v.strides[0]));
    require_dtype(slots, "slots", {DType::kInt32, DType::kInt64});
    require_ndim(slots, "slots", {tokens});
    require_contiguous(slots, "slots");
    if (place_.cuda) {
      require_aligned(k.data, "k", 16);
      require_aligned(v.data, "v", 16);
      if (tokens > 1 && stride % 8 != 0)
        fail("k", "the token stride must be a multiple of 8 elements (16-byte aligned rows), got " + std::to_string(stride));
    }
    StoreArgs a;
    a.rows = {k.data, v.data, tokens, stride};
    a.type = element_type(dtype_of(k.dtype));
    a.slots = slots.data;
    a.slots_are_int64 = dtype_of(slots.dtype) == DType::kInt64;
    a.layer = layer;
    a.k_global_scale = scale_arg(k_scale, "k_scale", layer, 0);
    a.v_global_scale = scale_arg(v_scale, "v_scale", layer, 1);
    a.rule = rule_arg(rule);
    a.status = status_;
    a.k_mean = k_mean_;
    a.k_channel_scale = k_channel_scale_;
    run([&](const CacheBuffers& b, uintptr_t s) {
#if NVFP4KV_HAVE_CUDA
      if (place_.cuda) return raise_for(nvfp4kv::store(layout_, b, a, reinterpret_cast<cudaStream_t>(s)));
#endif
      (void)s;
      reference::store(layout_, b, a);
    }, layer, stream);
  }

  void gather(const Array& block_table_array, const Array& cu_seqlens_array, int64_t layer, const OutArray& k_array,
              const OutArray& v_array, uintptr_t stream) {
    const ArrayFacts block_table(block_table_array), cu_seqlens(cu_seqlens_array), k_out(k_array), v_out(v_array);
    const CacheDims& d = layout_.layout().dims;
    require_layer(layer);
    const int64_t batch = require_block_table(block_table);
    require_dense(cu_seqlens, "cu_seqlens", place_, {DType::kInt32}, {batch + 1});
    const std::vector<DType> types = row_types();
    const int64_t rows = k_out.ndim() > 0 ? k_out.shape[0] : 0;
    for (const ArrayFacts* a : {&k_out, &v_out}) {
      const std::string name = a == &k_out ? "k_out" : "v_out";
      require_dense(*a, name, place_, types, {rows, d.heads, d.head_dim});
      if (place_.cuda) require_aligned(a->data, name, 16);
    }
    if (dtype_of(k_out.dtype) != dtype_of(v_out.dtype))
      fail("v_out", std::string("must have k_out's dtype ") + dtype_name(dtype_of(k_out.dtype)) + ", got a " + describe(v_out));
    if (!place_.cuda) {  // host memory: the offsets can be read, so the rows they name are checked too
      const int32_t* cu = static_cast<const int32_t*>(cu_seqlens.data);
      for (int64_t i = 0; i <= batch; ++i)
        if (cu[i] < 0 || cu[i] > rows)
          fail("cu_seqlens", "entry " + std::to_string(i) + " = " + std::to_string(cu[i]) + " is outside the outputs' " +
                                 std::to_string(rows) + " rows");
    }
    GatherArgs a;
    a.batch.block_table = static_cast<const int32_t*>(block_table.data);
    a.batch.block_table_stride = batch ? block_table.shape[1] : 1;
    a.batch.cu_seqlens = static_cast<const int32_t*>(cu_seqlens.data);
    a.batch.batch = batch;
    a.layer = layer;
    a.k_global_scale = scales_ + 2 * layer;
    a.v_global_scale = scales_ + 2 * layer + 1;
    a.out_type = element_type(dtype_of(k_out.dtype));
    a.k_out = k_array.data();
    a.v_out = v_array.data();
    a.status = status_;
    a.k_mean = k_mean_;
    a.k_channel_scale = k_channel_scale_;
    run([&](const CacheBuffers& b, uintptr_t s) {
#if NVFP4KV_HAVE_CUDA
      if (place_.cuda) return raise_for(nvfp4kv::gather(layout_, b, a, reinterpret_cast<cudaStream_t>(s)));
#endif
      (void)s;
      reference::gather(layout_, b, a);
    }, layer, stream);
  }

  // The query (rows, q heads, D) of a decode or attention call: on this cache's device,
  // of a row type, heads packed. Returns its row stride in elements.
  int64_t require_query(const ArrayFacts& q) const {
    const CacheDims& d = layout_.layout().dims;
    require_place(q, "q", place_);
    require_dtype(q, "q", row_types());
    require_ndim(q, "q", {-1, -1, d.head_dim});
    return require_rows(q, "q", q.shape[1], d.head_dim);
  }

  // The kv lengths of `batch` sequences: seq_lens (batch,) or cu_seqlens (batch + 1,), exactly one.
  ArrayFacts require_lengths(const std::optional<Array>& seq_lens, const std::optional<Array>& cu_seqlens,
                             int64_t batch, const char* what) const {
    if (bool(seq_lens) == bool(cu_seqlens))
      fail("seq_lens", std::string("give the ") + what +
                           " lengths as seq_lens (batch,) or as cu_seqlens (batch + 1,), exactly one");
    const ArrayFacts lens(seq_lens ? *seq_lens : *cu_seqlens);
    require_dense(lens, seq_lens ? "seq_lens" : "cu_seqlens", place_, {DType::kInt32}, {seq_lens ? batch : batch + 1});
    return lens;
  }

  // The output beside its query: dense, of the query's type and shape; on the GPU both
  // 16-byte aligned and the query's rows a multiple of 8 elements apart.
  void require_output(const ArrayFacts& out, const ArrayFacts& q, int64_t q_stride) const {
    const int64_t rows = q.shape[0];
    require_dense(out, "out", place_, {dtype_of(q.dtype)}, {rows, q.shape[1], layout_.layout().dims.head_dim});
    if (!place_.cuda) return;
    require_aligned(q.data, "q", 16);
    require_aligned(out.data, "out", 16);
    if (rows > 1 && q_stride % 8 != 0)
      fail("q", "the row stride must be a multiple of 8 elements, got " + std::to_string(q_stride));
  }

  // The fields decode and attention calls share (DecodeArgs and PrefillArgs spell
  // them alike): the query, the block table and kv lengths (seq_lens or cu_seqlens),
  // the layer's global scales, the options, the outputs (lse of `rows` rows, checked
  // here with sinks) and the status counters.
  template <typename Args>
  void fill_shared_args(Args& a, const ArrayFacts& q, int64_t q_heads, int64_t q_stride, const Array& block_table_array,
                        bool lens_are_seq_lens, const ArrayFacts& lens, int64_t batch, int64_t layer, float softmax_scale,
                        int64_t window, float softcap, const std::optional<Array>& sinks_array,
                        const OutArray& out_array, const std::optional<OutArray>& lse_array, int64_t rows) const {
    a.q = q.data;
    a.q_type = element_type(dtype_of(q.dtype));
    a.q_heads = q_heads;
    a.q_token_stride = q_stride;
    a.batch.block_table = static_cast<const int32_t*>(block_table_array.data());
    a.batch.block_table_stride = batch ? int64_t(block_table_array.shape(1)) : 1;
    (lens_are_seq_lens ? a.batch.seq_lens : a.batch.cu_seqlens) = static_cast<const int32_t*>(lens.data);
    a.batch.batch = batch;
    a.layer = layer;
    a.softmax_scale = softmax_scale;
    a.k_global_scale = scales_ + 2 * layer;
    a.v_global_scale = scales_ + 2 * layer + 1;
    a.window = window;
    a.softcap = softcap;
    if (sinks_array) {
      const ArrayFacts s(*sinks_array);
      require_dense(s, "sinks", place_, {DType::kFloat32}, {q_heads});
      a.sinks = static_cast<const float*>(s.data);
    }
    a.out = out_array.data();
    if (lse_array) {
      const ArrayFacts l(*lse_array);
      require_dense(l, "lse", place_, {DType::kFloat32}, {rows, q_heads});
      a.lse = static_cast<float*>(lse_array->data());
    }
    a.status = status_;
    a.k_mean = k_mean_;
    a.k_channel_scale = k_channel_scale_;
  }

  // Paged decode attention for one query token per sequence (core/ops.hpp
  // DecodeArgs). Sequence lengths as seq_lens (batch) or cu_seqlens (batch + 1).
  void decode(const Array& q_array, const Array& block_table_array, std::optional<Array> seq_lens_array,
              std::optional<Array> cu_seqlens_array, int64_t layer, const OutArray& out_array, float softmax_scale,
              int64_t window, float softcap, std::optional<Array> sinks_array, std::optional<OutArray> lse_array,
              std::optional<OutArray> workspace_array, uintptr_t stream) {
    require_layer(layer);
    const ArrayFacts q(q_array), out(out_array);
    const int64_t q_stride = require_query(q);
    const int64_t batch = q.shape[0], q_heads = q.shape[1];
    const int64_t table_batch = require_block_table(ArrayFacts(block_table_array));
    if (table_batch != batch)
      fail("block_table", "expected " + std::to_string(batch) + " rows (one per query), got " + std::to_string(table_batch));
    const ArrayFacts lens = require_lengths(seq_lens_array, cu_seqlens_array, batch, "sequence");
    require_output(out, q, q_stride);
    DecodeArgs a;
    fill_shared_args(a, q, q_heads, q_stride, block_table_array, bool(seq_lens_array), lens, batch, layer, softmax_scale,
                     window, softcap, sinks_array, out_array, lse_array, batch);
    if (!place_.cuda) {
      run([&](const CacheBuffers& b, uintptr_t) { decode_on_host(b, a); }, layer, 0);
      return;
    }
#if NVFP4KV_HAVE_CUDA
    DeviceGuard on(place_);
    const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    const size_t need = workspace_bytes(batch, q_heads, a.batch.block_table_stride);
    std::tie(a.workspace, a.workspace_bytes) = workspace_for(workspace_array, need, s, "decode_workspace_bytes");
    run([&](const CacheBuffers& b, uintptr_t) { raise_for(nvfp4kv::decode_attention(layout_, b, a, s)); }, layer, stream);
#else
    (void)stream;
    (void)workspace_array;
#endif
  }

  // Attention for one forward's batch of any q lengths (core/ops.hpp PrefillArgs):
  // sequence s's new tokens are rows cu_seqlens_q[s] .. of q and out; q_lens is
  // the host's copy of their lengths (the GPU routes q length 1 runs to decode).
  void attention(const Array& q_array, const Array& cu_q_array, const std::vector<int32_t>& q_lens,
                 const Array& block_table_array, std::optional<Array> seq_lens_array,
                 std::optional<Array> cu_seqlens_array, int64_t layer, const OutArray& out_array, float softmax_scale,
                 int64_t window, float softcap, std::optional<Array> sinks_array, std::optional<OutArray> lse_array,
                 std::optional<OutArray> workspace_array, uintptr_t stream) {
    require_layer(layer);
    const ArrayFacts q(q_array), out(out_array);
    const int64_t q_stride = require_query(q);
    const int64_t rows = q.shape[0], q_heads = q.shape[1];
    const int64_t batch = require_block_table(ArrayFacts(block_table_array));
    if (int64_t(q_lens.size()) != batch)
      fail("q_lens", "expected " + std::to_string(batch) + " lengths (one per block-table row), got " +
                         std::to_string(q_lens.size()));
    int64_t total = 0, longest = 0;
    for (int32_t n : q_lens) {
      if (n < 0) fail("q_lens", "lengths must be >= 0, got " + std::to_string(n));
      total += n, longest = std::max<int64_t>(longest, n);
    }
    if (total != rows) fail("q", "expected " + std::to_string(total) + " rows (the sum of q_lens), got " + std::to_string(rows));
    require_dense(ArrayFacts(cu_q_array), "cu_seqlens_q", place_, {DType::kInt32}, {batch + 1});
    const ArrayFacts lens = require_lengths(seq_lens_array, cu_seqlens_array, batch, "kv");
    require_output(out, q, q_stride);
    PrefillArgs a;
    fill_shared_args(a, q, q_heads, q_stride, block_table_array, bool(seq_lens_array), lens, batch, layer, softmax_scale,
                     window, softcap, sinks_array, out_array, lse_array, rows);
    a.cu_seqlens_q = static_cast<const int32_t*>(cu_q_array.data());
    a.max_q_len = longest;
    if (!place_.cuda) {
      for (int64_t i = 0; i < batch; ++i)  // host memory: the promise the GPU path cannot check
        if (a.cu_seqlens_q[i + 1] - a.cu_seqlens_q[i] != q_lens[size_t(i)])
          fail("q_lens", "sequence " + std::to_string(i) + ": q_lens says " + std::to_string(q_lens[size_t(i)]) +
                             ", cu_seqlens_q " + std::to_string(a.cu_seqlens_q[i + 1] - a.cu_seqlens_q[i]));
      run([&](const CacheBuffers& b, uintptr_t) {
        const reference::PrefillResult r = reference::prefill_attention(layout_, b, a);
        write_on_host(r.out, r.lse, a.q_type, a.out, a.lse);
      }, layer, 0);
      return;
    }
#if NVFP4KV_HAVE_CUDA
    DeviceGuard on(place_);
    const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    size_t need = 0;
    raise_for(mixed_workspace_bytes(layout_, q_lens.data(), batch, q_heads, a.batch.block_table_stride, &need));
    MixedBatch m{.args = a, .q_lens = q_lens.data()};
    std::tie(m.workspace, m.workspace_bytes) = workspace_for(workspace_array, need, s, "attention_workspace_bytes");
    run([&](const CacheBuffers& b, uintptr_t) { raise_for(nvfp4kv::mixed_attention(layout_, b, m, s)); }, layer, stream);
#else
    (void)stream;
    (void)workspace_array;
#endif
  }

  // Workspace bytes a GPU attention call over these q lengths needs (its decode runs').
  size_t attention_workspace_bytes(const std::vector<int32_t>& q_lens, int64_t q_heads, int64_t block_table_stride) {
#if NVFP4KV_HAVE_CUDA
    if (!place_.cuda) return 0;
    DeviceGuard on(place_);
    size_t need = 0;
    raise_for(mixed_workspace_bytes(layout_, q_lens.data(), int64_t(q_lens.size()), q_heads, block_table_stride, &need));
    return need;
#else
    (void)q_lens, (void)q_heads, (void)block_table_stride;
    return 0;
#endif
  }

  // Workspace bytes a GPU decode of this shape needs (0 when sequences are not split).
  size_t workspace_bytes(int64_t batch, int64_t q_heads, int64_t block_table_stride) {
#if NVFP4KV_HAVE_CUDA
    if (!place_.cuda) return 0;
    const auto key = std::make_tuple(batch, q_heads, block_table_stride);
    if (auto it = workspace_need_.find(key); it != workspace_need_.end()) return it->second;
    DeviceGuard on(place_);
    DecodePlan plan;
    raise_for(plan_decode(layout_, batch, q_heads, block_table_stride, &plan));
    workspace_need_[key] = plan.workspace_bytes;
    return plan.workspace_bytes;
#else
    (void)batch, (void)q_heads, (void)block_table_stride;
    return 0;
#endif
  }

  // ---- state ------------------------------------------------------------------
  nb::dict status() const {
    DeviceStatus s{};
    copy_out(&s, status_, sizeof s);
    nb::dict d;
    d["stored"] = s.stored;
    d["padding"] = s.padding;
    d["out_of_range"] = s.out_of_range;
    d["non_finite"] = s.non_finite;
    d["bad_pages"] = s.bad_pages;
    d["bad_global_scale"] = s.bad_global_scale;
    d["bad_lengths"] = s.bad_lengths;
    return d;
  }

  void reset_status(uintptr_t stream) {
    if (!place_.cuda) {
      *status_ = DeviceStatus{};
      return;
    }
#if NVFP4KV_HAVE_CUDA
    DeviceGuard on(place_);
    cuda_ok(cudaMemsetAsync(status_, 0, sizeof(DeviceStatus), reinterpret_cast<cudaStream_t>(stream)),
            "reset_status");
#endif
  }

  void set_global_scales(const std::vector<float>& k, const std::vector<float>& v) {
    const int64_t layers = layout_.layout().dims.layers;
    if (int64_t(k.size()) != layers || int64_t(v.size()) != layers)
      throw ArgumentError("set_global_scales: one K and one V scale per layer (" + std::to_string(layers) + "), got " +
                          std::to_string(k.size()) + " and " + std::to_string(v.size()));
    std::vector<float> table(size_t(2 * layers));
    for (int64_t l = 0; l < layers; ++l) {
      if (!global_scale_usable(k[size_t(l)]) || !global_scale_usable(v[size_t(l)]))
        throw ArgumentError("set_global_scales: layer " + std::to_string(l) +
                            ": global scales must be in [2^-100, 2^100], got K " + std::to_string(k[size_t(l)]) +
                            ", V " + std::to_string(v[size_t(l)]));
      table[size_t(2 * l)] = k[size_t(l)];
      table[size_t(2 * l + 1)] = v[size_t(l)];
    }
    copy_in(scales_, table.data(), table.size() * sizeof(float));
  }

  // One allocation as a flat uint8 array (DLPack; NumPy for a host cache).
  nb::object buffer(nb::handle self, int64_t index, int64_t layer) const {
    const Layout& l = layout_.layout();
    if (index < 0 || index >= int64_t(l.buffers.size()))
      throw ArgumentError("buffer: index " + std::to_string(index) + " outside [0, " + std::to_string(l.buffers.size()) + ")");
    require_layer(layer);
    const Buffer& b = l.buffers[size_t(index)];
    uint8_t* p = ptr_[size_t(index)][b.per_layer ? size_t(layer) : 0];
    return flat(self, p, {size_t(b.bytes)}, nb::dtype<uint8_t>());
  }

  nb::object global_scales(nb::handle self) const {
    return flat(self, reinterpret_cast<uint8_t*>(scales_), {size_t(layout_.layout().dims.layers), 2}, nb::dtype<float>());
  }

 private:
  // Rows the operation reads or writes: the kernels take bf16 and fp16, the reference fp32 too.
  std::vector<DType> row_types() const {
    if (place_.cuda) return {DType::kBFloat16, DType::kFloat16};
    return {DType::kBFloat16, DType::kFloat16, DType::kFloat32};
  }

  void require_layer(int64_t layer) const {
    const int64_t layers = layout_.layout().dims.layers;
    if (layer < 0 || layer >= layers)
      fail("layer", "must be in [0, " + std::to_string(layers) + "), got " + std::to_string(layer));
  }

  int64_t require_block_table(const ArrayFacts& t) const {
    require_place(t, "block_table", place_);
    require_dtype(t, "block_table", {DType::kInt32});
    require_ndim(t, "block_table", {-1, -1});
    if (t.shape[0] > 0 && t.shape[1] == 0) fail("block_table", "needs at least one entry per sequence");
    // The row length is the capacity the kernels trust: rows must be packed.
    require_contiguous(t, "block_table");
    return t.shape[0];
  }

  const float* scale_arg(const std::optional<Array>& array, const char* name, int64_t layer, int side) const {
    if (!array) return scales_ + 2 * layer + side;
    const ArrayFacts s(*array);
    require_place(s, name, place_);
    require_dtype(s, name, {DType::kFloat32});
    if (array->size() != 1) fail(name, "expected one float32 (shape () or (1,)), got a " + describe(s));
    return static_cast<const float*>(s.data);
  }

  // The layer's buffers as the C++ API takes them, on the cache's device.
  template <class Op>
  void run(Op&& op, int64_t layer, uintptr_t stream) {
    CacheBuffers b;
    const Layout& l = layout_.layout();
    for (size_t i = 0; i < l.buffers.size(); ++i) b.ptr[i] = ptr_[i][l.buffers[i].per_layer ? size_t(layer) : 0];
    b.count = int(l.buffers.size());
    DeviceGuard on(place_);
    if (place_.cuda) {
      op(b, stream);
    } else {
      nb::gil_scoped_release unlocked;  // the reference is scalar code: let other threads run
      op(b, stream);
    }
  }

  // The reference's fp64 results in the query's type (and lse in fp32).
  static void write_on_host(const std::vector<double>& values, const std::vector<double>& lse_values, ElementType type,
                            void* out, float* lse) {
    for (size_t i = 0; i < values.size(); ++i) {
      const float x = float(values[i]);
      switch (type) {
        case ElementType::kFloat32: static_cast<float*>(out)[i] = x; break;
        case ElementType::kBFloat16: static_cast<uint16_t*>(out)[i] = float_to_bf16(x); break;
        default: static_cast<uint16_t*>(out)[i] = float_to_fp16(x); break;
      }
    }
    if (lse)
      for (size_t i = 0; i < lse_values.size(); ++i) lse[i] = float(lse_values[i]);
  }
  void decode_on_host(const CacheBuffers& b, const DecodeArgs& a) {
    const reference::DecodeResult r = reference::decode_attention(layout_, b, a);
    write_on_host(r.out, r.lse, a.q_type, a.out, a.lse);
  }

#if NVFP4KV_HAVE_CUDA
  // The caller's workspace (checked) or the cache's own, for a call that needs `need` bytes.
  std::pair<void*, size_t> workspace_for(const std::optional<OutArray>& workspace_array, size_t need, cudaStream_t s,
                                         const char* sizer) {
    if (workspace_array) {
      const ArrayFacts w(*workspace_array);
      require_place(w, "workspace", place_);
      require_contiguous(w, "workspace");
      require_aligned(w.data, "workspace", 256);
      if (w.nbytes < need)
        fail("workspace", "this call needs " + std::to_string(need) + " bytes (Cache." + sizer + "), got " +
                              std::to_string(w.nbytes));
      return {workspace_array->data(), w.nbytes};
    }
    if (need == 0) return {nullptr, 0};
    return {own_workspace(need, s), need};
  }

  // The cache's own decode workspace, grown outside graph capture only. A grown
  // one never frees the old: a captured graph may still point at it.
  void* own_workspace(size_t bytes, cudaStream_t stream) {
    if (!workspaces_.empty() && workspace_size_ >= bytes) return workspaces_.back()->get();
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    cuda_ok(cudaStreamIsCapturing(stream, &capturing), "cudaStreamIsCapturing");
    if (capturing != cudaStreamCaptureStatusNone)
      throw ArgumentError("workspace: this call needs " + std::to_string(bytes) +
                          " bytes of workspace and the stream is being captured, where nothing may be allocated: "
                          "run the same call once before capture (warm-up), or pass workspace=");
    workspaces_.push_back(std::make_unique<Allocation>(place_, bytes));
    workspace_size_ = bytes;
    return workspaces_.back()->get();
  }
#endif

  void allocate() {
    const Layout& l = layout_.layout();
    for (const Buffer& b : l.buffers) {
      ptr_.emplace_back();
      for (int64_t i = 0; i < (b.per_layer ? l.dims.layers : 1); ++i) {
        owned_.push_back(std::make_unique<Allocation>(place_, size_t(b.bytes)));
        ptr_.back().push_back(owned_.back()->get());
      }
    }
  }

  // buffers[i]: one array for a buffer shared by all layers; for a per-layer
  // buffer a list of one array per layer, or one array holding all layers back to back.
  void adopt(const nb::list& buffers) {
    const Layout& l = layout_.layout();
    if (nb::len(buffers) != l.buffers.size())
      fail("buffers", "layout \"" + l.name + "\" has " + std::to_string(l.buffers.size()) + " buffers, got " +
                          std::to_string(nb::len(buffers)));
    for (size_t i = 0; i < l.buffers.size(); ++i) {
      const Buffer& b = l.buffers[i];
      const std::string name = "buffers[" + std::to_string(i) + "] (\"" + b.name + "\")";
      ptr_.emplace_back();
      const nb::handle entry = buffers[i];
      if (nb::isinstance<nb::list>(entry) || nb::isinstance<nb::tuple>(entry)) {
        if (!b.per_layer) fail(name, "holds all layers: give one array, not a list");
        if (int64_t(nb::len(entry)) != l.dims.layers)
          fail(name, "one array per layer: expected " + std::to_string(l.dims.layers) + ", got " + std::to_string(nb::len(entry)));
        for (size_t layer = 0; layer < nb::len(entry); ++layer)
          ptr_.back().push_back(adopt_one(entry[layer], name + "[" + std::to_string(layer) + "]", b.bytes));
      } else {
        const int64_t layers = b.per_layer ? l.dims.layers : 1;
        if (b.per_layer && layers > 1 && b.bytes % 16 != 0)
          fail(name, "per-layer buffers of " + std::to_string(b.bytes) +
                         " bytes cannot sit back to back 16-byte aligned: give a list of one array per layer");
        uint8_t* base = adopt_one(entry, name, b.bytes * layers);
        for (int64_t layer = 0; layer < layers; ++layer) ptr_.back().push_back(base + layer * b.bytes);
      }
    }
  }

  uint8_t* adopt_one(nb::handle h, const std::string& name, int64_t bytes) {
    Array array;
    if (!nb::try_cast(h, array))
      fail(name, "expected an array (DLPack or buffer protocol), got " + std::string(nb::type_name(h.type()).c_str()));
    const ArrayFacts a(array);
    require_place(a, name, place_);
    require_contiguous(a, name);
    if (int64_t(a.nbytes) < bytes)
      fail(name, "holds " + std::to_string(a.nbytes) + " bytes, the layout needs " + std::to_string(bytes));
    if (place_.cuda) require_aligned(a.data, name, 16);
    adopted_.push_back(array);
    return bytes_of(array);
  }

  nb::object flat(nb::handle self, uint8_t* p, std::initializer_list<size_t> shape, nb::dlpack::dtype dt) const {
    if (!place_.cuda) return nb::cast(nb::ndarray<nb::numpy>(p, shape, self, {}, dt));
    return nb::cast(nb::ndarray<>(p, shape, self, {}, dt, nb::device::cuda::value, place_.device));
  }

  void copy_in(void* to, const void* from, size_t bytes) {
    if (!place_.cuda) {
      std::memcpy(to, from, bytes);
      return;
    }
#if NVFP4KV_HAVE_CUDA
    DeviceGuard on(place_);
    cuda_ok(cudaMemcpy(to, from, bytes, cudaMemcpyHostToDevice), "copy to the device");
#endif
  }
  void copy_out(void* to, const void* from, size_t bytes) const {
    if (!place_.cuda) {
      std::memcpy(to, from, bytes);
      return;
    }
#if NVFP4KV_HAVE_CUDA
    DeviceGuard on(place_);
    cuda_ok(cudaMemcpy(to, from, bytes, cudaMemcpyDeviceToHost), "copy from the device");
#endif
  }

  ValidLayout layout_;
  Place place_;
  std::vector<std::unique_ptr<Allocation>> owned_;
  std::vector<Array> adopted_;             // caller arrays kept alive as long as the cache
  std::vector<std::vector<uint8_t*>> ptr_;  // per buffer: one pointer, or one per layer
  float* scales_ = nullptr;                // (layers, 2): K and V dequant multipliers
  DeviceStatus* status_ = nullptr;
  const float* k_mean_ = nullptr;           // a device copy of the format's k_mean (CUDA caches whose format smooths K)
  const float* k_channel_scale_ = nullptr;  // the same for its k_channel_scale
  std::vector<std::unique_ptr<Allocation>> workspaces_;  // decode's, newest last
  size_t workspace_size_ = 0;
  std::map<std::tuple<int64_t, int64_t, int64_t>, size_t> workspace_need_;  // (batch, q_heads, stride) -> bytes
};

}  // namespace

void bind_cache(nb::module_& m) {
  nb::class_<Cache>(m, "Cache")
      .def(nb::init<const ValidLayout&, bool, int, std::optional<nb::list>, std::optional<Array>>(), "layout"_a,
           "cuda"_a, "device"_a, "buffers"_a = nb::none(), "global_scales"_a = nb::none())
      .def_prop_ro("layout", &Cache::layout)
      .def_prop_ro("device", &Cache::device)
      .def("store", &Cache::store, "k"_a, "v"_a, "slots"_a, "layer"_a, "rule"_a, "stream"_a, "k_scale"_a = nb::none(),
           "v_scale"_a = nb::none())
      .def("gather", &Cache::gather, "block_table"_a, "cu_seqlens"_a, "layer"_a, "k_out"_a, "v_out"_a, "stream"_a)
      .def("decode", &Cache::decode, "q"_a, "block_table"_a, "seq_lens"_a, "cu_seqlens"_a, "layer"_a, "out"_a,
           "softmax_scale"_a, "window"_a, "softcap"_a, "sinks"_a, "lse"_a, "workspace"_a, "stream"_a)
      .def("decode_workspace_bytes", &Cache::workspace_bytes, "batch"_a, "q_heads"_a, "block_table_stride"_a)
      .def("attention", &Cache::attention, "q"_a, "cu_seqlens_q"_a, "q_lens"_a, "block_table"_a, "seq_lens"_a,
           "cu_seqlens"_a, "layer"_a, "out"_a, "softmax_scale"_a, "window"_a, "softcap"_a, "sinks"_a, "lse"_a,
           "workspace"_a, "stream"_a)
      .def("attention_workspace_bytes", &Cache::attention_workspace_bytes, "q_lens"_a, "q_heads"_a,
           "block_table_stride"_a)
      .def("status", &Cache::status)
      .def("reset_status", &Cache::reset_status, "stream"_a)
      .def("set_global_scales", &Cache::set_global_scales, "k"_a, "v"_a)
      .def("buffer", [](nb::handle self, int64_t index, int64_t layer) { return nb::cast<Cache&>(self).buffer(self, index, layer); },
           "index"_a, "layer"_a)
      .def("global_scales", [](nb::handle self) { return nb::cast<Cache&>(self).global_scales(self); });
}

}  // namespace nvfp4kv::python
