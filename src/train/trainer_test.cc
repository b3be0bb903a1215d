// The trainer on synthetic token files and a small model: determinism across runs and thread
// counts, resume, gradient accumulation, validation, evaluation, and bad data.
#include "train/trainer.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "comm/inprocess.h"
#include "core/file.h"
#include "core/rng.h"
#include "data/dataset.h"
#include "train/evaluate.h"
#include "train/test_util.h"

namespace atl {
namespace {

namespace fs = std::filesystem;

TEST_F(TrainerTest, LearnsAndWritesMetricsConfigAndCheckpoint) {
  const std::string out = Run(cfg_, "run");
  auto m = Metrics(out);
  ASSERT_EQ(m.size(), 12u);
  for (size_t i = 0; i < m.size(); ++i) {
    EXPECT_EQ(m[i]["step"], int(i + 1));
    EXPECT_EQ(m[i]["tokens"], int((i + 1) * 4 * 16));
    for (const char* k : {"loss", "lr", "grad_norm", "tokens_per_s", "step_ms"})
      EXPECT_TRUE(m[i].contains(k)) << k;
    EXPECT_EQ(m[i].contains("val_loss"), i + 1 == 5 || i + 1 == 10 || i + 1 == 12) << i;
  }
  EXPECT_LT(m.back()["loss"].get<double>(), m.front()["loss"].get<double>() - 0.5);
  EXPECT_LT(m[11]["val_loss"].get<double>(), m[4]["val_loss"].get<double>());
  EXPECT_DOUBLE_EQ(m.back()["lr"].get<double>(), 1e-3);
  auto ck = LoadCheckpoint(out + "/checkpoint", true);
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_EQ(ck->cursor.next_step, 12);
  EXPECT_EQ(ck->optimizer_steps, 12);
  EXPECT_EQ(ck->config, cfg_);
  auto toml = LoadRunConfig(out + "/config.toml", {});
  ASSERT_TRUE(toml.ok()) << toml.status().ToString();
  EXPECT_EQ(*toml, cfg_);
}

TEST_F(TrainerTest, SameSeedSameBitsAndThreadCountDoesNotMatter) {
  RunConfig one = cfg_, two = cfg_;
  one.train.threads = 1;
  two.train.threads = 2;
  const std::string a = Run(one, "a"), b = Run(two, "b"), c = Run(two, "c");
  EXPECT_EQ(LossColumns(a), LossColumns(b));
  EXPECT_EQ(LossColumns(b), LossColumns(c));
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    EXPECT_EQ(Bytes(a + "/checkpoint/" + f), Bytes(b + "/checkpoint/" + f)) << f;
    EXPECT_EQ(Bytes(b + "/checkpoint/" + f), Bytes(c + "/checkpoint/" + f)) << f;
  }
  RunConfig other = cfg_;
  other.train.seed = 10;
  EXPECT_NE(LossColumns(Run(other, "d")), LossColumns(a));
}

TEST_F(TrainerTest, ResumingGivesTheSameBitsAsNotStopping) {
  RunConfig periodic = cfg_;
  periodic.train.checkpoint_every = 4;
  const std::string full = Run(periodic, "full");
  EXPECT_TRUE(FileExists(full + "/checkpoint-4"));
  EXPECT_TRUE(FileExists(full + "/checkpoint-8"));
  EXPECT_TRUE(FileExists(full + "/checkpoint-12"));
  for (int k : {4, 8}) {
    auto ck = LoadCheckpoint(fmt::format("{}/checkpoint-{}", full, k), true);
    ASSERT_TRUE(ck.ok()) << ck.status().ToString();
    EXPECT_EQ(ck->cursor.next_step, k);
    const std::string resumed = Run(periodic, fmt::format("resumed{}", k), &*ck);
    for (const char* f : {"model.safetensors", "optimizer.safetensors", "manifest.json"})
      EXPECT_EQ(Bytes(full + "/checkpoint/" + f), Bytes(resumed + "/checkpoint/" + f)) << f << k;
    auto all = LossColumns(full), rest = LossColumns(resumed);
    ASSERT_EQ(rest.size(), size_t(12 - k));
    EXPECT_TRUE(std::equal(rest.begin(), rest.end(), all.begin() + k));
  }
  // Resuming into the run's own directory keeps the metrics before the checkpoint.
  auto ck = LoadCheckpoint(full + "/checkpoint-8", true);
  ASSERT_TRUE(ck.ok());
  const auto before = LossColumns(full);
  Run(periodic, "full", &*ck);
  EXPECT_EQ(LossColumns(full), before);
}

// train.checkpoint_every = -1 (benchmarks): no checkpoint at all, not even the final one, and
// Train says so with an empty path; the metrics are written as ever.
TEST_F(TrainerTest, CheckpointEveryMinusOneWritesNone) {
  RunConfig none = cfg_;
  none.train.checkpoint_every = -1;
  auto r = TryRun(none, "none");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "");
  EXPECT_FALSE(FileExists(root_ + "/none/checkpoint"));
  EXPECT_EQ(LossColumns(root_ + "/none").size(), size_t(none.train.steps));
  EXPECT_EQ(LossColumns(root_ + "/none"), LossColumns(Run(cfg_, "final")));
  EXPECT_TRUE(FileExists(root_ + "/final/checkpoint/manifest.json"));
}

