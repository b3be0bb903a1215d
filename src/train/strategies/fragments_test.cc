// Streaming DiLoCo's fragments: every parameter in exactly one fragment, blocks strided across
// the block fragments, the embeddings in fragments of their own sized after their share.
#include "train/strategies/fragments.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace atl {
namespace {

// Which fragment each element is in (-1: none; -2: several).
std::vector<int> Owners(const std::vector<Fragment>& fs, size_t n) {
  std::vector<int> owner(n, -1);
  for (size_t k = 0; k < fs.size(); ++k)
    for (const Range& r : fs[k].ranges)
      for (size_t i = r.begin; i < r.end; ++i) owner[i] = owner[i] == -1 ? int(k) : -2;
  return owner;
}

// The fragment holding block l (all of it), or -1.
int FragmentOfBlock(const GPTConfig& cfg, const std::vector<Fragment>& fs, int l) {
  const std::vector<int> owner = Owners(fs, NumParameters(cfg));
  int f = -3;
  for (const ParamTensor& t : ParameterLayout(cfg)) {
    if (t.layer != l) continue;
    for (size_t i = t.offset; i < t.offset + t.numel; ++i) {
      if (f == -3) f = owner[i];
      if (owner[i] != f) return -1;
    }
  }
  return f;
}

void ExpectPartition(const GPTConfig& cfg, const std::vector<Fragment>& fs) {
  const size_t n = NumParameters(cfg);
  const std::vector<int> owner = Owners(fs, n);
  for (size_t i = 0; i < n; ++i) ASSERT_GE(owner[i], 0) << "element " << i;
  for (const Fragment& f : fs) {
    ASSERT_FALSE(f.ranges.empty());
    for (size_t k = 1; k < f.ranges.size(); ++k)
      EXPECT_LT(f.ranges[k - 1].end, f.ranges[k].begin);  // ascending, disjoint, merged
  }
}

GPTConfig Model(int layers, int embd, int seq) {
  return GPTConfig{
      .vocab_size = 50257, .seq_len = seq, .n_layer = layers, .n_head = 4, .n_embd = embd};
}

TEST(StreamingFragments, Gpt2SmallBlocksStridedEmbeddingsApart) {
  const GPTConfig cfg = Model(12, 768, 1024);  // 31% embeddings: E = 1, B = 3
  const auto fs = StreamingFragments(cfg, 4);
  ASSERT_EQ(fs.size(), 4u);
  ExpectPartition(cfg, fs);
  for (int l = 0; l < 12; ++l) EXPECT_EQ(FragmentOfBlock(cfg, fs, l), l % 3) << "block " << l;
  // wte, wpe and ln_f are fragment 3's alone.
  const std::vector<int> owner = Owners(fs, NumParameters(cfg));
  for (const ParamTensor& t : ParameterLayout(cfg))
    if (t.layer < 0) EXPECT_EQ(owner[t.offset], 3) << t.name;
}

TEST(StreamingFragments, AnEmbeddingHeavyModelCutsItsEmbeddingsInPieces) {
  const GPTConfig cfg = Model(4, 192, 128);  // configs/small.toml: 87% embeddings: E = 3, B = 1
  const auto fs = StreamingFragments(cfg, 4);
  ASSERT_EQ(fs.size(), 4u);
  ExpectPartition(cfg, fs);
  for (int l = 0; l < 4; ++l) EXPECT_EQ(FragmentOfBlock(cfg, fs, l), 0);
  const size_t outside = NumParameters(cfg) - fs[0].size();
  for (int k = 1; k < 4; ++k) EXPECT_NEAR(double(fs[size_t(k)].size()), outside / 3.0, 1.0) << k;
  // No exchange far larger than another: the largest fragment under 2x the smallest.
  size_t lo = SIZE_MAX, hi = 0;
  for (const Fragment& f : fs) {
    lo = std::min(lo, f.size());
    hi = std::max(hi, f.size());
  }
  EXPECT_LT(hi, 2 * lo);
}

TEST(StreamingFragments, MoreFragmentsThanBlocksGoToTheEmbeddings) {
  const GPTConfig cfg = Model(2, 64, 64);  // configs/world-demo.toml with P = 3
  const auto fs = StreamingFragments(cfg, 3);
  ASSERT_EQ(fs.size(), 3u);
  ExpectPartition(cfg, fs);
  EXPECT_EQ(FragmentOfBlock(cfg, fs, 0), 0);
  EXPECT_EQ(FragmentOfBlock(cfg, fs, 1), 0);
  // A model of two big blocks and a small vocabulary: E = 1 by share, B = 7 capped at the two
  // blocks, so the other five fragments are embedding pieces.
  GPTConfig blocky = Model(2, 256, 64);
  blocky.vocab_size = 128;
  const auto many = StreamingFragments(blocky, 8);
  ASSERT_EQ(many.size(), 8u);
  ExpectPartition(blocky, many);
  EXPECT_EQ(FragmentOfBlock(blocky, many, 0), 0);
  EXPECT_EQ(FragmentOfBlock(blocky, many, 1), 1);
}

TEST(StreamingFragments, OneFragmentIsTheWholeModel) {
  const GPTConfig cfg = Model(2, 64, 64);
  const auto fs = StreamingFragments(cfg, 1);
  ASSERT_EQ(fs.size(), 1u);
  ASSERT_EQ(fs[0].ranges.size(), 1u);
  EXPECT_EQ(fs[0].ranges[0].begin, 0u);
  EXPECT_EQ(fs[0].ranges[0].end, NumParameters(cfg));
}

TEST(Fragment, GatherScatterRoundTrip) {
  Fragment f;
  f.ranges = {{2, 4}, {7, 10}};
  std::vector<float> flat(12);
  std::iota(flat.begin(), flat.end(), 0.0f);
  std::vector<float> packed(f.size());
  Gather(f, flat.data(), packed.data());
  EXPECT_EQ(packed, (std::vector<float>{2, 3, 7, 8, 9}));
  for (float& x : packed) x = -x;
  Scatter(f, packed.data(), flat.data());
  EXPECT_EQ(flat, (std::vector<float>{0, 1, -2, -3, 4, 5, 6, -7, -8, -9, 10, 11}));
}

TEST(SplitEvenly, CoversEverythingInOrder) {
  const auto r = SplitEvenly(10, 4);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].begin, 0u);
  EXPECT_EQ(r[0].end, 3u);
  EXPECT_EQ(r[1].end, 6u);
  EXPECT_EQ(r[2].end, 8u);
  EXPECT_EQ(r[3].end, 10u);
}

}  // namespace
}  // namespace atl
