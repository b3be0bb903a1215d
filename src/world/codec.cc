#include "world/codec.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

// No fused multiply-add contraction in this file (core/fp_exact.h): Decode must give exactly
// q * scale and DecodeAdd exactly out + weight * decoded on every site, whatever FMA support its
// CPU has (replicas apply the same update bit for bit), and the error-feedback residual must be
// exactly y - decoded.
#include "core/fp_exact.h"

namespace atl {
namespace {

static_assert(std::endian::native == std::endian::little,
              "codec: the wire format is little-endian");

constexpr uint32_t kMagic = 0x31435441;  // "ATC1" read as a little-endian u32
constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kExpMask = 0x7f800000u;  // abs bits >= this: infinity or NaN

bool KnownCodec(uint8_t c) { return c <= uint8_t(Codec::kInt4); }

size_t NumBlocks(size_t count) { return (count + kCodecBlock - 1) / kCodecBlock; }

// Payload bytes of one block of n values (scale included for the blockwise codecs).
size_t BlockBytes(Codec codec, size_t n) { return codec == Codec::kInt8 ? 4 + n : 4 + (n + 1) / 2; }

float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// float32 -> bfloat16 bits, round to nearest even. NaN stays NaN (quiet bit set, so a NaN whose
// payload lives only in the low 16 bits does not become infinity); infinities are exact.
uint16_t ToBf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & kAbsMask) > kExpMask) return uint16_t((u >> 16) | 0x0040);
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

float FromBf16(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

// Quantizes one block of n <= kCodecBlock values y to q in [-qmax, qmax] with scale = absmax /
// qmax, writing the scale to *scale and q to q[] (as floats, exact small integers). Returns the
// scale. A block with a non-finite value gets a NaN scale and q = 0 (the receiver refuses it).
float QuantizeBlock(const float* y, size_t n, float qmax, float* q) {
  // absmax on the bit patterns: for non-NaN floats, |x| orders as its bits do, and any NaN or
  // infinity has abs bits >= kExpMask. An integer max reduction vectorizes without -ffast-math.
  uint32_t maxbits = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, y + i, 4);
    maxbits = std::max(maxbits, b & kAbsMask);
  }
  if (maxbits >= kExpMask) {
    std::fill(q, q + n, 0.0f);
    return std::numeric_limits<float>::quiet_NaN();
  }
  float scale = std::bit_cast<float>(maxbits) / qmax;
  // Near FLT_MAX, qmax * scale can round up to infinity, which Decode refuses: the next smaller
  // scale decodes every q finite (q is clamped to qmax below).
  while (!std::isfinite(scale * qmax)) scale = std::nextafter(scale, 0.0f);
  if (scale == 0.0f) {  // all zeros, or an absmax so small that absmax / qmax underflows
    std::fill(q, q + n, 0.0f);
    return 0.0f;
  }
  for (size_t i = 0; i < n; ++i) {
    // Division, not a multiply by 1 / scale: the contract is round_half_even(x / scale).
    // nearbyint in the default rounding mode is round-half-even and compiles to vroundps.
    float v = std::nearbyint(y[i] / scale);
    q[i] = std::clamp(v, -qmax, qmax);
  }
  return scale;
}

// The block of x at b (n values) plus its error-feedback residual: y, or x itself without one.
const float* WithResidual(std::span<const float> x, std::span<const float> residual, size_t b,
                          size_t n, float* y) {
  if (residual.empty()) return x.data() + b;
  for (size_t i = 0; i < n; ++i) y[i] = x[b + i] + residual[b + i];
  return y;
}

void EncodeNone(std::span<const float> x, uint8_t* p, std::span<float> residual) {
  if (residual.empty()) {
    if (!x.empty()) std::memcpy(p, x.data(), x.size() * 4);  // an empty span's data may be null
    return;
  }
  float y[kCodecBlock];
  for (size_t b = 0; b < x.size(); b += kCodecBlock) {
    size_t n = std::min(kCodecBlock, x.size() - b);
    std::memcpy(p + 4 * b, WithResidual(x, residual, b, n, y), 4 * n);
    std::fill_n(residual.data() + b, n, 0.0f);
  }
}