TEST_F(TrainerTest, ResumeRefusesADifferentModelOrChangedData) {
  const std::string out = Run(cfg_, "run");
  auto ck = LoadCheckpoint(out + "/checkpoint", true);
  ASSERT_TRUE(ck.ok());
  RunConfig wider = cfg_;
  wider.model.n_embd = 32;
  TrainOptions o;
  o.out_dir = root_ + "/x";
  o.resume = &*ck;
  o.progress = false;
  auto r = Train(wider, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().ExitCode(), 2);
  EXPECT_NE(r.status().message().find("model.n_embd is 16 in the checkpoint but 32"),
            std::string::npos)
      << r.status().message();
  ASSERT_TRUE(WriteTokenFile(data_ + "/train.bin", SyntheticTokens(20000, 3)).ok());
  r = Train(cfg_, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("data changed"), std::string::npos) << r.status().message();
}

TEST_F(TrainerTest, AccumulationMatchesOneBigMicroBatch) {
  // batch 4 as 2 x 2 and as 1 x 4: the same gradient up to float rounding.
  RunConfig big = cfg_;
  big.train.micro_batch_size = 4;
  big.train.steps = 1;
  RunConfig small = cfg_;
  small.train.steps = 1;
  const auto a = Metrics(Run(big, "big")), b = Metrics(Run(small, "small"));
  EXPECT_NEAR(a[0]["loss"].get<double>(), b[0]["loss"].get<double>(), 1e-5);
  EXPECT_NEAR(a[0]["grad_norm"].get<double>(), b[0]["grad_norm"].get<double>(),
              1e-5 * a[0]["grad_norm"].get<double>());
}

TEST_F(TrainerTest, MissingOrUnusableDataIsBadInputWithAHint) {
  RunConfig c = cfg_;
  c.data.dir = root_ + "/nodata";
  TrainOptions o;
  o.out_dir = root_ + "/x";
  o.progress = false;
  auto r = Train(c, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().ExitCode(), 2);
  EXPECT_NE(r.status().message().find("atoll data prepare"), std::string::npos);
  // Tokens the model has no embedding for.
  c.data.dir = data_;
  c.model.vocab_size = 32;
  r = Train(c, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("vocab_size"), std::string::npos);
  // Too few tokens for one window.
  ASSERT_TRUE(WriteTokenFile(data_ + "/val.bin", std::vector<uint16_t>(10, 1)).ok());
  r = Train(cfg_, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("val.bin"), std::string::npos);
}

// Two sites of two ranks each (in-process ranks: the sites' MPI worlds and the leaders' WAN are
// Split from one group) train the single-process model: hierarchical sum every step.
TEST_F(TrainerTest, TwoSitesSyncMatchTheSingleProcess) {
  RunConfig one = cfg_;
  one.train.micro_batch_size = 1;
  one.train.threads = 1;
  const std::string ref = Run(one, "one");
  RunConfig world = one;
  world.world.sites = 2;
  world.world.ranks_per_site = 2;
  world.parallel.dp = 2;
  ASSERT_TRUE(ValidateRunConfig(world).ok());
  const std::string wroot = root_ + "/world";
  const auto statuses = RunInProcessRanks(4, [&](Communicator& all) -> Status {
    const int site = all.rank() / 2;
    ATOLL_ASSIGN_OR_RETURN(auto site_comm, all.Split(site, all.rank()));
    ATOLL_ASSIGN_OR_RETURN(auto wan,
                           all.Split(site_comm->rank() == 0 ? 0 : Communicator::kNoGroup, site));
    TrainOptions o;
    o.out_dir = fmt::format("{}/site-{}", wroot, site);
    o.checkpoint_dir = wroot;
    o.progress = false;
    o.comm = site_comm.get();
    o.world.site = site;
    o.world.wan = wan.get();
    return Train(world, o).status();
  });
  for (const Status& st : statuses) ASSERT_TRUE(st.ok()) << st.ToString();
  for (int site = 0; site < 2; ++site) {
    const auto a = Metrics(ref), b = Metrics(fmt::format("{}/site-{}", wroot, site));
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_NEAR(b[i]["loss"].get<double>(), a[i]["loss"].get<double>(),
                  1e-5 * a[i]["loss"].get<double>())
          << "site " << site << " step " << i + 1;
      EXPECT_EQ(b[i]["site"].get<int>(), site);
      EXPECT_TRUE(b[i].contains("wan_ms"));
      // Only site 0 validates.
      EXPECT_EQ(b[i].contains("val_loss"), site == 0 && a[i].contains("val_loss"));
    }
  }
  EXPECT_TRUE(FileExists(wroot + "/checkpoint/model.safetensors"));
}

TEST(EvalLoss, DoesNotDependOnTheBatchSplitAndGradientsAreOfTheMean) {
  GPTConfig cfg{.vocab_size = 64, .seq_len = 8, .n_layer = 1, .n_head = 2, .n_embd = 8};
  const std::vector<uint16_t> tokens = SyntheticTokens(9 * 7 + 3, 4);  // 7 windows + a tail
  Sampler sampler(tokens, 0, 8);
  ASSERT_EQ(sampler.NumEvalWindows(), 7u);
  GPT<double> one(cfg, 1), three(cfg, 3), seven(cfg, 7);
  for (GPT<double>* m : {&one, &three, &seven}) m->InitParameters(1);
  const double l1 = EvalLoss(one, sampler, 7, 1, true);
  const double l3 = EvalLoss(three, sampler, 7, 3, true);
  const double l7 = EvalLoss(seven, sampler, 7, 7, true);
  EXPECT_NEAR(l1, l7, 1e-13);
  EXPECT_NEAR(l3, l7, 1e-13);
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < seven.num_params(); ++i) {
    max_diff = std::max({max_diff, std::abs(one.grads()[i] - seven.grads()[i]),
                         std::abs(three.grads()[i] - seven.grads()[i])});
    max_abs = std::max(max_abs, std::abs(seven.grads()[i]));
  }
  EXPECT_LT(max_diff, 1e-12 * std::max(1.0, max_abs));
  EXPECT_GT(max_abs, 0.0);
}

}  // namespace
}  // namespace atl
