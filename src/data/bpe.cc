#include "data/bpe.h"

#include <climits>

namespace atl {

std::vector<BpeSymbol> BytePairMerge(std::string_view token, const StringIntMap& ranks) {
  std::vector<BpeSymbol> word(token.size());
  for (size_t i = 0; i < token.size(); ++i) word[i] = {uint32_t(i), 1};
  auto text = [&](const BpeSymbol& s) { return token.substr(s.begin, s.size); };

  std::string key;
  std::vector<BpeSymbol> merged;
  while (word.size() > 1) {
    int best_rank = INT_MAX;
    size_t best = word.size();
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      key.assign(text(word[i]));
      key.push_back(',');
      key.append(text(word[i + 1]));
      auto it = ranks.find(key);
      if (it == ranks.end()) continue;
      if (it->second <= best_rank) {  // <=: on a tie the later pair wins, as in the reference
        best_rank = it->second;
        best = i;
      }
    }
    if (best == word.size()) break;  // no pair has a rank: the reference's `bigram in bpe_ranks`

    const std::string_view first = text(word[best]);
    const std::string_view second = text(word[best + 1]);
    merged.clear();
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && text(word[i]) == first && text(word[i + 1]) == second) {
        // Adjacent symbols are adjacent byte ranges, so the merge is their union.
        merged.push_back({word[i].begin, word[i].size + word[i + 1].size});
        i += 2;
      } else {
        merged.push_back(word[i]);
        i += 1;
      }
    }
    word.swap(merged);
  }
  return word;
}

}  // namespace atl
