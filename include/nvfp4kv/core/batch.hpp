#pragma once
// The batch descriptor every paged reader takes (gather now, decode and prefill
// attention next): which pages hold each sequence, in order, and how long each
// sequence is. One descriptor, one host validator (batch_problem), one device
// reading of its entries (page_of, sequence_length), so a bad entry is treated
// the same way everywhere: counted, never read out of bounds, its outputs marked.
#include <string>

#include "nvfp4kv/core/layout_view.hpp"

namespace nvfp4kv {

struct BatchDescriptor {
  const int32_t* block_table = nullptr;  // (batch, block_table_stride): page ids, any order; entry k holds
                                         // tokens [k * N, (k + 1) * N) of its sequence
  int64_t block_table_stride = 0;        // entries per sequence: the longest sequence has at most this * N tokens
  const int32_t* cu_seqlens = nullptr;   // (batch + 1) offsets: sequence i is rows [cu[i], cu[i+1]) of a dense output
  const int32_t* seq_lens = nullptr;     // or (batch) lengths; a descriptor gives exactly one of the two
  int64_t batch = 0;

  // Raw length of sequence i (may be negative or too long: see sequence_length).
  NVFP4KV_HD int64_t raw_length(int64_t i) const {
    return seq_lens ? int64_t(seq_lens[i]) : int64_t(cu_seqlens[i + 1]) - int64_t(cu_seqlens[i]);
  }
  // First dense-output row of sequence i (cu_seqlens form only).
  NVFP4KV_HD int64_t first_row(int64_t i) const { return cu_seqlens[i]; }
  NVFP4KV_HD int64_t capacity(int64_t tokens_per_page) const { return block_table_stride * tokens_per_page; }
};

// The usable length of sequence i: its raw length clamped to [0, capacity];
// `bad` says whether clamping was needed (the caller counts it once).
struct SequenceLength {
  int64_t tokens;
  bool bad;
};
NVFP4KV_HD SequenceLength sequence_length(const BatchDescriptor& b, int64_t i, int64_t tokens_per_page) {
  const int64_t raw = b.raw_length(i), cap = b.capacity(tokens_per_page);
  return {raw < 0 ? 0 : raw > cap ? cap : raw, raw < 0 || raw > cap};
}

// Page id of entry k of sequence i, or -1 when the entry is outside [0, pages):
// such a page is never read.
NVFP4KV_HD int64_t page_of(const BatchDescriptor& b, int64_t i, int64_t k, int64_t pages) {
  const int64_t p = b.block_table[i * b.block_table_stride + k];
  return (p >= 0 && p < pages) ? p : -1;
}

enum class BatchForm { kOffsets, kLengthsOrOffsets };

// Why the descriptor cannot be used ("" when it can): null pointers for a
// non-empty batch, a batch outside [0, 65535], a stride outside [1, 2^31), or
// the wrong form (gather needs offsets to place its output rows). The entries
// themselves live in device memory and are checked by the kernels.
std::string batch_problem(const BatchDescriptor& b, BatchForm form);

}  // namespace nvfp4kv
