// Replica fingerprints: a flipped bit changes exactly its tensor's hash, the odd replica out is
// named by every replica, and two replicas that disagree are both named.
#include "train/sdc/fingerprint.h"

#include <gtest/gtest.h>

#include <mutex>

#include "comm/inprocess.h"
#include "train/sdc/faults.h"

namespace atl {
namespace {

GPTConfig Tiny() {
  return {.vocab_size = 32, .seq_len = 8, .n_layer = 2, .n_head = 2, .n_embd = 8};
}

TEST(Fingerprints, AFlippedBitChangesOnlyItsTensor) {
  const auto layout = ParameterLayout(Tiny());
  std::vector<float> p(layout.back().offset + layout.back().numel, 0.5f);
  const auto clean = TensorFingerprints(layout, p.data());
  ASSERT_EQ(clean.size(), layout.size());
  for (size_t t : {size_t(0), size_t(5), layout.size() - 1}) {
    std::vector<float> q = p;
    FlipBit(&q[layout[t].offset + layout[t].numel - 1], 0);  // the lowest mantissa bit
    const auto got = TensorFingerprints(layout, q.data());
    for (size_t u = 0; u < layout.size(); ++u)
      EXPECT_EQ(got[u] != clean[u], u == t) << t << " " << u;
  }
}

TEST(Fingerprints, MismatchesNameTheOddReplicaOrBothOfTwo) {
  EXPECT_TRUE(FindMismatches({{1, 2, 3}, {1, 2, 3}, {1, 2, 3}}).empty());
  EXPECT_TRUE(FindMismatches({{1, 2, 3}}).empty());
  auto m = FindMismatches({{1, 2, 3}, {1, 9, 3}, {1, 2, 3}});
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].replica, 1);
  EXPECT_EQ(m[0].tensor, 1u);
  EXPECT_TRUE(m[0].has_majority);
  m = FindMismatches({{1, 2}, {1, 7}});
  ASSERT_EQ(m.size(), 2u);
  EXPECT_FALSE(m[0].has_majority);
  EXPECT_EQ(m[0].replica, 0);
  EXPECT_EQ(m[1].replica, 1);
  // Four replicas split two and two: no majority, all four named.
  EXPECT_EQ(FindMismatches({{1}, {1}, {2}, {2}}).size(), 4u);
}

TEST(Fingerprints, EveryReplicaLearnsWhichOneIsCorrupt) {
  const auto layout = ParameterLayout(Tiny());
  const size_t n = layout.back().offset + layout.back().numel;
  std::mutex mu;
  std::vector<std::vector<FingerprintMismatch>> seen(4);
  auto st = RunInProcessRanks(4, [&](Communicator& c) -> Status {
    std::vector<float> p(n, 0.25f);
    if (c.rank() == 2) FlipBit(&p[layout[7].offset], 30);
    ATOLL_ASSIGN_OR_RETURN(auto m, CompareFingerprints(c, TensorFingerprints(layout, p.data())));
    std::lock_guard<std::mutex> l(mu);
    seen[size_t(c.rank())] = m;
    return Status::Ok();
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.ToString();
  for (const auto& m : seen) {
    ASSERT_EQ(m.size(), 1u);
    EXPECT_EQ(m[0].replica, 2);
    EXPECT_EQ(m[0].tensor, 7u);
  }
}

}  // namespace
}  // namespace atl