void EncodeBf16(std::span<const float> x, uint8_t* p, std::span<float> residual) {
  uint16_t h[kCodecBlock];
  float y[kCodecBlock];
  for (size_t b = 0; b < x.size(); b += kCodecBlock) {
    size_t n = std::min(kCodecBlock, x.size() - b);
    const float* yp = WithResidual(x, residual, b, n, y);
    for (size_t i = 0; i < n; ++i) h[i] = ToBf16(yp[i]);
    std::memcpy(p + 2 * b, h, 2 * n);
    if (!residual.empty()) {
      for (size_t i = 0; i < n; ++i) {
        float dec = FromBf16(h[i]);
        residual[b + i] = yp[i] - dec;
      }
    }
  }
}

// int8 and int4 share everything but the packing of q.
void EncodeBlockwise(Codec codec, std::span<const float> x, uint8_t* p, std::span<float> residual) {
  const float qmax = codec == Codec::kInt8 ? 127.0f : 7.0f;
  float y[kCodecBlock];
  float q[kCodecBlock];
  int8_t qi[kCodecBlock + 1];
  for (size_t b = 0; b < x.size(); b += kCodecBlock) {
    size_t n = std::min(kCodecBlock, x.size() - b);
    const float* yp = WithResidual(x, residual, b, n, y);
    const float scale = QuantizeBlock(yp, n, qmax, q);
    std::memcpy(p, &scale, 4);
    p += 4;
    for (size_t i = 0; i < n; ++i) qi[i] = int8_t(q[i]);
    if (codec == Codec::kInt8) {
      std::memcpy(p, qi, n);
      p += n;
    } else {
      qi[n] = 0;  // a last odd nibble is 0
      const size_t bytes = (n + 1) / 2;
      for (size_t j = 0; j < bytes; ++j) {
        p[j] = uint8_t((uint8_t(qi[2 * j]) & 0x0f) | (uint8_t(qi[2 * j + 1]) << 4));
      }
      p += bytes;
    }
    if (!residual.empty()) {
      // A refused (non-finite) block delivers nothing: all of y stays in the residual.
      const float s = std::isfinite(scale) ? scale : 0.0f;
      for (size_t i = 0; i < n; ++i) {
        float dec = q[i] * s;  // exactly what Decode computes
        residual[b + i] = yp[i] - dec;
      }
    }
  }
}

// Validated view of an encoded message.
struct Message {
  Codec codec = Codec::kNone;
  const uint8_t* payload = nullptr;
};

