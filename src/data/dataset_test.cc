// Token files (round trip, and refusing every kind of damage) and the sampler's determinism.
#include "data/dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include "core/hash.h"
#include "data/test_util.h"

namespace atl {
namespace {

using testing_util::TempDir;

std::vector<uint16_t> Iota(size_t n) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint16_t(i * 7 + 3);  // distinct for n < 9362
  return v;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(TokenFile, RoundTrips) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {0, 1, 50256, 65535, 12345, 7};
  ASSERT_TRUE(WriteTokenFile(dir.File("t.bin"), tokens).ok());
  EXPECT_EQ(std::filesystem::file_size(dir.File("t.bin")), 24 + 2 * tokens.size());
  auto f = TokenFile::Open(dir.File("t.bin"));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(std::vector<uint16_t>(f->tokens().begin(), f->tokens().end()), tokens);
  EXPECT_EQ(f->size(), tokens.size());
  EXPECT_EQ(f->checksum(), Hash64(tokens.data(), tokens.size() * 2));
  EXPECT_EQ(f->path(), dir.File("t.bin"));
  // The header layout is the documented one.
  const std::string bytes = ReadBytes(dir.File("t.bin"));
  EXPECT_EQ(bytes.substr(0, 8), "ATOLTOK1");
  EXPECT_EQ(uint8_t(bytes[8]), tokens.size());
  EXPECT_EQ(uint8_t(bytes[24 + 4]), 0x50);  // 50256 = 0xC450, little-endian
  EXPECT_EQ(uint8_t(bytes[24 + 5]), 0xC4);

  // A moved TokenFile keeps its view of the mapping.
  TokenFile moved = std::move(f).value();
  EXPECT_EQ(moved.tokens()[2], 50256);
}

TEST(TokenFile, RoundTripsAnEmptyFile) {
  TempDir dir;
  ASSERT_TRUE(WriteTokenFile(dir.File("e.bin"), {}).ok());
  auto f = TokenFile::Open(dir.File("e.bin"));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->size(), 0u);
}

// Every damaged variant must be refused as corruption, naming the file and the problem.
void ExpectCorruption(const std::string& path, const std::string& what) {
  auto f = TokenFile::Open(path);
  ASSERT_FALSE(f.ok()) << "opened a damaged file (" << what << ")";
  EXPECT_EQ(f.status().code(), StatusCode::kCorruption) << f.status().ToString();
  EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status().ToString();
  EXPECT_NE(f.status().message().find(what), std::string::npos) << f.status().ToString();
}

TEST(TokenFile, RefusesTruncatedFiles) {
  TempDir dir;
  const std::string path = dir.File("t.bin");
  ASSERT_TRUE(WriteTokenFile(path, Iota(1000)).ok());
  const std::string good = ReadBytes(path);
  for (size_t keep : {good.size() - 1, good.size() - 2, size_t{1000}, size_t{24}}) {
    WriteBytes(path, good.substr(0, keep));
    ExpectCorruption(path, "truncated");
  }
  for (size_t keep : {size_t{0}, size_t{7}, size_t{23}}) {
    WriteBytes(path, good.substr(0, keep));
    ExpectCorruption(path, "header");
  }
  WriteBytes(path, good + "xy");  // trailing bytes are damage too
  ExpectCorruption(path, "follow the header");
}

TEST(TokenFile, RefusesFlippedBytes) {
  TempDir dir;
  const std::string path = dir.File("t.bin");
  ASSERT_TRUE(WriteTokenFile(path, Iota(1000)).ok());
  const std::string good = ReadBytes(path);
  struct Case {
    size_t offset;
    const char* what;
  };
  for (Case c : {Case{0, "magic"}, Case{7, "magic"}, Case{8, "header says"}, Case{16, "checksum"},
                 Case{23, "checksum"}, Case{24, "checksum"}, Case{1000, "checksum"},
                 Case{good.size() - 1, "checksum"}}) {
    std::string bad = good;
    bad[c.offset] = char(bad[c.offset] ^ 0x10);
    WriteBytes(path, bad);
    ExpectCorruption(path, c.what);
  }
}

TEST(TokenFile, MissingFileIsNotFound) {
  TempDir dir;
  EXPECT_EQ(TokenFile::Open(dir.File("nope.bin")).status().code(), StatusCode::kNotFound);
}

