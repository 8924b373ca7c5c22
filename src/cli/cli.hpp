#pragma once
// Small argument handling shared by the subcommands: they validate and forward.
#include <iosfwd>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/harness/roundtrip.hpp"

namespace nvfp4kv::cli {

// Bad usage: reported on stderr with exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Args {
 public:
  // flags: names (without --) that take no value; every other --name takes one.
  Args(const std::vector<std::string>& argv, std::initializer_list<const char*> flags,
       std::initializer_list<const char*> options);
  const std::vector<std::string>& positional() const { return positional_; }
  bool flag(const std::string& name) const { return flags_.count(name) > 0; }
  std::optional<std::string> get(const std::string& name) const;
  std::optional<int64_t> integer(const std::string& name) const;
  std::optional<int64_t> bytes(const std::string& name) const;  // 512MiB, 80GiB, 1e9

 private:
  std::vector<std::string> positional_;
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> flags_;
};

DimsOverride dims_from(const Args& args);

// A check's exit code: 0 sound, 1 unsound, 2 undecided (sizes past the proof's bounds).
inline int verdict_code(const CheckReport& r) { return r.ok ? 0 : r.undecided ? 2 : 1; }

int run_demo(const std::vector<std::string>& argv);
int run_layout(const std::vector<std::string>& argv);
int run_roundtrip(const std::vector<std::string>& argv);
int run_bench(const std::vector<std::string>& argv);

// The round trip's table; returns whether it passed.
bool print_roundtrip(const harness::RoundtripReport& report, std::ostream& out);

}  // namespace nvfp4kv::cli
