// The state a sync site's new process takes over (train/strategies/sync_state.h): what is
// encoded comes back bit for bit, and bytes that are not such a state (another model, cut short,
// a stray blob) are refused rather than trained from.
#include "train/strategies/sync_state.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace atl {
namespace {

TEST(SyncState, RoundTripsBitForBit) {
  const std::vector<float> params = {1.5f, -0.0f, std::nanf(""), 3e-39f};
  const std::vector<float> m = {0.25f, -2.0f}, v = {1e-30f, 7.0f};
  const std::string bytes = EncodeSyncState(12, 12, 3, {0, 2}, params, m, v);
  auto st = DecodeSyncState(bytes, params.size(), m.size(), 3);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->step, 12);
  EXPECT_EQ(st->optimizer_steps, 12);
  EXPECT_EQ(st->generation, 3);
  EXPECT_EQ(st->live, (std::vector<int>{0, 2}));
  ASSERT_EQ(st->params.size(), params.size());
  EXPECT_EQ(std::memcmp(st->params.data(), params.data(), params.size() * 4), 0);
  EXPECT_EQ(std::memcmp(st->m.data(), m.data(), m.size() * 4), 0);
  EXPECT_EQ(std::memcmp(st->v.data(), v.data(), v.size() * 4), 0);
}

TEST(SyncState, RefusesWhatIsNotAStateOfThisModel) {
  const std::vector<float> params(10, 1.0f), m(10, 0.5f), v(10, 0.25f);
  const std::string bytes = EncodeSyncState(4, 4, 1, {1}, params, m, v);
  auto corrupt = [](const StatusOr<SyncState>& st) {
    return !st.ok() && st.status().code() == StatusCode::kCorruption;
  };
  EXPECT_TRUE(corrupt(DecodeSyncState(bytes, 11, 10, 3)));  // another model
  EXPECT_TRUE(corrupt(DecodeSyncState(bytes, 10, 9, 3)));   // another optimizer layout (ZeRO)
  EXPECT_TRUE(corrupt(DecodeSyncState(bytes.substr(0, bytes.size() - 4), 10, 10, 3)));
  EXPECT_TRUE(corrupt(DecodeSyncState(bytes + "x", 10, 10, 3)));
  EXPECT_TRUE(corrupt(DecodeSyncState(bytes.substr(0, 20), 10, 10, 3)));
  std::string other = bytes;
  other[0] = 'X';  // e.g. a diloco state published under the same index
  EXPECT_TRUE(corrupt(DecodeSyncState(other, 10, 10, 3)));
  EXPECT_TRUE(corrupt(DecodeSyncState("", 10, 10, 3)));
  // Live sites that do not fit the world (found by review: a served state's list was copied
  // into a buffer of world.sites entries).
  EXPECT_TRUE(corrupt(DecodeSyncState(bytes, 10, 10, 1)));  // site 1 in a world of one site
  for (const std::vector<int>& live : {std::vector<int>{2, 1}, {0, 0}, {-1}, {0, 1, 2, 3}})
    EXPECT_TRUE(corrupt(DecodeSyncState(EncodeSyncState(4, 4, 1, live, params, m, v), 10, 10, 3)))
        << live.size();
}

}  // namespace
}  // namespace atl
