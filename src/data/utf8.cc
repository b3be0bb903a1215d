#include "data/utf8.h"

#include <cstdint>

namespace atl {

// The decoder of https://encoding.spec.whatwg.org/#utf-8-decoder, one byte at a time. The
// bounds `lower`/`upper` on the next continuation byte reject overlong forms (E0 80..9F,
// F0 80..8F), surrogates (ED A0..BF) and code points above U+10FFFF (F4 90..BF) at the first
// byte that makes the sequence invalid, which is what "maximal subpart" means.
void DecodeUtf8(std::string_view bytes, std::vector<char32_t>* out) {
  out->reserve(out->size() + bytes.size());
  char32_t cp = 0;
  int needed = 0;
  int seen = 0;
  uint8_t lower = 0x80;
  uint8_t upper = 0xBF;
  size_t i = 0;
  while (i < bytes.size()) {
    const uint8_t b = static_cast<uint8_t>(bytes[i]);
    if (needed == 0) {
      ++i;
      if (b <= 0x7F) {
        out->push_back(b);
      } else if (b >= 0xC2 && b <= 0xDF) {
        needed = 1;
        cp = b & 0x1F;
      } else if (b >= 0xE0 && b <= 0xEF) {
        if (b == 0xE0) lower = 0xA0;
        if (b == 0xED) upper = 0x9F;
        needed = 2;
        cp = b & 0x0F;
      } else if (b >= 0xF0 && b <= 0xF4) {
        if (b == 0xF0) lower = 0x90;
        if (b == 0xF4) upper = 0x8F;
        needed = 3;
        cp = b & 0x07;
      } else {
        out->push_back(kReplacementCharacter);
      }
      continue;
    }
    if (b < lower || b > upper) {
      // The sequence so far is one maximal invalid subpart; `b` starts afresh (not consumed).
      cp = 0;
      needed = seen = 0;
      lower = 0x80;
      upper = 0xBF;
      out->push_back(kReplacementCharacter);
      continue;
    }
    ++i;
    lower = 0x80;
    upper = 0xBF;
    cp = (cp << 6) | (b & 0x3F);
    if (++seen == needed) {
      out->push_back(cp);
      cp = 0;
      needed = seen = 0;
    }
  }
  if (needed != 0) out->push_back(kReplacementCharacter);
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t FirstInvalidUtf8(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = p[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    // The sequence's length and the range of its second byte (Unicode Table 3-7).
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;  // overlong
      if (b == 0xED) hi = 0x9F;  // surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;  // overlong
      if (b == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;
    }
    if (i + len > n) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    i += len;
  }
  return std::string_view::npos;
}

}  // namespace atl
