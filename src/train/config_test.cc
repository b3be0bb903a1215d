#include "train/config.h"

#include <gtest/gtest.h>

#include <string>

#include "core/file.h"

namespace atl {
namespace {

// Parses, applies overrides and validates, like LoadRunConfig, from text.
StatusOr<RunConfig> Load(const std::string& toml, std::vector<std::string> overrides = {}) {
  ATOLL_ASSIGN_OR_RETURN(RunConfig cfg, ParseRunConfig(toml, "test.toml"));
  for (const auto& o : overrides) ATOLL_RETURN_IF_ERROR(ApplyConfigOverride(&cfg, o));
  ATOLL_RETURN_IF_ERROR(ValidateRunConfig(cfg));
  return cfg;
}

// The error message of a load that must fail; fails the test if it succeeded.
std::string ErrorOf(const std::string& toml, std::vector<std::string> overrides = {}) {
  auto r = Load(toml, std::move(overrides));
  EXPECT_FALSE(r.ok()) << "expected an error for: " << toml;
  if (r.ok()) return "";
  EXPECT_EQ(r.status().ExitCode(), 2) << r.status().ToString();
  return r.status().message();
}

TEST(RunConfig, EveryKeyHasADefaultAndEmptyTextIsValid) {
  auto cfg = Load("");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(*cfg, RunConfig());
  EXPECT_EQ(cfg->train.steps, 300);
  EXPECT_EQ(cfg->model.seq_len, 128);
}

TEST(RunConfig, ReadsEveryPresetInConfigs) {
  for (const char* preset : {"configs/tiny.toml", "configs/small.toml", "configs/gpt2-124m.toml"}) {
    auto cfg = LoadRunConfig(preset, {});
    ASSERT_TRUE(cfg.ok()) << preset << ": " << cfg.status().ToString();
  }
  auto tiny = LoadRunConfig("configs/tiny.toml", {});
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(tiny->model.n_embd, 32);
  EXPECT_EQ(tiny->train.batch_size, 4);
  EXPECT_DOUBLE_EQ(tiny->train.lr, 1e-3);
  EXPECT_EQ(tiny->data.dir, ".cache/data/sotu");
}

TEST(RunConfig, FloatKeysAcceptIntegers) {
  auto cfg = Load("[train]\nlr = 1\nmin_lr = 0\n");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->train.lr, 1.0);
}

TEST(RunConfig, UnknownKeysAndSectionsAreErrorsNamingThem) {
  EXPECT_NE(ErrorOf("[train]\nstepz = 3\n").find("train.stepz"), std::string::npos);
  EXPECT_NE(ErrorOf("[optim]\nlr = 3\n").find("[optim]"), std::string::npos);
  EXPECT_NE(ErrorOf("steps = 3\n").find("steps"), std::string::npos);  // top-level key
  EXPECT_TRUE(Load("[parallel]\n[world]\n").ok());
  EXPECT_NE(ErrorOf("[parallel]\nzero = 1\n").find("parallel.zero"), std::string::npos);
  EXPECT_NE(ErrorOf("[world]\nsitez = 2\n").find("world.sitez"), std::string::npos);
  EXPECT_NE(ErrorOf("[world.link]\nlatency = 2\n").find("world.link.latency"), std::string::npos);
  EXPECT_NE(ErrorOf("[world.link.\"0-1\"]\nlatency = 2\n").find("world.link.0-1.latency"),
            std::string::npos);
  EXPECT_NE(ErrorOf("[world.link.\"1-0\"]\nlatency_ms = 2\n").find("A < B"), std::string::npos);
}

// [world]: sites, ranks, strategy, the default link and per-pair overrides, from a file and --set.
TEST(RunConfig, WorldSectionWithLinksAndPairOverrides) {
  auto cfg = Load(
      "[world]\nsites = 3\nranks_per_site = 2\n[world.link]\nlatency_ms = 40\n"
      "bandwidth_mbps = 100\n[world.link.\"0-2\"]\nlatency_ms = 80\n",
      {"parallel.dp=2", "train.batch_size=12", "train.micro_batch_size=2",
       "world.link.1-2.bandwidth_mbps=50", "world.link.jitter_ms=5"});
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  const WorldConfig& w = cfg->world;
  EXPECT_EQ(w.sites, 3);
  EXPECT_EQ(w.Link(0, 1), (LinkProfile{40, 100, 5}));
  EXPECT_EQ(w.Link(2, 0), (LinkProfile{80, 100, 0}));  // the pair starts from [world.link] as read
  EXPECT_EQ(w.Link(1, 2), (LinkProfile{40, 50, 0}));
  // Round trips (the manifest and config.toml keep the pairs).
  auto back = Load(RunConfigToToml(*cfg));
  ASSERT_TRUE(back.ok()) << back.status().ToString() << RunConfigToToml(*cfg);
  EXPECT_EQ(*back, *cfg);
  auto from_json = RunConfigFromJson(nlohmann::json::parse(RunConfigToJson(*cfg).dump()));
  ASSERT_TRUE(from_json.ok()) << from_json.status().ToString();
  EXPECT_EQ(*from_json, *cfg);
  // Errors name the key.
  EXPECT_NE(ErrorOf("", {"world.sites=2", "world.ranks_per_site=3"}).find("world.ranks_per_site"),
            std::string::npos);
  EXPECT_NE(ErrorOf("", {"world.strategy=gossip"}).find("world.strategy"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"world.link.latency_ms=-1"}).find("world.link"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"world.link.0-5.latency_ms=1"}).find("world.link.0-5"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"world.sites=3"}).find("world.sites"), std::string::npos);  // batch 16
}

