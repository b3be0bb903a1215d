// The corruption checks' reads on the GPU (checks.cu): RangeHashes against the function its
// comment defines, computed here on the host; every changed word found in its own range and no
// other; MaxAbsInto against the host's, non-finite values included. Skipped without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

namespace atl::kernels::cuda {
namespace {

class CudaChecks : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!Available(&why)) GTEST_SKIP() << "no GPU here (" << why << ")";
  }
};

std::vector<uint32_t> Words(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint32_t> v(n);
  for (uint32_t& w : v) w = gen();
  return v;
}

// RangeHashes's function as ops.h states it, one word after another.
uint64_t Reference(const uint32_t* words, HashRange r) {
  constexpr uint64_t kThreads = 256;
  uint64_t h = HashMix(r.end - r.begin + kHashSeed);
  for (uint64_t b = r.begin; b < r.end; b += kHashChunkWords) {
    std::vector<uint64_t> t(kThreads);
    for (uint64_t i = 0; i < kThreads; ++i) {
      t[i] = HashMix(i + 1);
      for (uint64_t w = b + i; w < std::min(r.end, b + kHashChunkWords); w += kThreads)
        t[i] = HashStep(t[i], words[w]);
    }
    for (uint64_t s = kThreads / 2; s > 0; s /= 2)
      for (uint64_t i = 0; i < s; ++i) t[i] = HashCombine(t[i], t[i + s]);
    h = HashCombine(h, t[0]);
  }
  return h;
}

std::vector<uint64_t> OnGpu(const DeviceArray<uint32_t>& d, const std::vector<HashRange>& ranges) {
  std::vector<uint64_t> out(ranges.size());
  RangeHashes(out.data(), d.data(), ranges.data(), int(ranges.size()));
  return out;
}

// Ranges of odd lengths, one of several chunks, an empty one, adjacent and apart, in no order.
const std::vector<HashRange> kRanges = {
    {0, 1}, {1, 8}, {8, 8}, {20, 20 + 3 * kHashChunkWords + 77}, {9, 20}, {30000, 30256}};

TEST_F(CudaChecks, RangeHashesIsTheStatedFunction) {
  const auto words = Words(40000, 1);
  const auto d = ToDevice(words);
  const auto got = OnGpu(d, kRanges);
  for (size_t r = 0; r < kRanges.size(); ++r)
    EXPECT_EQ(got[r], Reference(words.data(), kRanges[r])) << "range " << r;
  EXPECT_EQ(OnGpu(d, kRanges), got);  // twice: the same
  // The same words at another place give the same fingerprint; another length another one.
  std::vector<uint32_t> moved(words.size(), 0);
  std::copy(words.begin() + 9, words.begin() + 20, moved.begin() + 100);
  const auto dm = ToDevice(moved);
  EXPECT_EQ(OnGpu(dm, {{100, 111}})[0], got[4]);
  EXPECT_NE(OnGpu(dm, {{100, 110}})[0], got[4]);
}

// The range tables stay on the GPU between calls (a few kept, the least recently used
// replaced): tables that differ by one bound, more of them than are kept, in turn and again, each
// give their own reference hashes; a kept table uploads nothing the next time.
TEST_F(CudaChecks, RangeTablesKeptOnTheGpuAreTheRightOnes) {
  const auto words = Words(5000, 4);
  const auto d = ToDevice(words);
  std::vector<std::vector<HashRange>> tables;
  for (uint64_t i = 0; i < 40; ++i) tables.push_back({{0, 100 + i}, {200, 300}, {300, 4000 + i}});
  for (int round = 0; round < 2; ++round)
    for (const auto& t : tables) {
      const auto got = OnGpu(d, t);
      for (size_t r = 0; r < t.size(); ++r)
        ASSERT_EQ(got[r], Reference(words.data(), t[r])) << "table ending " << t[2].end;
    }
  const auto before = Copied();
  OnGpu(d, tables.back());
  EXPECT_EQ(Copied().to_device, before.to_device);
}

