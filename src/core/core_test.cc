#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "core/file.h"
#include "core/hash.h"
#include "core/rng.h"
#include "core/status.h"

namespace atl {
namespace {

// Known-answer vectors from the Random123 distribution (kat_vectors, philox4x32_10).
TEST(Philox, MatchesRandom123KnownAnswers) {
  auto r = Philox4x32({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(r[0], 0x6627e8d5u);
  EXPECT_EQ(r[1], 0xe169c58du);
  EXPECT_EQ(r[2], 0xbc57ac4cu);
  EXPECT_EQ(r[3], 0x9b00dbd8u);
  r = Philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(r[0], 0x408f276du);
  EXPECT_EQ(r[1], 0x41c83b0eu);
  EXPECT_EQ(r[2], 0xa20bc7c6u);
  EXPECT_EQ(r[3], 0x6d5451fdu);
  r = Philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u});
  EXPECT_EQ(r[0], 0xd16cfe09u);
  EXPECT_EQ(r[1], 0x94fdccebu);
  EXPECT_EQ(r[2], 0x5001e420u);
  EXPECT_EQ(r[3], 0x24126ea1u);
}

TEST(Rng, DrawsDependOnEveryCoordinate) {
  const uint64_t base = RandomBits(1, 2, RngPurpose::kInit, 3);
  EXPECT_EQ(base, RandomBits(1, 2, RngPurpose::kInit, 3));
  EXPECT_NE(base, RandomBits(2, 2, RngPurpose::kInit, 3));
  EXPECT_NE(base, RandomBits(1, 3, RngPurpose::kInit, 3));
  EXPECT_NE(base, RandomBits(1, 2, RngPurpose::kDataSample, 3));
  EXPECT_NE(base, RandomBits(1, 2, RngPurpose::kInit, 4));
}

TEST(Rng, NormalHasUnitMomentsAndBelowIsInRange) {
  double sum = 0, sum2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    double x = RandomNormal(7, 0, RngPurpose::kTest, uint64_t(i));
    sum += x;
    sum2 += x * x;
    uint64_t k = RandomBelow(7, 0, RngPurpose::kTest, uint64_t(i), 13);
    ASSERT_LT(k, 13u);
    float u = RandomUniform(7, 0, RngPurpose::kTest, uint64_t(i));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum2 / n, 1.0, 0.02);
}

TEST(Hash, HexRoundTripsAndRejectsGarbage) {
  uint64_t h = Hash64("atoll");
  uint64_t back = 0;
  ASSERT_TRUE(HexToHash(HashToHex(h), &back));
  EXPECT_EQ(h, back);
  EXPECT_FALSE(HexToHash("xyz", &back));
  EXPECT_FALSE(HexToHash("00000000000000zz", &back));
  EXPECT_NE(Hash64("atoll"), Hash64("atolm"));
}

TEST(Status, ExitCodesSeparateBadInputFromFailures) {
  EXPECT_EQ(Status::Ok().ExitCode(), 0);
  EXPECT_EQ(Status::InvalidArgument("x").ExitCode(), 2);
  EXPECT_EQ(Status::Corruption("x").ExitCode(), 2);
  EXPECT_EQ(Status::NotFound("x").ExitCode(), 2);
  EXPECT_EQ(Status::IoError("x").ExitCode(), 1);
  EXPECT_EQ(Status::NotFound("x").WithContext("loading y").message(), "loading y: x");
  StatusOr<int> v = 3;
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 3);
  StatusOr<int> e = Status::Corruption("bad");
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kCorruption);
}

TEST(File, AtomicWriteReplacesAndLeavesNoTemp) {
  const std::string dir = ::testing::TempDir() + "/atoll_core_file";
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(MakeDirs(dir).ok());
  const std::string path = dir + "/f.bin";
  ASSERT_TRUE(WriteFileAtomic(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomic(path, "second").ok());
  auto got = ReadFile(path);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, "second");
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  auto m = MappedFile::Open(path);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m->data()), m->size()), "second");
  EXPECT_EQ(ReadFile(dir + "/missing").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace atl
