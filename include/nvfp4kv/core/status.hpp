#pragma once
// Counters an operation adds to: what a store, gather or attention call did and
// which data-dependent problems it met. The kernels add to one in device memory,
// the reference to one in host memory; tests compare the two field by field.
// Zero it before the call (the API never clears it, so one array can collect a
// whole step, or a whole graph replay).
namespace nvfp4kv {

struct DeviceStatus {
  unsigned long long stored = 0;            // store: tokens written
  unsigned long long padding = 0;           // store: slots < 0, skipped on purpose
  unsigned long long out_of_range = 0;      // store: slots >= capacity, skipped, nothing written
  unsigned long long non_finite = 0;        // store: NaN / Inf inputs, stored as +0
  unsigned long long bad_pages = 0;         // readers: tokens behind block-table entries outside [0, pages);
                                            // never read, their rows / outputs filled with NaN
  unsigned long long bad_global_scale = 0;  // K or V global scale not finite and in [2^-100, 2^100]:
                                            // store writes nothing, readers fill their outputs with NaN
  unsigned long long bad_lengths = 0;       // readers: sequences whose length is negative or beyond the
                                            // block table's capacity (stride * tokens per page)
};

}  // namespace nvfp4kv
