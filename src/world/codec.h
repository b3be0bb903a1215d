// Codecs for tensors sent across sites (DiLoCo pseudo-gradients, streaming fragments, async
// updates): none (float32), bf16, int8 and int4 with a blockwise scale, and error feedback.
//
// Encoded form (little-endian), self-describing so a receiver can validate it:
//   header (16 bytes): magic "ATC1" (u32), codec (u8), 3 zero bytes, count (u64: floats encoded)
//   payload:
//     none: count float32
//     bf16: count bfloat16 (round to nearest even from float32; NaN stays NaN)
//     int8: per block of kCodecBlock values: float32 scale = absmax / 127, then the block's int8
//           values q = round_half_even(x / scale) in [-127, 127] (scale 0: all q = 0)
//     int4: per block: float32 scale = absmax / 7, then ceil(block / 2) bytes of two's-complement
//           nibbles q in [-7, 7], the even element in the low nibble (a last odd nibble is 0)
//   The last block may be short. Decoding gives q * scale (float32), never fused with anything
//   (no FMA contraction), so every site gets the same bits whatever its CPU.
// Non-finite values are refused by Decode for every codec, so a bad update is caught at the
// receiver (the exchange, the parameter server) rather than spread: none and bf16 encode them as
// they are and Decode refuses any infinity or NaN among the values; for int8/int4 a block holding
// one is encoded with a NaN scale (q = 0), which Decode refuses. A block whose absmax / qmax
// underflows to 0 is sent as scale 0 (decodes to zeros; with error feedback the values stay in the
// residual). Encoding is a pure function of its input (no threads, no randomness), so every site
// decodes the same bits from the same message.
//
// Error feedback: with a residual (same length as x, kept by the sender between calls), Encode
// encodes y = x + residual and sets residual = y - Decode(encoded): what the codec lost this time
// is sent next time, so nothing is lost for good (with `none` the residual stays 0). A refused
// (non-finite) int8/int4 block delivers nothing, so its residual becomes y, non-finite entries
// included: every later message from that sender is refused too until the residual is reset.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace atl {

enum class Codec : uint8_t { kNone = 0, kBf16 = 1, kInt8 = 2, kInt4 = 3 };

inline constexpr size_t kCodecBlock = 128;
inline constexpr size_t kCodecHeaderBytes = 16;

// "none", "bf16", "int8", "int4"; anything else is kInvalidArgument naming the choices.
StatusOr<Codec> ParseCodec(std::string_view name);
const char* CodecName(Codec codec);

// Bytes of the encoded form of `count` floats, header included.
size_t EncodedBytes(Codec codec, size_t count);

// Encodes x into *out (resized to EncodedBytes). residual: empty (no error feedback) or of
// x.size() floats, updated as above.
void Encode(Codec codec, std::span<const float> x, std::vector<uint8_t>* out,
            std::span<float> residual = {});

// Decodes `in` into out (out.size() must equal the header's count). A bad magic, an unknown
// codec, nonzero reserved header bytes, a count other than out.size(), a size other than
// EncodedBytes, a non-finite value (none, bf16) or scale, a negative scale, a scale so large that
// qmax * scale overflows (Encode takes the next smaller one there), a q outside the range
// (int8 -128, int4 -8) or a nonzero int4 padding nibble is kCorruption naming what was wrong; the
// whole message is validated before anything is written, so `out` is then left untouched.
Status Decode(std::span<const uint8_t> in, std::span<float> out);

// As Decode, but out[i] += weight * decoded[i] (no temporary; the same validation).
Status DecodeAdd(std::span<const uint8_t> in, float weight, std::span<float> out);

}  // namespace atl
