// Helpers shared by the training tests (header-only): synthetic token files, a small model's
// config, and a fixture that trains into a fresh directory and reads the metrics back.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "comm/inprocess.h"
#include "core/file.h"
#include "core/rng.h"
#include "data/dataset.h"
#include "train/trainer.h"

namespace atl {

// A token stream with structure to learn: repeating phrases with some noise.
inline std::vector<uint16_t> SyntheticTokens(size_t n, uint64_t seed) {
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = RandomBits(seed, 0, RngPurpose::kTest, i);
    t[i] = (r % 8 == 0) ? uint16_t(r % 64) : uint16_t((i * 7) % 23);
  }
  return t;
}

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = ::testing::TempDir() + "/" + info->test_suite_name() + "_" + info->name();
    std::filesystem::remove_all(root_);
    data_ = root_ + "/data";
    ASSERT_TRUE(MakeDirs(data_).ok());
    ASSERT_TRUE(WriteTokenFile(data_ + "/train.bin", SyntheticTokens(20000, 1)).ok());
    ASSERT_TRUE(WriteTokenFile(data_ + "/val.bin", SyntheticTokens(2000, 2)).ok());
    cfg_.model = {.vocab_size = 64, .seq_len = 16, .n_layer = 2, .n_head = 2, .n_embd = 16};
    cfg_.train.steps = 12;
    cfg_.train.batch_size = 4;
    cfg_.train.micro_batch_size = 2;
    cfg_.train.warmup_steps = 3;
    cfg_.train.lr = 1e-2;
    cfg_.train.min_lr = 1e-3;
    cfg_.train.eval_every = 5;
    cfg_.train.eval_batches = 2;
    cfg_.train.seed = 9;
    cfg_.data.dir = data_;
  }
  void TearDown() override {
    std::filesystem::remove_all(root_);
    omp_set_num_threads(omp_get_num_procs());
  }

  // Trains into root_/name and returns what Train returned (a run that is meant to fail).
  StatusOr<std::string> TryRun(const RunConfig& cfg, const std::string& name,
                               const Checkpoint* resume = nullptr) {
    TrainOptions o;
    o.out_dir = root_ + "/" + name;
    o.resume = resume;
    o.progress = false;
    return Train(cfg, o);
  }
  // Trains into root_/name, expecting success; returns the directory.
  std::string Run(const RunConfig& cfg, const std::string& name,
                  const Checkpoint* resume = nullptr) {
    auto r = TryRun(cfg, name, resume);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return root_ + "/" + name;
  }

  // Trains on `ranks` in-process ranks into `dir` (emptied first); every rank's status.
  static std::vector<Status> RankStatuses(const RunConfig& cfg, int ranks, const std::string& dir) {
    std::filesystem::remove_all(dir);
    return RunInProcessRanks(ranks, [&](Communicator& comm) -> Status {
      TrainOptions o;
      o.out_dir = dir;
      o.progress = false;
      o.comm = &comm;
      return Train(cfg, o).status();
    });
  }
  // Trains on `ranks` in-process ranks into `dir` (emptied first); whether every rank succeeded
  // (each failure is reported).
  static bool RunRanks(const RunConfig& cfg, int ranks, const std::string& dir) {
    bool ok = true;
    for (const Status& st : RankStatuses(cfg, ranks, dir)) {
      EXPECT_TRUE(st.ok()) << st.ToString();
      ok &= st.ok();
    }
    return ok;
  }

  static std::vector<nlohmann::json> Metrics(const std::string& dir) {
    std::vector<nlohmann::json> out;
    std::ifstream in(dir + "/metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
    return out;
  }
  // The deterministic columns.
  static std::vector<std::string> LossColumns(const std::string& dir) {
    std::vector<std::string> out;
    for (auto& j : Metrics(dir)) {
      out.push_back(fmt::format("{} {} {} {} {}", j["step"].dump(), j["loss"].dump(),
                                j["lr"].dump(), j["grad_norm"].dump(),
                                j.contains("val_loss") ? j["val_loss"].dump() : "-"));
    }
    return out;
  }
  static std::string Bytes(const std::string& path) { return *ReadFile(path); }
  // The sdc events of one detector in the run in dir ("replay", ...), each with its metrics
  // line's step, in the order written.
  static std::vector<std::pair<int, nlohmann::json>> SdcEvents(const std::string& dir,
                                                               const std::string& detector) {
    std::vector<std::pair<int, nlohmann::json>> out;
    for (const auto& m : Metrics(dir))
      if (m.contains("sdc"))
        for (const auto& e : m["sdc"])
          if (e["detector"] == detector) out.emplace_back(m["step"].get<int>(), e);
    return out;
  }
  // The final checkpoint of the run in dir: its parameters and optimizer state, as bytes.
  static std::string FinalState(const std::string& dir) {
    return Bytes(dir + "/checkpoint/model.safetensors") +
           Bytes(dir + "/checkpoint/optimizer.safetensors");
  }

  std::string root_, data_;
  RunConfig cfg_;
};

}  // namespace atl