TEST(RunConfig, WrongTypesAreErrorsNamingTheKey) {
  EXPECT_NE(ErrorOf("[train]\nsteps = \"ten\"\n").find("train.steps"), std::string::npos);
  EXPECT_NE(ErrorOf("[train]\nsteps = 1.5\n").find("train.steps"), std::string::npos);
  EXPECT_NE(ErrorOf("[train]\nlr = \"fast\"\n").find("train.lr"), std::string::npos);
  EXPECT_NE(ErrorOf("[data]\ndir = 3\n").find("data.dir"), std::string::npos);
  EXPECT_NE(ErrorOf("[model]\nn_layer = 99999999999\n").find("model.n_layer"), std::string::npos);
  EXPECT_NE(ErrorOf("train = 3\n").find("train"), std::string::npos);
}

TEST(RunConfig, SyntaxErrorsNameTheFileAndLine) {
  const std::string e = ErrorOf("[train]\nsteps = = 3\n");
  EXPECT_NE(e.find("test.toml:2"), std::string::npos) << e;
}

TEST(RunConfig, BadValuesAreErrorsNamingTheKey) {
  struct Case {
    std::string toml, key;
  };
  const Case cases[] = {
      {"[train]\nbatch_size = 10\nmicro_batch_size = 4\n", "train.batch_size"},
      {"[train]\nmicro_batch_size = 0\n", "train.micro_batch_size"},
      {"[model]\nn_embd = 100\nn_head = 3\n", "model.n_embd"},
      {"[model]\nseq_len = 0\n", "model.seq_len"},
      {"[model]\nseq_len = 100000\n", "model.seq_len"},
      {"[model]\nvocab_size = 70000\n", "model.vocab_size"},
      {"[train]\nsteps = 0\n", "train.steps"},
      {"[train]\nlr = -1.0\n", "train.lr"},
      {"[train]\nlr = 1e-3\nmin_lr = 1e-2\n", "train.min_lr"},
      {"[train]\nbeta1 = 1.0\n", "train.beta1"},
      {"[train]\nbeta2 = -0.5\n", "train.beta2"},
      {"[train]\neps = 0.0\n", "train.eps"},
      {"[train]\ngrad_clip = -1.0\n", "train.grad_clip"},
      {"[train]\nwarmup_steps = -1\n", "train.warmup_steps"},
      {"[train]\nthreads = -1\n", "train.threads"},
      {"[train]\nseed = -3\n", "train.seed"},
      {"[train]\nlr = nan\n", "train.lr"},
      {"[data]\ndir = \"\"\n", "data.dir"},
      {"[train]\ncheckpoint_every = -2\n", "train.checkpoint_every"},
      {"[train]\nattention_rows = \"96/64\"\n", "train.attention_rows"},
      {"[train]\nattention_rows = \"64/\"\n", "train.attention_rows"},
      {"[train]\nattention_rows = \"fastest\"\n", "train.attention_rows"},
      {"[train]\nattention_backward = \"both\"\n", "train.attention_backward"},
  };
  for (const auto& c : cases) {
    const std::string e = ErrorOf(c.toml);
    EXPECT_NE(e.find(c.key), std::string::npos) << c.toml << " gave: " << e;
  }
}