StatusOr<Message> Validate(std::span<const uint8_t> in, size_t expected_count) {
  if (in.size() < kCodecHeaderBytes) {
    return Status::Corruption(fmt::format("codec: {} bytes, shorter than the {}-byte header",
                                          in.size(), kCodecHeaderBytes));
  }
  uint32_t magic;
  std::memcpy(&magic, in.data(), 4);
  if (magic != kMagic) {
    return Status::Corruption(
        fmt::format("codec: bad magic 0x{:08x}, 0x{:08x} (\"ATC1\") expected", magic, kMagic));
  }
  const uint8_t c = in[4];
  if (!KnownCodec(c)) {
    return Status::Corruption(
        fmt::format("codec: unknown codec {} in the header (none=0, bf16=1, int8=2, int4=3)", c));
  }
  if (in[5] != 0 || in[6] != 0 || in[7] != 0) {
    return Status::Corruption(
        fmt::format("codec: reserved header bytes {} {} {}, 0 0 0 expected", in[5], in[6], in[7]));
  }
  const Codec codec = Codec(c);
  uint64_t count;
  std::memcpy(&count, in.data() + 8, 8);
  if (count != expected_count) {
    return Status::Corruption(
        fmt::format("codec: count {} in the header, {} expected", count, expected_count));
  }
  const size_t want = EncodedBytes(codec, expected_count);
  if (in.size() != want) {
    return Status::Corruption(fmt::format("codec: {} bytes, {} expected for {} of {} floats",
                                          in.size(), want, CodecName(codec), expected_count));
  }
  const uint8_t* payload = in.data() + kCodecHeaderBytes;
  // float32 and bfloat16 values: an infinity or a NaN (all exponent bits set) is refused, as an
  // int8/int4 block's non-finite scale is: a peer's bad update stops at the receiver.
  if (codec == Codec::kNone) {
    for (size_t i = 0; i < count; ++i) {
      uint32_t u;
      std::memcpy(&u, payload + 4 * i, 4);
      if ((u & 0x7f800000u) == 0x7f800000u)
        return Status::Corruption(fmt::format("codec: a non-finite value at element {}", i));
    }
  } else if (codec == Codec::kBf16) {
    for (size_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, payload + 2 * i, 2);
      if ((h & 0x7f80u) == 0x7f80u)
        return Status::Corruption(fmt::format("codec: a non-finite value at element {}", i));
    }
  }
  if (codec == Codec::kInt8 || codec == Codec::kInt4) {
    const uint8_t* p = payload;
    for (size_t blk = 0; blk < NumBlocks(count); ++blk) {
      const size_t n = std::min(kCodecBlock, size_t(count) - blk * kCodecBlock);
      const float scale = LoadF32(p);
      if (!std::isfinite(scale)) {
        return Status::Corruption(fmt::format("codec: non-finite scale in block {}", blk));
      }
      if (scale < 0.0f) {
        return Status::Corruption(fmt::format("codec: negative scale {} in block {}", scale, blk));
      }
      const float qmax = codec == Codec::kInt8 ? 127.0f : 7.0f;
      if (!std::isfinite(scale * qmax)) {  // some q * scale would be infinite
        return Status::Corruption(fmt::format(
            "codec: scale {} in block {} overflows float32 at q = {}", scale, blk, qmax));
      }
      const uint8_t* v = p + 4;
      bool bad = false;
      if (codec == Codec::kInt8) {
        for (size_t i = 0; i < n; ++i) bad |= v[i] == 0x80;  // -128 is outside [-127, 127]
      } else {
        const size_t bytes = (n + 1) / 2;
        for (size_t j = 0; j < bytes; ++j) bad |= (v[j] & 0x0f) == 0x08 || (v[j] >> 4) == 0x08;
        if (n % 2 == 1 && (v[bytes - 1] >> 4) != 0) {
          return Status::Corruption(
              fmt::format("codec: nonzero padding nibble in the last block {}", blk));
        }
      }
      if (bad) {
        return Status::Corruption(fmt::format(
            "codec: a value of -{} in block {}, outside [-{}, {}]", codec == Codec::kInt8 ? 128 : 8,
            blk, codec == Codec::kInt8 ? 127 : 7, codec == Codec::kInt8 ? 127 : 7));
      }
      p += BlockBytes(codec, n);
    }
  }
  return Message{codec, payload};
}

