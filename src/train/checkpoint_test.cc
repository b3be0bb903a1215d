// Checkpoint round trip and the tests whose job is to break things (LevelDB's corruption_test):
// every single-byte corruption and every truncation of a checkpoint file is refused with
// kCorruption (exit code 2), naming the file, and the tensor where there is one.
#include "train/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "core/hash.h"
#include "core/rng.h"
#include "train/safetensors.h"

namespace atl {
namespace {

namespace fs = std::filesystem;

RunConfig TinyConfig() {
  RunConfig c;
  c.model = {.vocab_size = 16, .seq_len = 4, .n_layer = 1, .n_head = 2, .n_embd = 4};
  c.train.steps = 10;
  c.train.warmup_steps = 2;
  c.train.seed = 42;
  return c;
}

struct Buffers {
  std::vector<float> params, m, v;
};

Buffers RandomBuffers(const RunConfig& c) {
  const size_t n = NumParameters(c.model);
  Buffers b{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) {
    b.params[i] = RandomNormal(1, 0, RngPurpose::kTest, i);
    b.m[i] = RandomNormal(2, 0, RngPurpose::kTest, i);
    b.v[i] = RandomUniform(3, 0, RngPurpose::kTest, i);
  }
  return b;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = ::testing::TempDir() + "/ckpt_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(root_);
    fs::create_directories(root_);
    dir_ = root_ + "/checkpoint";
    cfg_ = TinyConfig();
    buf_ = RandomBuffers(cfg_);
    ASSERT_TRUE(Write(dir_).ok());
  }
  void TearDown() override { fs::remove_all(root_); }

  Status Write(const std::string& dir) {
    CheckpointSource src;
    src.config = &cfg_;
    src.cursor = {.next_step = 7,
                  .tokens_seen = 7 * 16 * 4,
                  .train_checksum = 0x1234,
                  .val_checksum = 0xabcd,
                  .train_tokens = 1000,
                  .val_tokens = 100};
    src.optimizer_steps = 7;
    src.params = buf_.params.data();
    src.exp_avg = buf_.m.data();
    src.exp_avg_sq = buf_.v.data();
    return WriteCheckpoint(dir, src);
  }

  std::string Slurp(const std::string& path) { return *ReadFile(path); }
  void Spit(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }

  std::string root_, dir_;
  RunConfig cfg_;
  Buffers buf_;
};

TEST_F(CheckpointTest, RoundTripsBitForBit) {
  auto ck = LoadCheckpoint(dir_, /*with_optimizer=*/true);
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_EQ(ck->config, cfg_);
  EXPECT_EQ(ck->cursor.next_step, 7);
  EXPECT_EQ(ck->cursor.tokens_seen, 7u * 16 * 4);
  EXPECT_EQ(ck->cursor.train_checksum, 0x1234u);
  EXPECT_EQ(ck->cursor.val_checksum, 0xabcdu);
  EXPECT_EQ(ck->cursor.train_tokens, 1000u);
  EXPECT_EQ(ck->optimizer_steps, 7);
  const size_t bytes = buf_.params.size() * sizeof(float);
  ASSERT_EQ(ck->params.size(), buf_.params.size());
  EXPECT_EQ(std::memcmp(ck->params.data(), buf_.params.data(), bytes), 0);
  EXPECT_EQ(std::memcmp(ck->exp_avg.data(), buf_.m.data(), bytes), 0);
  EXPECT_EQ(std::memcmp(ck->exp_avg_sq.data(), buf_.v.data(), bytes), 0);
  auto model_only = LoadCheckpoint(dir_, /*with_optimizer=*/false);
  ASSERT_TRUE(model_only.ok());
  EXPECT_TRUE(model_only->exp_avg.empty());
}

TEST_F(CheckpointTest, HoldsHuggingFaceFilesAndAManifest) {
  for (const char* f :
       {"model.safetensors", "optimizer.safetensors", "config.json", "manifest.json"})
    EXPECT_TRUE(FileExists(dir_ + "/" + f)) << f;
  EXPECT_FALSE(FileExists(dir_ + ".tmp"));
  auto model = SafetensorsFile::Open(dir_ + "/model.safetensors");
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->metadata().at("format"), "pt");
  ASSERT_NE(model->Find("transformer.h.0.attn.c_attn.weight"), nullptr);
  EXPECT_EQ(model->Find("transformer.h.0.attn.c_attn.weight")->shape,
            (std::vector<int64_t>{4, 12}));
  EXPECT_EQ(model->tensors().size(), ParameterLayout(cfg_.model).size());
  auto hf = nlohmann::json::parse(Slurp(dir_ + "/config.json"));
  EXPECT_EQ(hf["model_type"], "gpt2");
  EXPECT_EQ(hf["architectures"][0], "GPT2LMHeadModel");
  EXPECT_EQ(hf["n_positions"], 4);
  EXPECT_EQ(hf["n_ctx"], 4);
  EXPECT_EQ(hf["vocab_size"], 16);
  EXPECT_EQ(hf["activation_function"], "gelu_new");
  EXPECT_EQ(hf["layer_norm_epsilon"], 1e-5);
  auto m = nlohmann::json::parse(Slurp(dir_ + "/manifest.json"));
  EXPECT_EQ(m["format_version"], kCheckpointFormatVersion);
  EXPECT_EQ(m["step"], 7);
  EXPECT_EQ(m["seed"], 42);
  EXPECT_EQ(m["mesh"], nlohmann::json({{"dp", 1}, {"tp", 1}, {"pp", 1}}));
  EXPECT_EQ(m["rng"]["kind"], "counter-based");
  EXPECT_EQ(m["files"]["model.safetensors"]["tensors"].size(), ParameterLayout(cfg_.model).size());
  EXPECT_EQ(m["files"]["optimizer.safetensors"]["tensors"].size(),
            2 * ParameterLayout(cfg_.model).size());
  EXPECT_EQ(m["config"]["train"]["seed"], 42);
}