TEST(RunConfig, OverridesAreTypedByTheKey) {
  auto cfg = Load("[train]\nsteps = 5\n", {"train.steps=7", "train.lr=3e-4", "data.dir=/tmp/x y",
                                           "model.n_layer=1_0", "train.min_lr=0"});
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->train.steps, 7);
  EXPECT_EQ(cfg->train.lr, 3e-4);
  EXPECT_EQ(cfg->data.dir, "/tmp/x y");
  EXPECT_EQ(cfg->model.n_layer, 10);
  auto quoted = Load("", {"data.dir=\"/d\""});
  ASSERT_TRUE(quoted.ok());
  EXPECT_EQ(quoted->data.dir, "/d");
}

TEST(RunConfig, BadOverridesAreErrorsNamingTheKey) {
  EXPECT_NE(ErrorOf("", {"train.stepz=3"}).find("train.stepz"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"train.steps=3.5"}).find("train.steps"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"train.steps=abc"}).find("train.steps"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"train.lr=fast"}).find("train.lr"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"steps=3"}).find("section.key=value"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"train.steps"}).find("section.key=value"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"nope.x=1"}).find("nope"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"train.micro_batch_size=5"}).find("train.batch_size"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"parallel.dp=0"}).find("parallel.dp"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"parallel.reproducible=1"}).find("parallel.reproducible"),
            std::string::npos);
}

TEST(RunConfig, ParallelKeysDefaultsAndErrors) {
  auto cfg = Load("[parallel]\ndp = 2\nreproducible = true\nbucket_mb = 1.5\n");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->parallel.dp, 2);
  EXPECT_EQ(cfg->parallel.tp, 1);
  EXPECT_EQ(cfg->parallel.pp, 1);
  EXPECT_TRUE(cfg->parallel.reproducible);
  EXPECT_EQ(cfg->parallel.bucket_mb, 1.5);
  EXPECT_FALSE(Load("")->parallel.reproducible);
  EXPECT_EQ(Load("")->parallel.schedule, "1f1b");
  EXPECT_FALSE(Load("")->parallel.zero);
  EXPECT_TRUE(Load("", {"parallel.tp=2", "parallel.pp=4", "parallel.schedule=gpipe"}).ok());
  // tp must split the heads, pp must leave each stage a block: clear errors naming the key.
  EXPECT_NE(ErrorOf("", {"parallel.tp=3"}).find("parallel.tp: must divide model.n_head = 4"),
            std::string::npos);
  EXPECT_NE(ErrorOf("", {"parallel.pp=5"}).find("parallel.pp: must be at most model.n_layer = 4"),
            std::string::npos);
  EXPECT_NE(ErrorOf("", {"parallel.schedule=zb"}).find("parallel.schedule"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"parallel.bucket_mb=0"}).find("parallel.bucket_mb"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"parallel.reproducible=maybe"}).find("true or false"), std::string::npos);
  EXPECT_NE(ErrorOf("[parallel]\nreproducible = 1\n").find("parallel.reproducible"),
            std::string::npos);
  // The global batch (16 sequences of micro-batches of 8) must split into whole micro-batches.
  EXPECT_NE(ErrorOf("", {"parallel.dp=4"}).find("parallel.dp"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"parallel.dp=3"}).find("parallel.dp"), std::string::npos);
  // The world size is checked when ranks run.
  auto dp2 = Load("", {"parallel.dp=2"});
  ASSERT_TRUE(dp2.ok()) << dp2.status().ToString();
  EXPECT_TRUE(ValidateParallel(*dp2, 2).ok());
  const Status s = ValidateParallel(*dp2, 4);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("parallel.dp * parallel.tp * parallel.pp"), std::string::npos);
  EXPECT_NE(s.message().find("4 ranks"), std::string::npos);
  EXPECT_FALSE(ValidateParallel(*Load(""), 2).ok());
}

