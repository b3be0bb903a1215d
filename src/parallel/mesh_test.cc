// The mesh over in-process ranks: every rank's coordinates, and every group's members and order
// checked by collectives on the group itself (an all-gather of world ranks, an all-reduce of
// their sum) against the layout computed by hand.
#include "parallel/mesh.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <set>
#include <span>
#include <tuple>
#include <vector>

#include "comm/inprocess.h"

namespace atl {
namespace {

void ExpectAllOk(int n, const std::function<Status(Communicator&)>& fn) {
  auto st = RunInProcessRanks(n, fn);
  for (int r = 0; r < n; ++r) EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].ToString();
}

// Checks that `g` holds exactly the world ranks `want`, in that order (its rank order), that this
// rank is at position `pos`, and that a sum over the group adds up those ranks.
Status ExpectGroup(const char* what, Communicator* g, int world_rank,
                   const std::vector<int64_t>& want, int pos) {
  SCOPED_TRACE(fmt::format("{} group of world rank {}", what, world_rank));
  if (want.size() <= 1) {
    EXPECT_EQ(g, nullptr);  // a group of one is null
    return Status::Ok();
  }
  EXPECT_NE(g, nullptr);
  if (g == nullptr) return Status::Ok();
  EXPECT_EQ(g->size(), int(want.size()));
  EXPECT_EQ(g->rank(), pos);
  const int64_t mine = world_rank;
  std::vector<int64_t> all(size_t(g->size()));
  ATOLL_RETURN_IF_ERROR(g->AllGather(std::span<const int64_t>(&mine, 1), std::span<int64_t>(all)));
  EXPECT_EQ(all, want);
  int64_t sum = world_rank, want_sum = 0;
  for (int64_t r : want) want_sum += r;
  ATOLL_RETURN_IF_ERROR(g->AllReduce(std::span<int64_t>(&sum, 1)));
  EXPECT_EQ(sum, want_sum);
  return Status::Ok();
}

// Builds the mesh on dp*tp*pp ranks and checks everything against the documented layout.
void CheckMesh(int dp, int tp, int pp) {
  SCOPED_TRACE(fmt::format("dp {} tp {} pp {}", dp, tp, pp));
  const int n = dp * tp * pp;
  auto rank_of = [&](int d, int t, int p) { return int64_t{(p * dp + d) * tp + t}; };
  ExpectAllOk(n, [&](Communicator& world) -> Status {
    ATOLL_ASSIGN_OR_RETURN(Mesh m, Mesh::Make(&world, dp, tp, pp));
    EXPECT_EQ(m.world(), &world);
    EXPECT_EQ(m.dp(), dp);
    EXPECT_EQ(m.tp(), tp);
    EXPECT_EQ(m.pp(), pp);
    EXPECT_EQ(m.size(), n);
    EXPECT_EQ(m.rank(), world.rank());
    const int d = m.dp_rank(), t = m.tp_rank(), p = m.pp_rank();
    EXPECT_TRUE(d >= 0 && d < dp && t >= 0 && t < tp && p >= 0 && p < pp);
    EXPECT_EQ(m.RankOf(d, t, p), world.rank());
    EXPECT_EQ(rank_of(d, t, p), world.rank());
    EXPECT_EQ(m.first_stage(), p == 0);
    EXPECT_EQ(m.last_stage(), p == pp - 1);

    // Coordinates are distinct across ranks: gathered over the world, each triple appears once.
    const int64_t coords[3] = {d, t, p};
    std::vector<int64_t> all(size_t(3 * n));
    ATOLL_RETURN_IF_ERROR(
        world.AllGather(std::span<const int64_t>(coords, 3), std::span<int64_t>(all)));
    std::set<std::tuple<int64_t, int64_t, int64_t>> seen;
    for (int r = 0; r < n; ++r) seen.insert({all[3 * r], all[3 * r + 1], all[3 * r + 2]});
    EXPECT_EQ(int(seen.size()), n);

    std::vector<int64_t> tp_want, dp_want, pp_want, embed_want;
    for (int i = 0; i < tp; ++i) tp_want.push_back(rank_of(d, i, p));
    for (int i = 0; i < dp; ++i) dp_want.push_back(rank_of(i, t, p));
    for (int i = 0; i < pp; ++i) pp_want.push_back(rank_of(d, t, i));
    ATOLL_RETURN_IF_ERROR(ExpectGroup("tp", m.tp_group(), world.rank(), tp_want, t));
    ATOLL_RETURN_IF_ERROR(ExpectGroup("dp", m.dp_group(), world.rank(), dp_want, d));
    ATOLL_RETURN_IF_ERROR(ExpectGroup("pp", m.pp_group(), world.rank(), pp_want, p));
    if (pp > 1 && (m.first_stage() || m.last_stage())) {
      embed_want = {rank_of(d, t, 0), rank_of(d, t, pp - 1)};
      ATOLL_RETURN_IF_ERROR(
          ExpectGroup("embed", m.embed_group(), world.rank(), embed_want, m.first_stage() ? 0 : 1));
    } else {
      EXPECT_EQ(m.embed_group(), nullptr) << m.Describe();
    }
    return Status::Ok();
  });
}

TEST(Mesh, EveryShapeOfUpToTwelveRanks) {
  for (int dp = 1; dp <= 3; ++dp)
    for (int tp = 1; tp <= 3; ++tp)
      for (int pp = 1; pp <= 4; ++pp)
        if (dp * tp * pp <= 12) CheckMesh(dp, tp, pp);
}

// dp2 x tp2 x pp2, values written out: tensor-parallel ranks are neighbours, then replicas, then
// stages.
TEST(Mesh, TwoByTwoByTwoByHand) {
  ExpectAllOk(8, [](Communicator& world) -> Status {
    ATOLL_ASSIGN_OR_RETURN(Mesh m, Mesh::Make(&world, 2, 2, 2));
    const int r = world.rank();
    EXPECT_EQ(m.tp_rank(), r % 2);
    EXPECT_EQ(m.dp_rank(), (r / 2) % 2);
    EXPECT_EQ(m.pp_rank(), r / 4);
    if (r == 5) {
      EXPECT_EQ(m.Describe(), "dp 0/2 tp 1/2 pp 1/2 (rank 5)");
    } else if (r == 6) {
      EXPECT_EQ(m.Describe(), "dp 1/2 tp 0/2 pp 1/2 (rank 6)");
    }
    // Sums of the world ranks over each group: tp {4,5} for rank 5, dp {5,7}, pp {1,5}.
    int64_t x[4] = {r, r, r, r};
    ATOLL_RETURN_IF_ERROR(m.tp_group()->AllReduce(std::span<int64_t>(&x[0], 1)));
    ATOLL_RETURN_IF_ERROR(m.dp_group()->AllReduce(std::span<int64_t>(&x[1], 1)));
    ATOLL_RETURN_IF_ERROR(m.pp_group()->AllReduce(std::span<int64_t>(&x[2], 1)));
    ATOLL_RETURN_IF_ERROR(m.embed_group()->AllReduce(std::span<int64_t>(&x[3], 1)));
    const int64_t tp_sum[8] = {1, 1, 5, 5, 9, 9, 13, 13};
    const int64_t dp_sum[8] = {2, 4, 2, 4, 10, 12, 10, 12};
    const int64_t pp_sum[8] = {4, 6, 8, 10, 4, 6, 8, 10};
    EXPECT_EQ(x[0], tp_sum[r]);
    EXPECT_EQ(x[1], dp_sum[r]);
    EXPECT_EQ(x[2], pp_sum[r]);
    EXPECT_EQ(x[3], pp_sum[r]);  // two stages: the embedding group is the pipeline group
    EXPECT_EQ(m.embed_group()->rank(), m.pp_rank());
    return Status::Ok();
  });
}

// With four stages only the ends share the tied embedding; the middle stages have no group.
TEST(Mesh, EmbeddingGroupJoinsFirstAndLastStageOnly) {
  ExpectAllOk(8, [](Communicator& world) -> Status {
    ATOLL_ASSIGN_OR_RETURN(Mesh m, Mesh::Make(&world, 2, 1, 4));
    const int r = world.rank();
    EXPECT_EQ(m.tp_group(), nullptr);
    EXPECT_EQ(m.embed_group() != nullptr, r < 2 || r >= 6) << m.Describe();
    if (m.embed_group() != nullptr) {
      int64_t x = r;
      ATOLL_RETURN_IF_ERROR(m.embed_group()->AllReduce(std::span<int64_t>(&x, 1)));
      EXPECT_EQ(x, r % 2 == 0 ? 0 + 6 : 1 + 7);
      EXPECT_EQ(m.embed_group()->rank(), m.first_stage() ? 0 : 1);
    }
    return Status::Ok();
  });
}

TEST(Mesh, SingleProcessWithoutAWorld) {
  auto m = Mesh::Make(nullptr, 1, 1, 1);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->world(), nullptr);
  EXPECT_EQ(m->size(), 1);
  EXPECT_EQ(m->rank(), 0);
  EXPECT_TRUE(m->first_stage());
  EXPECT_TRUE(m->last_stage());
  EXPECT_EQ(m->dp_group(), nullptr);
  EXPECT_EQ(m->tp_group(), nullptr);
  EXPECT_EQ(m->pp_group(), nullptr);
  EXPECT_EQ(m->embed_group(), nullptr);
  EXPECT_EQ(m->Describe(), "dp 0/1 tp 0/1 pp 0/1 (rank 0)");

