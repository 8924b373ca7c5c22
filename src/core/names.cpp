#include "nvfp4kv/core/names.hpp"

#include <algorithm>

namespace nvfp4kv {
namespace {

// Optimal string alignment distance: insertions, deletions, substitutions and
// transpositions of neighbours each cost one ("lenght" is one edit from "length").
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

}  // namespace

std::string closest_name(std::string_view word, const std::vector<std::string>& candidates) {
  if (word.empty() || word.size() > 256) return "";
  const size_t allowed = word.size() <= 4 ? 1 : word.size() <= 8 ? 2 : 3;
  std::string best;
  size_t best_distance = allowed + 1;
  for (const std::string& c : candidates) {
    if (c == word) return c;
    const size_t dist = edit_distance(word, c);
    if (dist < best_distance) best = c, best_distance = dist;
  }
  if (!best.empty()) return best;
  for (const std::string& c : candidates)  // a name cut short: "vllm-packed-nhd-wr"
    if (word.size() >= 3 && c.size() > word.size() && c.compare(0, word.size(), word) == 0) return c;
  return "";
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  const std::string c = closest_name(word, candidates);
  return c.empty() ? "" : " (did you mean \"" + c + "\"?)";
}

}  // namespace nvfp4kv
