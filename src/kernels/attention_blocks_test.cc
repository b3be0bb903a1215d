// kernels/attention_blocks.h: the block-row settings the benchmarks and the GPU backend take.
#include "kernels/attention_blocks.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace atl::kernels {
namespace {

TEST(AttentionBlockRows, ParsesQueryAndKeyRows) {
  AttentionBlockRows r;
  ASSERT_TRUE(ParseAttentionBlockRows("128/64", &r));
  EXPECT_EQ(r.query, 128);
  EXPECT_EQ(r.key, 64);
  ASSERT_TRUE(ParseAttentionBlockRows("64/128", &r));
  EXPECT_EQ(r.query, 64);
  EXPECT_EQ(r.key, 128);
  ASSERT_TRUE(ParseAttentionBlockRows("128", &r));  // Q alone: key rows 64
  EXPECT_EQ(r.query, 128);
  EXPECT_EQ(r.key, 64);
  EXPECT_EQ(ToString(r), "128/64");
  const AttentionBlockRows defaults;
  EXPECT_EQ(ToString(defaults), "64/64");
}

TEST(AttentionBlockRows, RefusesAnythingElseAndLeavesTheOutputAlone) {
  for (const char* bad : {"", "/", "64/", "/64", "64/64/64", "96", "64/32", "256/64", "0128",
                          "64 /64", "-64", "64/128x", "x"}) {
    AttentionBlockRows r{128, 128};
    EXPECT_FALSE(ParseAttentionBlockRows(bad, &r)) << "'" << bad << "'";
    EXPECT_EQ(r.query, 128) << bad;
    EXPECT_EQ(r.key, 128) << bad;
  }
  EXPECT_THROW(CheckAttentionBlockRows({96, 64}), std::invalid_argument);
  EXPECT_THROW(CheckAttentionBlockRows({64, 0}), std::invalid_argument);
  EXPECT_NO_THROW(CheckAttentionBlockRows({128, 128}));
}

// train.attention_rows = auto's choice from the settings' times (kAttentionBlockRowsAll's order:
// 64/64, 128/64, 64/128, 128/128): the fastest when it beats the default by over 2%, the default
// otherwise (and when the times are not one a setting).
TEST(AttentionBlockRows, ChoosesTheFastestUnlessTheDefaultIsWithinTwoPercent) {
  EXPECT_EQ(ToString(ChooseAttentionBlockRows({1.0, 0.9, 0.95, 0.97})), "128/64");
  EXPECT_EQ(ToString(ChooseAttentionBlockRows({1.0, 0.99, 0.95, 0.90})), "128/128");
  EXPECT_EQ(ToString(ChooseAttentionBlockRows({1.0, 1.1, 0.97, 1.2})), "64/128");
  EXPECT_EQ(ToString(ChooseAttentionBlockRows({1.0, 0.985, 0.99, 1.2})), "64/64");  // noise
  EXPECT_EQ(ToString(ChooseAttentionBlockRows({0.5, 0.9, 0.95, 0.97})), "64/64");
  EXPECT_EQ(ToString(ChooseAttentionBlockRows({})), "64/64");
  EXPECT_EQ(ToString(ChooseAttentionBlockRows({1.0, 0.5})), "64/64");
  EXPECT_EQ(DescribeAttentionTimes({1e-3, 2.5e-4, 0.0123, 1}),
            "64/64 1.000, 128/64 0.250, 64/128 12.300, 128/128 1000.000");
}

TEST(AttentionBackwardKind, ParsesSplitAndFusedOnly) {
  AttentionBackwardKind b = AttentionBackwardKind::kSplit;
  ASSERT_TRUE(ParseAttentionBackwardKind("fused", &b));
  EXPECT_EQ(b, AttentionBackwardKind::kFused);
  EXPECT_STREQ(ToString(b), "fused");
  ASSERT_TRUE(ParseAttentionBackwardKind("split", &b));
  EXPECT_EQ(b, AttentionBackwardKind::kSplit);
  EXPECT_STREQ(ToString(b), "split");
  for (const char* bad : {"", "Fused", "fused ", "fuse", "single", "splitfused"}) {
    AttentionBackwardKind out = AttentionBackwardKind::kFused;
    EXPECT_FALSE(ParseAttentionBackwardKind(bad, &out)) << "'" << bad << "'";
    EXPECT_EQ(out, AttentionBackwardKind::kFused) << bad;
  }
}

}  // namespace
}  // namespace atl::kernels