TEST(RunConfig, ManifestsWithoutParallelReadAsDefaults) {
  auto cfg = Load("", {"parallel.dp=2", "parallel.reproducible=true"});
  ASSERT_TRUE(cfg.ok());
  auto j = RunConfigToJson(*cfg);
  auto back = RunConfigFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *cfg);
  j.erase("parallel");
  back = RunConfigFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->parallel, ParallelConfig{});
}

// The GPU attention's keys: auto by default (the block rows timed at start), any Q/K of 64 and
// 128, split or fused; a manifest written before they existed reads as their defaults (and so
// does one without train.device and precision: a run on the CPU).
TEST(RunConfig, AttentionKeysDefaultsSettingsAndOldManifests) {
  auto cfg = Load("");
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(cfg->train.attention_rows, "auto");
  EXPECT_EQ(cfg->train.attention_backward, "split");
  for (const char* rows : {"64/64", "128/64", "64/128", "128/128", "128"}) {
    cfg = Load("", {std::string("train.attention_rows=") + rows, "train.attention_backward=fused"});
    ASSERT_TRUE(cfg.ok()) << rows << ": " << cfg.status().ToString();
    EXPECT_EQ(cfg->train.attention_rows, rows);
    EXPECT_EQ(cfg->train.attention_backward, "fused");
  }
  auto j = RunConfigToJson(*cfg);
  for (const char* late : {"attention_rows", "attention_backward", "device", "precision"})
    j["train"].erase(late);
  auto back = RunConfigFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->train.attention_rows, "auto");
  EXPECT_EQ(back->train.attention_backward, "split");
  EXPECT_EQ(back->train.device, "cpu");
  EXPECT_EQ(back->train.precision, "fp32");
}

TEST(RunConfig, TomlAndJsonRoundTripBitForBit) {
  auto cfg = Load("", {"train.lr=0.1", "train.eps=1e-8", "train.beta2=0.999", "train.min_lr=1e-20",
                       "data.dir=dir with \"quotes\" and \\ backslash", "train.seed=123456789012"});
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  const std::string toml = RunConfigToToml(*cfg);
  auto back = Load(toml);
  ASSERT_TRUE(back.ok()) << back.status().ToString() << "\n" << toml;
  EXPECT_EQ(*back, *cfg) << toml;
  auto from_json = RunConfigFromJson(nlohmann::json::parse(RunConfigToJson(*cfg).dump()));
  ASSERT_TRUE(from_json.ok()) << from_json.status().ToString();
  EXPECT_EQ(*from_json, *cfg);
  // Floats stay floats in TOML even when integral.
  auto whole = Load("", {"train.lr=1", "train.min_lr=0"});
  ASSERT_TRUE(whole.ok());
  EXPECT_NE(RunConfigToToml(*whole).find("lr = 1.0\n"), std::string::npos);
}

TEST(RunConfig, JsonFormRejectsUnknownMissingAndMistypedKeys) {
  nlohmann::json j = RunConfigToJson(RunConfig());
  j["train"]["bogus"] = 1;
  EXPECT_FALSE(RunConfigFromJson(j).ok());
  j = RunConfigToJson(RunConfig());
  j["train"].erase("lr");
  EXPECT_FALSE(RunConfigFromJson(j).ok());
  j = RunConfigToJson(RunConfig());
  j["train"]["steps"] = "many";
  EXPECT_FALSE(RunConfigFromJson(j).ok());
}

TEST(RunConfig, MissingFileIsNotFound) {
  auto r = LoadRunConfig("/nonexistent/cfg.toml", {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().ExitCode(), 2);
  EXPECT_NE(r.status().message().find("/nonexistent/cfg.toml"), std::string::npos);
}

}  // namespace
}  // namespace atl
