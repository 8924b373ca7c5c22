#pragma once
// Progress of long host work (a round trip at 65536 tokens, a conformance kit):
// the work calls it with what it is doing and the fraction done; front ends
// decide whether to show it (the CLI does after two seconds, on stderr).
#include <functional>
#include <string_view>

namespace nvfp4kv {

using Progress = std::function<void(std::string_view stage, double fraction)>;

inline void report_progress(const Progress& p, std::string_view stage, double fraction) {
  if (p) p(stage, fraction);
}

}  // namespace nvfp4kv
