#include "world/codec.h"

#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace atl {
namespace {

constexpr Codec kAll[] = {Codec::kNone, Codec::kBf16, Codec::kInt8, Codec::kInt4};
constexpr Codec kBlockwise[] = {Codec::kInt8, Codec::kInt4};

std::vector<float> RandomVector(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<float> RoundTrip(Codec codec, const std::vector<float>& x) {
  std::vector<uint8_t> enc;
  Encode(codec, x, &enc);
  std::vector<float> dec(x.size(), -1.0f);
  Status s = Decode(enc, dec);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return dec;
}

float QMax(Codec codec) { return codec == Codec::kInt8 ? 127.0f : 7.0f; }

uint16_t Bf16Bits(float f) {
  std::vector<float> x = {f};
  std::vector<uint8_t> enc;
  Encode(Codec::kBf16, x, &enc);
  uint16_t h;
  std::memcpy(&h, enc.data() + kCodecHeaderBytes, 2);
  return h;
}

float FromBits(uint32_t u) { return std::bit_cast<float>(u); }

// The byte offset of block `blk`'s scale in an encoded message.
size_t ScaleOffset(Codec codec, size_t blk) {
  return kCodecHeaderBytes + blk * (4 + (codec == Codec::kInt8 ? kCodecBlock : kCodecBlock / 2));
}

TEST(CodecTest, ParseAndName) {
  for (Codec c : kAll) {
    auto parsed = ParseCodec(CodecName(c));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, c);
  }
  auto bad = ParseCodec("fp8");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  for (const char* name : {"fp8", "none", "bf16", "int8", "int4"}) {
    EXPECT_NE(bad.status().message().find(name), std::string::npos) << bad.status().message();
  }
}

TEST(CodecTest, EncodedBytesMatchesOutput) {
  for (Codec c : kAll) {
    for (size_t n : {0, 1, 2, 127, 128, 129, 255, 256, 1000}) {
      std::vector<float> x = RandomVector(n, 7);
      std::vector<uint8_t> enc;
      Encode(c, x, &enc);
      EXPECT_EQ(enc.size(), EncodedBytes(c, n)) << CodecName(c) << " n=" << n;
    }
  }
  EXPECT_EQ(EncodedBytes(Codec::kNone, 10), 16u + 40);
  EXPECT_EQ(EncodedBytes(Codec::kBf16, 10), 16u + 20);
  EXPECT_EQ(EncodedBytes(Codec::kInt8, 129), 16u + (4 + 128) + (4 + 1));
  EXPECT_EQ(EncodedBytes(Codec::kInt4, 129), 16u + (4 + 64) + (4 + 1));
  EXPECT_EQ(EncodedBytes(Codec::kInt4, 3), 16u + 4 + 2);
  EXPECT_EQ(EncodedBytes(Codec::kInt8, 0), 16u);
}

TEST(CodecTest, HeaderLayout) {
  std::vector<float> x = RandomVector(5, 1);
  std::vector<uint8_t> enc;
  Encode(Codec::kInt4, x, &enc);
  EXPECT_EQ(std::memcmp(enc.data(), "ATC1", 4), 0);
  EXPECT_EQ(enc[4], 3);
  EXPECT_EQ(enc[5] | enc[6] | enc[7], 0);
  uint64_t count;
  std::memcpy(&count, enc.data() + 8, 8);
  EXPECT_EQ(count, 5u);
}

TEST(CodecTest, NoneIsExact) {
  std::vector<float> x = RandomVector(1000, 2);
  x[3] = std::numeric_limits<float>::lowest();
  x[4] = -0.0f;
  x[5] = std::numeric_limits<float>::denorm_min();
  std::vector<float> dec = RoundTrip(Codec::kNone, x);
  EXPECT_EQ(std::memcmp(dec.data(), x.data(), 4 * x.size()), 0);
}

TEST(CodecTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(Bf16Bits(1.0f), 0x3f80);
  EXPECT_EQ(Bf16Bits(-2.0f), 0xc000);
  // Exactly halfway between 0x3f80 and 0x3f81: ties go to the even 0x3f80.
  EXPECT_EQ(Bf16Bits(FromBits(0x3f808000)), 0x3f80);
  // Halfway between 0x3f81 and 0x3f82: ties go to the even 0x3f82.
  EXPECT_EQ(Bf16Bits(FromBits(0x3f818000)), 0x3f82);
  // Just above and below halfway.
  EXPECT_EQ(Bf16Bits(FromBits(0x3f808001)), 0x3f81);
  EXPECT_EQ(Bf16Bits(FromBits(0x3f807fff)), 0x3f80);
  // Rounding carries into the exponent; the largest finite float rounds up to infinity.
  EXPECT_EQ(Bf16Bits(FromBits(0x3fffffff)), 0x4000);
  EXPECT_EQ(Bf16Bits(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(Bf16Bits(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(Bf16Bits(-std::numeric_limits<float>::infinity()), 0xff80);
  // NaN stays NaN, including one whose payload is only in the low 16 bits.
  EXPECT_TRUE(std::isnan(FromBits(uint32_t(Bf16Bits(FromBits(0x7f800001))) << 16)));
  EXPECT_TRUE(std::isnan(FromBits(uint32_t(Bf16Bits(std::nanf(""))) << 16)));
  EXPECT_EQ(Bf16Bits(-0.0f), 0x8000);

  std::vector<float> x = RandomVector(1001, 3);
  std::vector<float> dec = RoundTrip(Codec::kBf16, x);
  for (size_t i = 0; i < x.size(); ++i) {
    // Round to nearest with an 8-bit significand: relative error at most 2^-8, and dec is one of
    // the two bf16 neighbours of x (truncation and truncation + 1 ulp).
    EXPECT_LE(std::fabs(x[i] - dec[i]), std::ldexp(std::fabs(x[i]), -8)) << i;
    const uint32_t u = std::bit_cast<uint32_t>(x[i]);
    const float down = FromBits(u & 0xffff0000u), up = FromBits((u & 0xffff0000u) + 0x10000u);
    EXPECT_TRUE(dec[i] == down || dec[i] == up) << i;
    EXPECT_LE(std::fabs(x[i] - dec[i]), std::fabs(x[i] - (dec[i] == down ? up : down))) << i;
  }
}

TEST(CodecTest, BlockwiseErrorWithinHalfQuantum) {
  for (Codec c : kBlockwise) {
    for (size_t n : {1, 2, 3, 127, 128, 129, 1000, 1001}) {
      // Blocks of very different magnitudes, so each block's own scale matters.
      std::vector<float> x = RandomVector(n, uint32_t(n));
      for (size_t i = 0; i < n; ++i) x[i] *= std::ldexp(1.0f, int(i / kCodecBlock) * 3 - 6);
      std::vector<uint8_t> enc;
      Encode(c, x, &enc);
      std::vector<float> dec(n);
      ASSERT_TRUE(Decode(enc, dec).ok());
      for (size_t b = 0; b < n; b += kCodecBlock) {
        size_t len = std::min(kCodecBlock, n - b);
        float absmax = 0;
        for (size_t i = b; i < b + len; ++i) absmax = std::max(absmax, std::fabs(x[i]));
        const float scale = absmax / QMax(c);
        float stored;
        std::memcpy(&stored, enc.data() + ScaleOffset(c, b / kCodecBlock), 4);
        EXPECT_EQ(stored, scale);
        for (size_t i = b; i < b + len; ++i) {
          // Half a quantum, plus float rounding of x / scale and q * scale.
          EXPECT_LE(std::fabs(x[i] - dec[i]), scale * 0.5f * (1 + 1e-5f))
              << CodecName(c) << " n=" << n << " i=" << i;
        }
        // The absmax element is represented exactly up to float rounding (q = +-qmax).
        size_t arg = b;
        for (size_t i = b; i < b + len; ++i) {
          if (std::fabs(x[i]) == absmax) arg = i;
        }
        EXPECT_NEAR(std::fabs(dec[arg]), absmax, absmax * 1e-6f);
      }
    }
  }
}

TEST(CodecTest, Int8RoundsHalfToEven) {
  // absmax 127 gives scale 1: q = nearbyint(x) exactly.
  std::vector<float> x = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 3.49f};
  std::vector<float> dec = RoundTrip(Codec::kInt8, x);
  std::vector<float> want = {127.0f, 0.0f, 2.0f, 2.0f, -0.0f, -2.0f, -2.0f, 3.0f};
  EXPECT_EQ(dec, want);
  // absmax 7 gives scale 1 for int4; odd count exercises the padding nibble.
  std::vector<float> y = {-7.0f, 2.5f, 3.5f, -6.5f, 1.0f};
  EXPECT_EQ(RoundTrip(Codec::kInt4, y), (std::vector<float>{-7.0f, 2.0f, 4.0f, -6.0f, 1.0f}));
}

TEST(CodecTest, ZeroBlocks) {
  for (Codec c : kBlockwise) {
    std::vector<float> x(300, 0.0f);
    for (size_t i = 128; i < 256; ++i) x[i] = float(i) - 200.0f;  // only the middle block is live
    std::vector<uint8_t> enc;
    Encode(c, x, &enc);
    float s0, s2;
    std::memcpy(&s0, enc.data() + ScaleOffset(c, 0), 4);
    std::memcpy(&s2, enc.data() + ScaleOffset(c, 2), 4);
    EXPECT_EQ(s0, 0.0f);
    EXPECT_EQ(s2, 0.0f);
    std::vector<float> dec(x.size(), 5.0f);
    ASSERT_TRUE(Decode(enc, dec).ok());
    for (size_t i = 0; i < 128; ++i) EXPECT_EQ(dec[i], 0.0f);
    for (size_t i = 256; i < 300; ++i) EXPECT_EQ(dec[i], 0.0f);
  }
}

TEST(CodecTest, NonFiniteInputIsRefusedAtTheReceiver) {
  for (Codec c : kBlockwise) {
    for (float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
      std::vector<float> x = RandomVector(400, 4);
      x[3 * kCodecBlock + 1] = bad;
      std::vector<uint8_t> enc;
      Encode(c, x, &enc);
      std::vector<float> out(x.size(), 9.0f);
      Status s = Decode(enc, out);
      ASSERT_FALSE(s.ok());
      EXPECT_EQ(s.code(), StatusCode::kCorruption);
      EXPECT_NE(s.message().find("non-finite scale in block 3"), std::string::npos) << s.message();
      for (float v : out) ASSERT_EQ(v, 9.0f);
    }
  }
}

// float32 and bfloat16 carry a non-finite value as it is: the receiver refuses it too.
TEST(CodecTest, NonFiniteValuesOfNoneAndBf16AreRefusedAtTheReceiver) {
  for (Codec c : {Codec::kNone, Codec::kBf16}) {
    for (float bad : {std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity(), std::nanf("")}) {
      std::vector<float> x = RandomVector(300, 4);
      x[217] = bad;
      std::vector<uint8_t> enc;
      Encode(c, x, &enc);
      std::vector<float> out(x.size(), 9.0f);
      Status s = Decode(enc, out);
      ASSERT_FALSE(s.ok()) << CodecName(c);
      EXPECT_EQ(s.code(), StatusCode::kCorruption);
      EXPECT_NE(s.message().find("non-finite value at element 217"), std::string::npos)
          << s.message();
      for (float v : out) ASSERT_EQ(v, 9.0f);
      EXPECT_FALSE(DecodeAdd(enc, 1.0f, out).ok());
    }
  }
}

// Found by fuzz/codec_fuzz.cc: near FLT_MAX, absmax / qmax * qmax rounded up to infinity, so a
// finite block decoded to an infinity that Decode let through. Encode now takes a scale whose
// every q decodes finite, and Decode refuses a scale whose qmax multiple overflows.
TEST(CodecTest, BlocksNearTheLargestFloatDecodeFinite) {
  for (Codec c : kBlockwise) {
    std::vector<float> x(kCodecBlock, 1.0f);
    x[5] = std::numeric_limits<float>::max();
    x[6] = -std::numeric_limits<float>::max();
    std::vector<uint8_t> enc;
    Encode(c, x, &enc);
    std::vector<float> out(x.size());
    ASSERT_TRUE(Decode(enc, out).ok()) << CodecName(c);
    for (float v : out) ASSERT_TRUE(std::isfinite(v)) << CodecName(c);
    EXPECT_GT(out[5], 0.99f * std::numeric_limits<float>::max());
    // A peer's message with the largest scale: 127 * scale (7 * scale) is infinite.
    const float huge = std::numeric_limits<float>::max();
    std::memcpy(enc.data() + kCodecHeaderBytes, &huge, 4);
    Status s = Decode(enc, out);
    ASSERT_FALSE(s.ok()) << CodecName(c);
    EXPECT_NE(s.message().find("overflows float32"), std::string::npos) << s.message();
  }
}

TEST(CodecTest, Deterministic) {
  std::vector<float> x = RandomVector(5000, 5);
  for (Codec c : kAll) {
    std::vector<uint8_t> a, b;
    Encode(c, x, &a);
    Encode(c, x, &b);
    EXPECT_EQ(a, b) << CodecName(c);
    std::vector<float> ra(x.size(), 0.25f), rb(x.size(), 0.25f);
    Encode(c, x, &a, ra);
    Encode(c, x, &b, rb);
    EXPECT_EQ(a, b) << CodecName(c);
    EXPECT_EQ(ra, rb) << CodecName(c);
  }
}

TEST(CodecTest, ResidualIsWhatWasLost) {
  for (Codec c : kAll) {
    std::vector<float> x = RandomVector(777, 6);
    std::vector<float> r = RandomVector(777, 7, 0.01f);
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] + r[i];
    std::vector<uint8_t> enc;
    Encode(c, x, &enc, r);
    std::vector<float> dec(x.size());
    ASSERT_TRUE(Decode(enc, dec).ok());
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(r[i], y[i] - dec[i]) << CodecName(c) << " i=" << i;
      if (c == Codec::kNone) {
        ASSERT_EQ(dec[i], y[i]);
      }
    }
  }
}

// Sends the same vector many times. With error feedback the receiver's running sum stays within
// one quantum of the sender's (the residual is bounded); without it the rounding bias of each
// element accumulates linearly.
TEST(CodecTest, ErrorFeedbackKeepsTheRunningSumClose) {
  const size_t n = 300;
  const int rounds = 200;
  for (Codec c : kBlockwise) {
    std::vector<float> x = RandomVector(n, 8);
    x[0] = 4.0f;  // the absmax of block 0 sets scale = 4 / qmax; the others are off-grid
    std::vector<float> residual(n, 0.0f);
    std::vector<double> sent(n, 0.0), got_ef(n, 0.0), got_plain(n, 0.0);
    std::vector<uint8_t> enc;
    std::vector<float> dec(n);
    float max_scale = 0;
    for (int r = 0; r < rounds; ++r) {
      Encode(c, x, &enc, residual);
      ASSERT_TRUE(Decode(enc, dec).ok());
      for (size_t i = 0; i < n; ++i) got_ef[i] += dec[i];
      for (size_t b = 0; b < (n + kCodecBlock - 1) / kCodecBlock; ++b) {
        float s;
        std::memcpy(&s, enc.data() + ScaleOffset(c, b), 4);
        max_scale = std::max(max_scale, s);
      }
      Encode(c, x, &enc);
      ASSERT_TRUE(Decode(enc, dec).ok());
      for (size_t i = 0; i < n; ++i) {
        got_plain[i] += dec[i];
        sent[i] += x[i];
      }
    }
    double worst_ef = 0, worst_plain = 0;
    for (size_t i = 0; i < n; ++i) {
      worst_ef = std::max(worst_ef, std::fabs(sent[i] - got_ef[i]));
      worst_plain = std::max(worst_plain, std::fabs(sent[i] - got_plain[i]));
      // sent - got = residual (up to float summation error).
      EXPECT_LE(std::fabs(sent[i] - got_ef[i]), max_scale * (1 + 1e-3)) << CodecName(c) << i;
    }
    EXPECT_GT(worst_plain, 10 * worst_ef) << CodecName(c);
    EXPECT_GT(worst_plain, 5 * max_scale) << CodecName(c);
  }
}

TEST(CodecTest, DecodeAddAddsWeightedDecoded) {
  for (Codec c : kAll) {
    std::vector<float> x = RandomVector(333, 9);
    std::vector<uint8_t> enc;
    Encode(c, x, &enc);
    std::vector<float> dec(x.size());
    ASSERT_TRUE(Decode(enc, dec).ok());
    std::vector<float> acc = RandomVector(333, 10);
    std::vector<float> want = acc;
    for (size_t i = 0; i < x.size(); ++i) {
      volatile float w = 0.375f * dec[i];  // volatile: no fused multiply-add here either
      want[i] += w;
    }
    ASSERT_TRUE(DecodeAdd(enc, 0.375f, acc).ok());
    EXPECT_EQ(acc, want) << CodecName(c);
    // The same validation as Decode, and `out` untouched on refusal.
    std::vector<float> before = acc;
    enc.pop_back();
    EXPECT_EQ(DecodeAdd(enc, 1.0f, acc).code(), StatusCode::kCorruption);
    EXPECT_EQ(acc, before);
  }
}

// Expects Decode to refuse `enc` with a message containing `what`, leaving out untouched.
void ExpectRefused(const std::vector<uint8_t>& enc, size_t count, const std::string& what) {
  std::vector<float> out(count, 3.0f);
  Status s = Decode(enc, out);
  ASSERT_FALSE(s.ok()) << what;
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
  for (float v : out) ASSERT_EQ(v, 3.0f) << what;
}

TEST(CodecTest, DecodeRefusesCorruptMessages) {
  std::vector<float> x = RandomVector(12, 11);
  for (Codec c : kAll) {
    std::vector<uint8_t> good;
    Encode(c, x, &good);
    auto bad = good;
    bad[0] = 'X';
    ExpectRefused(bad, 12, "bad magic");
    bad = good;
    bad[4] = 9;
    ExpectRefused(bad, 12, "unknown codec 9");
    bad = good;
    bad[6] = 1;
    ExpectRefused(bad, 12, "reserved header bytes");
    ExpectRefused(good, 10, "count 12 in the header, 10 expected");
    bad = good;
    bad.pop_back();
    ExpectRefused(bad, 12,
                  fmt::format("{} bytes, {} expected for {} of 12 floats", good.size() - 1,
                              good.size(), CodecName(c)));
    bad = good;
    bad.push_back(0);
    ExpectRefused(bad, 12, fmt::format("{} bytes, {} expected", good.size() + 1, good.size()));
    ExpectRefused(std::vector<uint8_t>(good.begin(), good.begin() + 7), 12, "header");
  }
  {
    std::vector<float> y = RandomVector(300, 12);
    for (Codec c : kBlockwise) {
      std::vector<uint8_t> good;
      Encode(c, y, &good);
      auto bad = good;
      float nan = std::nanf("");
      std::memcpy(bad.data() + ScaleOffset(c, 2), &nan, 4);
      ExpectRefused(bad, 300, "non-finite scale in block 2");
      bad = good;
      float neg = -1.0f;
      std::memcpy(bad.data() + ScaleOffset(c, 1), &neg, 4);
      ExpectRefused(bad, 300, "negative scale -1 in block 1");
      bad = good;
      bad[ScaleOffset(c, 1) + 4 + 5] = 0x80;  // -128 (int8) or -8 in the high nibble (int4)
      ExpectRefused(bad, 300, "in block 1, outside");
    }
    // int4 with an odd count: the padding nibble must be zero.
    std::vector<uint8_t> enc;
    Encode(Codec::kInt4, std::vector<float>{1.0f, 2.0f, 3.0f}, &enc);
    enc.back() |= 0x10;
    ExpectRefused(enc, 3, "padding nibble");
  }
}

// Not a correctness test: prints single-core throughput in GB/s of float input.
TEST(CodecTest, Throughput) {
  const size_t n = 11'500'000;  // about a GPT-2 small pseudo-gradient fragment: 46 MB of floats
  std::vector<float> x = RandomVector(n, 13);
  std::vector<float> residual(n, 0.0f), out(n, 0.0f);
  std::vector<uint8_t> enc;
  using Clock = std::chrono::steady_clock;
  auto gbps = [&](auto&& fn) {
    fn();  // warm up (page faults, resize)
    double best = 1e30;
    for (int r = 0; r < 5; ++r) {
      auto t0 = Clock::now();
      fn();
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return double(4 * n) / best / 1e9;
  };
  for (Codec c : kAll) {
    double enc_plain = gbps([&] { Encode(c, x, &enc); });
    double enc_ef = gbps([&] { Encode(c, x, &enc, residual); });
    Encode(c, x, &enc);
    double dec = gbps([&] { ASSERT_TRUE(Decode(enc, out).ok()); });
    double dec_add = gbps([&] { ASSERT_TRUE(DecodeAdd(enc, 0.5f, out).ok()); });
    std::printf(
        "%s: encode %.2f GB/s, encode+EF %.2f GB/s, decode %.2f GB/s, decode-add %.2f GB/s\n",
        CodecName(c), enc_plain, enc_ef, dec, dec_add);
  }
}

}  // namespace
}  // namespace atl
