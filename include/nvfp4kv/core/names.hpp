#pragma once
// "Did you mean": the known name a mistyped one most likely stands for. The CLI
// uses it for commands and options, the layout loader for preset names.
#include <string>
#include <string_view>
#include <vector>

namespace nvfp4kv {

// The candidate closest to `word` (edit distance, a transposition counting one),
// when it is close enough to be a typo of it: at most one edit for words of up to
// four characters, two up to eight, three beyond; or a candidate that `word`
// begins (a cut-off name). "" when none is. Ties go to the earlier candidate.
std::string closest_name(std::string_view word, const std::vector<std::string>& candidates);

// " (did you mean \"NAME\"?)" for closest_name, or "" when there is none.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace nvfp4kv