// out[i] = dec[i] (kAdd false) or out[i] += weight * dec[i] (kAdd true), on a validated message.
template <bool kAdd>
void DecodeInto(const Message& m, float weight, std::span<float> out) {
  const size_t count = out.size();
  const uint8_t* p = m.payload;
  auto put = [&](float* o, float dec) {
    if constexpr (kAdd) {
      float w = weight * dec;
      *o += w;
    } else {
      *o = dec;
    }
  };
  switch (m.codec) {
    case Codec::kNone: {
      if constexpr (!kAdd) {
        if (count > 0) std::memcpy(out.data(), p, count * 4);
      } else {
        for (size_t i = 0; i < count; ++i) put(&out[i], LoadF32(p + 4 * i));
      }
      return;
    }
    case Codec::kBf16: {
      for (size_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        put(&out[i], FromBf16(h));
      }
      return;
    }
    case Codec::kInt8:
    case Codec::kInt4: {
      for (size_t b = 0; b < count; b += kCodecBlock) {
        const size_t n = std::min(kCodecBlock, count - b);
        const float scale = LoadF32(p);
        const uint8_t* v = p + 4;
        float* o = out.data() + b;
        if (m.codec == Codec::kInt8) {
          for (size_t i = 0; i < n; ++i) put(&o[i], float(int8_t(v[i])) * scale);
        } else {
          for (size_t j = 0; j < n / 2; ++j) {
            const int8_t lo = int8_t(uint8_t(v[j] << 4)) >> 4;
            const int8_t hi = int8_t(v[j]) >> 4;
            put(&o[2 * j], float(lo) * scale);
            put(&o[2 * j + 1], float(hi) * scale);
          }
          if (n % 2 == 1) put(&o[n - 1], float(int8_t(uint8_t(v[n / 2] << 4)) >> 4) * scale);
        }
        p += BlockBytes(m.codec, n);
      }
      return;
    }
  }
}

}  // namespace

StatusOr<Codec> ParseCodec(std::string_view name) {
  if (name == "none") return Codec::kNone;
  if (name == "bf16") return Codec::kBf16;
  if (name == "int8") return Codec::kInt8;
  if (name == "int4") return Codec::kInt4;
  return Status::InvalidArgument(
      fmt::format("codec: unknown codec \"{}\" (choices: none, bf16, int8, int4)", name));
}

const char* CodecName(Codec codec) {
  switch (codec) {
    case Codec::kNone:
      return "none";
    case Codec::kBf16:
      return "bf16";
    case Codec::kInt8:
      return "int8";
    case Codec::kInt4:
      return "int4";
  }
  return "unknown";
}

size_t EncodedBytes(Codec codec, size_t count) {
  switch (codec) {
    case Codec::kNone:
      return kCodecHeaderBytes + 4 * count;
    case Codec::kBf16:
      return kCodecHeaderBytes + 2 * count;
    case Codec::kInt8:
    case Codec::kInt4: {
      const size_t full = count / kCodecBlock;
      const size_t rest = count % kCodecBlock;
      return kCodecHeaderBytes + full * BlockBytes(codec, kCodecBlock) +
             (rest ? BlockBytes(codec, rest) : 0);
    }
  }
  return kCodecHeaderBytes;
}

void Encode(Codec codec, std::span<const float> x, std::vector<uint8_t>* out,
            std::span<float> residual) {
  out->resize(EncodedBytes(codec, x.size()));
  uint8_t* p = out->data();
  const uint64_t count = x.size();
  std::memcpy(p, &kMagic, 4);
  p[4] = uint8_t(codec);
  p[5] = p[6] = p[7] = 0;
  std::memcpy(p + 8, &count, 8);
  p += kCodecHeaderBytes;
  switch (codec) {
    case Codec::kNone:
      EncodeNone(x, p, residual);
      return;
    case Codec::kBf16:
      EncodeBf16(x, p, residual);
      return;
    case Codec::kInt8:
    case Codec::kInt4:
      EncodeBlockwise(codec, x, p, residual);
      return;
  }
}

Status Decode(std::span<const uint8_t> in, std::span<float> out) {
  ATOLL_ASSIGN_OR_RETURN(const Message m, Validate(in, out.size()));
  DecodeInto<false>(m, 0.0f, out);
  return Status::Ok();
}

Status DecodeAdd(std::span<const uint8_t> in, float weight, std::span<float> out) {
  ATOLL_ASSIGN_OR_RETURN(const Message m, Validate(in, out.size()));
  DecodeInto<true>(m, weight, out);
  return Status::Ok();
}

}  // namespace atl
