#include "data/pretokenize.h"

#include <algorithm>
#include <array>

namespace atl {

namespace {

struct CodePointRange {
  char32_t lo;
  char32_t hi;  // inclusive
};

#include "data/unicode_tables.inc"

bool InRanges(std::span<const CodePointRange> ranges, char32_t cp) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), cp,
                             [](char32_t c, const CodePointRange& r) { return c < r.lo; });
  return it != ranges.begin() && cp <= std::prev(it)->hi;
}

CharClass ClassifySlow(char32_t cp) {
  if (InRanges(kWhiteSpaceRanges, cp)) return CharClass::kWhiteSpace;
  if (InRanges(kLetterRanges, cp)) return CharClass::kLetter;
  if (InRanges(kNumberRanges, cp)) return CharClass::kNumber;
  return CharClass::kOther;
}

// Latin-1 is most of any English corpus: look it up in a table built once from the ranges.
const std::array<CharClass, 256>& Latin1Classes() {
  static const std::array<CharClass, 256> table = [] {
    std::array<CharClass, 256> t{};
    for (char32_t c = 0; c < 256; ++c) t[c] = ClassifySlow(c);
    return t;
  }();
  return table;
}

}  // namespace

CharClass ClassifyCodePoint(char32_t cp) {
  if (cp < 256) return Latin1Classes()[cp];
  return ClassifySlow(cp);
}

// Each alternative of the regex, tried in order at position p as a backtracking engine would;
// the first that matches wins (leftmost alternative, not longest match). The optional leading
// space of ` ?X+` is U+0020 only; when taking it fails, the engine retries without it, which can
// only succeed if text[p] itself is in X, and a space is not a letter, number or "other".
void PreTokenize(std::span<const char32_t> text, std::vector<size_t>* ends) {
  const size_t n = text.size();
  std::vector<CharClass> cls(n);
  for (size_t i = 0; i < n; ++i) cls[i] = ClassifyCodePoint(text[i]);
  auto run_end = [&](size_t from, CharClass c) {
    while (from < n && cls[from] == c) ++from;
    return from;
  };

  size_t p = 0;
  while (p < n) {
    const char32_t c = text[p];
    size_t end = 0;
    // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive, ASCII apostrophe only).
    if (c == U'\'' && p + 1 < n) {
      const char32_t a = text[p + 1];
      if (a == U's' || a == U't' || a == U'm' || a == U'd') {
        end = p + 2;
      } else if (p + 2 < n &&
                 ((a == U'r' && text[p + 2] == U'e') || (a == U'v' && text[p + 2] == U'e') ||
                  (a == U'l' && text[p + 2] == U'l'))) {
        end = p + 3;
      }
    }
    if (end == 0) {
      // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`.
      for (CharClass want : {CharClass::kLetter, CharClass::kNumber, CharClass::kOther}) {
        if (c == U' ' && p + 1 < n && cls[p + 1] == want) {
          end = run_end(p + 1, want);
        } else if (cls[p] == want) {
          end = run_end(p, want);
        }
        if (end != 0) break;
      }
    }
    if (end == 0) {
      // text[p] is white space. `\s+(?!\S)`: the greedy run, given back one code point at a
      // time until the next code point is not a non-space: the whole run at the end of the
      // text, else all but its last code point (which then starts the next match). If that
      // leaves nothing, `\s+` takes the single code point.
      const size_t e = run_end(p, CharClass::kWhiteSpace);
      if (e == n) {
        end = n;
      } else if (e - p >= 2) {
        end = e - 1;
      } else {
        end = e;
      }
    }
    ends->push_back(end);
    p = end;
  }
}

}  // namespace atl
