// UTF-8 decoding and encoding with the exact error handling of the reference encoder's runtime.
//
// The reference (gpt-3-encoder under node) receives text that node decoded with the WHATWG
// Encoding Standard's UTF-8 decoder (Buffer.toString('utf8'), TextDecoder): every maximal
// invalid subpart of the byte stream becomes one U+FFFD, a byte-order mark is kept as U+FEFF,
// and surrogates encoded in UTF-8 are invalid. To give the same ids on invalid input we decode
// the same way.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace atl {

inline constexpr char32_t kReplacementCharacter = 0xFFFD;

// Appends the code points of `bytes` to *out, decoding as the WHATWG UTF-8 decoder does.
void DecodeUtf8(std::string_view bytes, std::vector<char32_t>* out);

// The offset of the first byte that is not part of well-formed UTF-8 (an invalid lead or
// continuation byte, an overlong form, a surrogate, a code point above U+10FFFF, a truncated
// sequence), or std::string_view::npos when `bytes` is all well-formed.
size_t FirstInvalidUtf8(std::string_view bytes);

// Appends the UTF-8 encoding of one code point (REQUIRES: cp <= 0x10FFFF, not a surrogate).
void AppendUtf8(char32_t cp, std::string* out);

}  // namespace atl
