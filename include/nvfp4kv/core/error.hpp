#pragma once
// What nvfp4kv throws. The rule (docs/architecture.md, "Errors"): host code that
// runs at setup or in tools (core, reference, harness) throws an Error whose
// message says what to change; the per-step launchers of the api never throw
// and return a [[nodiscard]] Result; device code never fails loudly and counts
// data-dependent problems in DeviceStatus.
#include <stdexcept>
#include <string>

namespace nvfp4kv {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad input to the layout machinery (unparsable text, open sizes, impossible
// parameters).
class LayoutError : public Error {
 public:
  using Error::Error;
};

// A bad argument to a host function (a null pointer, a shape that does not fit
// the layout, an unusable global scale).
class ArgumentError : public Error {
 public:
  using Error::Error;
};

}  // namespace nvfp4kv