TEST(Sampler, WindowIsAPureFunctionOfSeedStepAndPosition) {
  const std::vector<uint16_t> tokens = Iota(5000);
  const int seq = 64;
  std::vector<int32_t> in(seq), tgt(seq), in2(seq), tgt2(seq);
  // Forward order on one sampler, reverse order on another: same windows.
  Sampler a(tokens, 42, seq);
  Sampler b(tokens, 42, seq);
  std::vector<std::vector<int32_t>> forward;
  for (uint64_t step = 0; step < 4; ++step) {
    for (uint64_t pos = 0; pos < 32; ++pos) {
      a.Window(step, pos, in.data(), tgt.data());
      forward.push_back(in);
    }
  }
  for (int k = int(forward.size()) - 1; k >= 0; --k) {
    b.Window(uint64_t(k / 32), uint64_t(k % 32), in2.data(), tgt2.data());
    EXPECT_EQ(in2, forward[size_t(k)]) << "step " << k / 32 << " position " << k % 32;
  }
}

TEST(Sampler, DifferentStepsPositionsAndSeedsDiffer) {
  const std::vector<uint16_t> tokens = Iota(5000);
  Sampler s(tokens, 7, 32);
  Sampler other_seed(tokens, 8, 32);
  int step_differs = 0, seed_differs = 0;
  std::set<uint64_t> starts;
  for (uint64_t pos = 0; pos < 64; ++pos) {
    step_differs += s.WindowStart(0, pos) != s.WindowStart(1, pos);
    seed_differs += s.WindowStart(0, pos) != other_seed.WindowStart(0, pos);
    starts.insert(s.WindowStart(0, pos));
  }
  // 4968 possible starts: a chance collision among 64 is rare, several would be a bug.
  EXPECT_GE(step_differs, 62);
  EXPECT_GE(seed_differs, 62);
  EXPECT_GE(starts.size(), 60u);
}

TEST(Sampler, WindowsStayInRangeAndTargetsAreShiftedInputs) {
  const std::vector<uint16_t> tokens = Iota(300);
  const int seq = 100;
  Sampler s(tokens, 1, seq);
  std::vector<int32_t> in(seq), tgt(seq);
  uint64_t lo = UINT64_MAX, hi = 0;
  for (uint64_t pos = 0; pos < 20000; ++pos) {
    const uint64_t start = s.WindowStart(pos % 3, pos);
    ASSERT_LE(start + seq, tokens.size() - 1);
    lo = std::min(lo, start);
    hi = std::max(hi, start);
  }
  EXPECT_EQ(lo, 0u);    // every start is reachable, the last one too
  EXPECT_EQ(hi, 199u);  // n - seq_len - 1
  s.Window(3, 5, in.data(), tgt.data());
  const uint64_t start = s.WindowStart(3, 5);
  for (int i = 0; i < seq; ++i) {
    EXPECT_EQ(in[size_t(i)], tokens[start + size_t(i)]);
    EXPECT_EQ(tgt[size_t(i)], tokens[start + size_t(i) + 1]);
  }
  // The smallest legal file: one window, at 0.
  Sampler tight(std::span<const uint16_t>(tokens.data(), seq + 1), 9, seq);
  for (uint64_t pos = 0; pos < 100; ++pos) EXPECT_EQ(tight.WindowStart(pos, pos), 0u);
}

TEST(Sampler, EvalWindowsAreConsecutiveAndNonOverlapping) {
  const std::vector<uint16_t> tokens = Iota(1000);
  const int seq = 31;  // windows of 32 tokens: 31 full windows, 8 tokens left over
  Sampler s(tokens, 0, seq);
  ASSERT_EQ(s.NumEvalWindows(), 31u);
  std::vector<int32_t> in(seq), tgt(seq);
  std::vector<int32_t> seen;
  for (size_t w = 0; w < s.NumEvalWindows(); ++w) {
    s.EvalWindow(w, in.data(), tgt.data());
    EXPECT_EQ(in[0], tokens[w * 32]);
    for (int i = 0; i + 1 < seq; ++i) EXPECT_EQ(tgt[size_t(i)], in[size_t(i) + 1]);
    seen.push_back(in[0]);
    seen.insert(seen.end(), tgt.begin(), tgt.end());
  }
  // Window w covers exactly tokens [32w, 32w + 32): together the first 992 tokens, in order.
  ASSERT_EQ(seen.size(), 992u);
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], tokens[i]);
}

TEST(SamplerDeathTest, RequiresMoreTokensThanSeqLen) {
  const std::vector<uint16_t> tokens = Iota(10);
  EXPECT_DEATH(Sampler(tokens, 0, 10), "more than seq_len tokens");
}

}  // namespace
}  // namespace atl