TEST_F(CheckpointTest, RewritingReplacesAtomicallyAndIgnoresLeftovers) {
  // A crash mid-write leaves "<dir>.tmp" behind; the old checkpoint still loads.
  fs::create_directories(dir_ + ".tmp");
  Spit(dir_ + ".tmp/model.safetensors", "garbage");
  ASSERT_TRUE(LoadCheckpoint(dir_, true).ok());
  buf_.params[0] = 123.0f;
  ASSERT_TRUE(Write(dir_).ok());
  auto ck = LoadCheckpoint(dir_, true);
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_EQ(ck->params[0], 123.0f);
  EXPECT_FALSE(FileExists(dir_ + ".tmp"));
  // Byte-identical when written twice from the same state.
  ASSERT_TRUE(Write(root_ + "/again").ok());
  for (const char* f :
       {"model.safetensors", "optimizer.safetensors", "config.json", "manifest.json"})
    EXPECT_EQ(Slurp(dir_ + "/" + f), Slurp(root_ + "/again/" + f)) << f;
}

// Loads and expects a refusal with kCorruption whose message contains every string in `want`.
void ExpectRefused(const std::string& dir, const std::vector<std::string>& want,
                   const std::string& what) {
  auto ck = LoadCheckpoint(dir, /*with_optimizer=*/true);
  ASSERT_FALSE(ck.ok()) << what << " was accepted";
  EXPECT_EQ(ck.status().ExitCode(), 2) << what << ": " << ck.status().ToString();
  for (const auto& w : want)
    EXPECT_NE(ck.status().message().find(w), std::string::npos)
        << what << ": message lacks '" << w << "': " << ck.status().message();
}

TEST_F(CheckpointTest, FlippedBytesInEveryFileAreRefused) {
  for (const char* file :
       {"model.safetensors", "optimizer.safetensors", "config.json", "manifest.json"}) {
    const std::string path = dir_ + "/" + file;
    const std::string good = Slurp(path);
    // Every byte of the first 512 (the safetensors length and the start of each JSON), then
    // every 7th (a prime stride, so it falls on every kind of field); the tensor data is covered
    // tensor by tensor in FlippedTensorBytesNameTheTensor.
    for (size_t i = 0; i < good.size(); i += (i < 512 ? 1 : 7)) {
      std::string bad = good;
      bad[i] = char(bad[i] ^ 0x01);
      Spit(path, bad);
      ExpectRefused(dir_, {file}, fmt::format("{} with byte {} flipped", file, i));
      if (HasFailure()) break;
    }
    Spit(path, good);
  }
  ASSERT_TRUE(LoadCheckpoint(dir_, true).ok());
}

TEST_F(CheckpointTest, FlippedTensorBytesNameTheTensor) {
  const std::string path = dir_ + "/model.safetensors";
  const std::string good = Slurp(path);
  auto file = SafetensorsFile::Parse(good, path);
  ASSERT_TRUE(file.ok());
  for (const auto& t : file->tensors()) {
    std::string bad = good;
    const size_t at = size_t(t.data - reinterpret_cast<const uint8_t*>(good.data())) + t.size / 2;
    bad[at] = char(bad[at] ^ 0x80);
    Spit(path, bad);
    ExpectRefused(dir_, {"model.safetensors", "tensor " + t.name, "checksum"}, t.name);
  }
  Spit(path, good);
  // The same for the optimizer's moments.
  const std::string opt_path = dir_ + "/optimizer.safetensors";
  const std::string opt_good = Slurp(opt_path);
  auto opt = SafetensorsFile::Parse(opt_good, opt_path);
  ASSERT_TRUE(opt.ok());
  const TensorView& last = opt->tensors().back();
  std::string bad = opt_good;
  bad[bad.size() - 1] ^= 0x40;
  Spit(opt_path, bad);
  ExpectRefused(dir_, {"optimizer.safetensors", "tensor " + last.name}, "optimizer");
  // Eval and sample do not read the optimizer: they still load.
  EXPECT_TRUE(LoadCheckpoint(dir_, /*with_optimizer=*/false).ok());
}

