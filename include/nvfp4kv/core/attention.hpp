#pragma once
// What every attention family (decode, prefill) shares on the host and the
// device: the head dims that have their own kernel instance, and the split
// workspace through which a computation split over thread blocks is merged.
// Plain C++ (the planners and their CPU tests use it too).
#include <cstddef>
#include <cstdint>

#include "nvfp4kv/core/config.hpp"

namespace nvfp4kv {

// The head-dim traits table: the kernels are instantiated for these D; a head dim
// between two of them runs the next larger instance, zero-padded (its columns
// past D are never read from the cache).
inline constexpr int kAttentionHeadDims[] = {64, 128, 256};
inline constexpr int kMaxAttentionHeadDim = 256;

// The instance that serves `head_dim`, or 0 when none does (above 256).
NVFP4KV_HD constexpr int attention_instance_dim(int64_t head_dim) {
  return head_dim <= 0 ? 0 : head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : head_dim <= 256 ? 256 : 0;
}

// The split workspace: for each of `rows` output rows (a query head of a query
// token) and each of `splits` thread blocks, the split's partial O / l (head_dim
// floats) and its log-sum-exp in base 2 (max + log2 l); then `tickets` 64-bit
// counters (one per merge group) at *tickets_at, 16-byte aligned. A ticket finds
// the split that finishes last, which merges; it resets itself, so the workspace
// never needs clearing (kernels/attention/split.cuh).
// A ticket at rest: "tagged, none finished" (kernels/attention/split.cuh counts finished
// splits as kSplitTicketTag << 16 | count and leaves it here).
inline constexpr unsigned long long kSplitTicketTag = 0x6E7666703462ull;  // "nvfp4b"
inline constexpr unsigned long long kSplitTicketAtRest = kSplitTicketTag << 16;

NVFP4KV_HD constexpr size_t attention_split_workspace_bytes(int64_t rows, int64_t splits, int64_t tickets,
                                                            int head_dim, size_t* tickets_at = nullptr) {
  const size_t partials = size_t(rows) * size_t(splits);
  const size_t at = (partials * (size_t(head_dim) + 1) * sizeof(float) + 15) / 16 * 16;
  if (tickets_at) *tickets_at = at;
  return at + size_t(tickets) * sizeof(unsigned long long);
}

}  // namespace nvfp4kv
