// The byte-pair merge loop of the reference encoder (gpt-3-encoder 1.1.4, function bpe), over raw
// bytes instead of its byte-to-unicode characters (the mapping is a bijection that sends ',' to
// ',', so keys and comparisons carry over unchanged).
//
// Quirks kept on purpose, because the reference has them:
//  - A merge's rank is looked up by the JavaScript string `first + "," + second` (what an array
//    key becomes), and the rank table was built with later duplicate keys overwriting earlier
//    ones. Two different pairs can therefore share a key when their symbols contain commas
//    ("a,b" + "c" and "a" + "b,c"), and a pair can be merged under another pair's rank.
//  - At each step every adjacent pair is considered in position order (no dedup); the smallest
//    rank wins and among equal ranks the LATER pair wins (the reference stores pairs in an object
//    keyed by rank, so a later pair overwrites an earlier one).
//  - The chosen (first, second) is then merged at every occurrence, left to right.
//
// Thread-safety: MergeRanks is immutable after construction; BytePairMerge is a pure function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace atl {

// Hash for heterogeneous lookup of std::string keys by std::string_view.
struct StringViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

using StringIntMap = std::unordered_map<std::string, int, StringViewHash, std::equal_to<>>;

// A symbol of a word being merged: the bytes [begin, begin + size) of the pre-token.
struct BpeSymbol {
  uint32_t begin;
  uint32_t size;
};

// Rank by key "first,second" (raw bytes joined by ','), later duplicates overwriting earlier.
// Returns the symbols that `token` merges into, as byte ranges of `token`.
std::vector<BpeSymbol> BytePairMerge(std::string_view token, const StringIntMap& ranks);

}  // namespace atl