// A flipped bit anywhere (sign, exponent, mantissa; first, middle, last word of a chunk) changes
// its range's fingerprint and no other's.
TEST_F(CudaChecks, EveryFlippedBitIsFoundInItsRange) {
  auto words = Words(40000, 2);
  const auto clean = OnGpu(ToDevice(words), kRanges);
  std::mt19937 gen(3);
  const uint64_t c = kHashChunkWords;  // range 3 is [20, 97 + 3c)
  std::vector<uint64_t> where = {0, 1, 7, 9, 19, 20, 19 + c, 20 + c, 96 + 3 * c, 30255};
  for (int i = 0; i < 40; ++i) where.push_back(20 + gen() % (3 * kHashChunkWords + 77));
  for (const uint64_t w : where) {
    const int bit = int(gen() % 32);
    words[w] ^= 1u << bit;
    const auto got = OnGpu(ToDevice(words), kRanges);
    words[w] ^= 1u << bit;
    for (size_t r = 0; r < kRanges.size(); ++r) {
      const bool inside = w >= kRanges[r].begin && w < kRanges[r].end;
      EXPECT_EQ(got[r] != clean[r], inside) << "word " << w << " bit " << bit << " range " << r;
    }
  }
}

// The largest |x_i| by MaxAbsInto into a slot of 0.
float MaxAbs(const float* x, size_t n) {
  auto slot = ToDevice(std::vector<float>{0.0f});
  MaxAbsInto(slot.data(), x, n);
  return ToHost(slot)[0];
}

TEST_F(CudaChecks, MaxAbs) {
  for (const size_t n : {size_t(1), size_t(1000), size_t(65537), size_t(300001)}) {
    std::mt19937 gen{uint32_t(n)};
    std::normal_distribution<float> dist(0.0f, 3.0f);
    std::vector<float> x(n);
    for (float& v : x) v = dist(gen);
    float want = 0;
    for (float v : x) want = std::max(want, std::abs(v));
    EXPECT_EQ(MaxAbs(ToDevice(x).data(), n), want) << n;
    x[n / 2] = -2 * want;  // the largest is negative
    EXPECT_EQ(MaxAbs(ToDevice(x).data(), n), 2 * want) << n;
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -INFINITY}) {
      x[n - 1] = bad;
      EXPECT_EQ(MaxAbs(ToDevice(x).data(), n), INFINITY) << n << " " << bad;
    }
  }
  EXPECT_EQ(MaxAbs(nullptr, 0), 0.0f);
}

// MaxAbsInto keeps the largest over its calls in a device slot, without a wait: the larger of the
// slot's and the array's, a non-finite element making it infinity from then on.
TEST_F(CudaChecks, MaxAbsIntoKeepsTheLargestWithoutAWait) {
  const std::vector<float> small = {1.0f, -3.0f, 2.0f}, large(70000, -5.5f);
  std::vector<float> bad = small;
  bad[1] = std::numeric_limits<float>::quiet_NaN();
  auto g_small = ToDevice(small), g_large = ToDevice(large), g_bad = ToDevice(bad);
  auto slots = ToDevice(std::vector<float>{0.0f, 4.0f});
  MaxAbsInto(slots.data(), g_small.data(), small.size());
  MaxAbsInto(slots.data() + 1, g_small.data(), small.size());
  EXPECT_EQ(ToHost(slots), (std::vector<float>{3.0f, 4.0f}));
  MaxAbsInto(slots.data(), g_large.data(), large.size());  // 2 chunks: the scratch has grown
  EXPECT_EQ(ToHost(slots), (std::vector<float>{5.5f, 4.0f}));
  const uint64_t waits = Copied().waits;
  MaxAbsInto(slots.data(), g_small.data(), small.size());
  MaxAbsInto(slots.data() + 1, g_small.data(), 0);  // nothing
  MaxAbsInto(slots.data() + 1, g_bad.data(), bad.size());
  MaxAbsInto(slots.data() + 1, g_large.data(), large.size());
  EXPECT_EQ(Copied().waits, waits);
  EXPECT_EQ(ToHost(slots), (std::vector<float>{5.5f, INFINITY}));
}

}  // namespace
}  // namespace atl::kernels::cuda