  const Mesh d;  // the default is the same single process
  EXPECT_EQ(d.size(), 1);
  EXPECT_EQ(d.Describe(), m->Describe());
  EXPECT_EQ(d.embed_group(), nullptr);
}

TEST(Mesh, WorldOfOneRank) {
  ExpectAllOk(1, [](Communicator& world) -> Status {
    ATOLL_ASSIGN_OR_RETURN(Mesh m, Mesh::Make(&world, 1, 1, 1));
    EXPECT_EQ(m.world(), &world);
    EXPECT_EQ(m.dp_group(), nullptr);
    EXPECT_EQ(m.embed_group(), nullptr);
    return Status::Ok();
  });
}

TEST(Mesh, DegreesBelowOneAreInvalid) {
  for (auto [dp, tp, pp] : {std::tuple{0, 1, 1}, {1, 0, 1}, {1, 1, 0}, {-1, -1, 1}}) {
    auto m = Mesh::Make(nullptr, dp, tp, pp);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find(">= 1"), std::string::npos) << m.status().message();
  }
}

TEST(Mesh, DegreesMustMultiplyToTheWorldSize) {
  // Every rank fails alike, before any collective, so none is left waiting for the others.
  auto st = RunInProcessRanks(
      4, [](Communicator& world) -> Status { return Mesh::Make(&world, 2, 2, 2).status(); });
  for (const Status& s : st) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("= 8 ranks, but the world has 4"), std::string::npos) << s.message();
  }
  auto m = Mesh::Make(nullptr, 2, 1, 1);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("no world"), std::string::npos) << m.status().message();
  // 641 * 6700417 = 2^32 + 1: in 32-bit arithmetic it would wrap around to a world of one.
  EXPECT_FALSE(Mesh::Make(nullptr, 641, 6700417, 1).ok());
}

// Moving a mesh moves its groups: they keep working from the new object.
TEST(Mesh, MovedMeshKeepsItsGroups) {
  ExpectAllOk(4, [](Communicator& world) -> Status {
    ATOLL_ASSIGN_OR_RETURN(Mesh a, Mesh::Make(&world, 2, 2, 1));
    Communicator* tp = a.tp_group();
    Mesh b = std::move(a);
    Mesh c;
    c = std::move(b);
    EXPECT_EQ(c.tp_group(), tp);
    EXPECT_EQ(c.rank(), world.rank());
    int64_t x = world.rank();
    ATOLL_RETURN_IF_ERROR(c.dp_group()->AllReduce(std::span<int64_t>(&x, 1)));
    EXPECT_EQ(x, world.rank() % 2 == 0 ? 0 + 2 : 1 + 3);
    return Status::Ok();
  });
}

}  // namespace
}  // namespace atl