TEST_F(CheckpointTest, TruncationsAreRefused) {
  for (const char* file :
       {"model.safetensors", "optimizer.safetensors", "config.json", "manifest.json"}) {
    const std::string path = dir_ + "/" + file;
    const std::string good = Slurp(path);
    // Every length in the first 512 bytes, then a prime stride, then the last 8 lengths.
    for (size_t len = 0; len < good.size(); len += (len < 512 || len + 8 >= good.size() ? 1 : 13)) {
      // Losing only the JSON files' final newline loses nothing: that file is still complete.
      if (good.find_first_not_of('\n', len) == std::string::npos) continue;
      Spit(path, good.substr(0, len));
      ExpectRefused(dir_, {file}, fmt::format("{} truncated to {} bytes", file, len));
      if (HasFailure()) break;
    }
    Spit(path, good);
  }
  // Cut in the data of the model file: the first tensor that lost bytes is named.
  const std::string path = dir_ + "/model.safetensors";
  const std::string good = Slurp(path);
  Spit(path, good.substr(0, good.size() - 1));
  ExpectRefused(dir_, {"model.safetensors", "tensor transformer.ln_f.bias", "truncated"}, "cut");
}

TEST_F(CheckpointTest, MissingFilesAreBadInput) {
  auto none = LoadCheckpoint(root_ + "/nope", true);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  for (const char* file :
       {"model.safetensors", "optimizer.safetensors", "config.json", "manifest.json"}) {
    const std::string path = dir_ + "/" + file;
    fs::rename(path, path + ".away");
    auto ck = LoadCheckpoint(dir_, true);
    ASSERT_FALSE(ck.ok()) << file;
    EXPECT_EQ(ck.status().ExitCode(), 2);
    EXPECT_NE(ck.status().message().find(file), std::string::npos) << ck.status().message();
    fs::rename(path + ".away", path);
  }
}

TEST_F(CheckpointTest, ATensorOfTheWrongShapeIsRefused) {
  // A well-formed file whose tensor does not match the manifest's config.
  const auto layout = ParameterLayout(cfg_.model);
  SafetensorsWriter w;
  w.SetMetadata("format", "pt");
  for (const auto& t : layout) {
    auto shape = t.shape;
    if (t.name == "transformer.h.0.attn.c_attn.weight") shape = {shape[1], shape[0]};
    w.AddFloats(t.name, shape, buf_.params.data() + t.offset);
  }
  ASSERT_TRUE(w.Write(dir_ + "/model.safetensors").ok());
  ExpectRefused(dir_, {"tensor transformer.h.0.attn.c_attn.weight", "shape"}, "transposed");
}

// Found by fuzz/manifest_fuzz.cc: a float where an integer belongs (next_step 1e300, or a format
// version past int's range) was cast with undefined behaviour; a manifest with its right
// self-checksum and such a field is corrupt.
TEST_F(CheckpointTest, AManifestFieldOutOfItsTypesRangeIsRefused) {
  for (const auto& [path, value] :
       {std::pair{"/data/next_step", nlohmann::ordered_json(1e300)},
        std::pair{"/format_version", nlohmann::ordered_json(uint64_t{1} << 32 | 1)},
        std::pair{"/optimizer/steps", nlohmann::ordered_json(-1.5)}}) {
    auto m = nlohmann::ordered_json::parse(Slurp(dir_ + "/manifest.json"));
    m[nlohmann::ordered_json::json_pointer(path)] = value;
    m.erase("checksum");
    m["checksum"] = HashToHex(Hash64(m.dump()));
    nlohmann::ordered_json files;
    auto ck = ParseManifest(m.dump(2), "manifest.json", &files);
    ASSERT_FALSE(ck.ok()) << path;
    EXPECT_EQ(ck.status().code(), StatusCode::kCorruption) << ck.status().ToString();
    EXPECT_NE(ck.status().message().find("out of range"), std::string::npos)
        << ck.status().ToString();
  }
}

}  // namespace
}  // namespace atl
