// Weights from Hugging Face GPT-2 directories (train/hf_import.h): every dtype and both namings
// read back exactly, the mask buffers and a tied head accepted, everything atoll's GPT does not
// compute refused by name; atoll's own checkpoints through LoadWeights; train.init_from starting
// a run from either kind of directory, on one rank and on a tensor-parallel pair.
#include "train/hf_import.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/file.h"
#include "model/config.h"
#include "train/safetensors.h"
#include "train/test_util.h"

namespace atl {
namespace {

namespace fs = std::filesystem;

const GPTConfig kModel{.vocab_size = 64, .seq_len = 16, .n_layer = 2, .n_head = 2, .n_embd = 16};

// A half's value by its definition, in double (exact), for the reader's bit tricks to match.
float HalfValue(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  const double v = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1.0 + m / 1024.0, e - 15);
  return float(s ? -v : v);
}

class HfImportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = ::testing::TempDir() + "/hf_" + info->name();
    fs::remove_all(dir_);
    ASSERT_TRUE(MakeDirs(dir_).ok());
    config_ = nlohmann::json::parse(HuggingFaceConfigJson(kModel));
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A tensor beside the layout's: raw bytes of any dtype.
  struct Extra {
    std::string name;
    std::vector<int64_t> shape;
    SafetensorsDType dtype = SafetensorsDType::kF32;
    std::vector<uint8_t> bytes;
  };
  static Extra Floats(std::string name, std::vector<int64_t> shape, const std::vector<float>& v) {
    Extra e{std::move(name), std::move(shape), SafetensorsDType::kF32,
            std::vector<uint8_t>(v.size() * sizeof(float))};
    std::memcpy(e.bytes.data(), v.data(), e.bytes.size());
    return e;
  }
  // Writes dir_/config.json (config_) and dir_/model.safetensors: every layout tensor but those
  // named in `leave_out` of `values` (as floats, or as the 2-byte patterns in `halves`) under its
  // name with or without "transformer.", in `dtype`, then the `extra` tensors.
  void Write(SafetensorsDType dtype, bool prefix, const std::vector<float>& values,
             const std::vector<uint16_t>& halves = {}, const std::vector<Extra>& extra = {},
             const std::string& leave_out = "") {
    ASSERT_TRUE(WriteFileAtomic(dir_ + "/config.json", config_.dump(2)).ok());
    SafetensorsWriter w;
    w.SetMetadata("format", "pt");
    doubles_.assign(values.begin(), values.end());
    for (const ParamTensor& t : ParameterLayout(kModel)) {
      if (t.name == leave_out) continue;
      const std::string name = prefix ? t.name : t.name.substr(std::strlen("transformer."));
      const void* p = dtype == SafetensorsDType::kF32 ? static_cast<const void*>(&values[t.offset])
                      : dtype == SafetensorsDType::kF64
                          ? static_cast<const void*>(&doubles_[t.offset])
                          : static_cast<const void*>(&halves[t.offset]);
      w.Add(name, dtype, t.shape, p);
    }
    for (const Extra& e : extra) w.Add(e.name, e.dtype, e.shape, e.bytes.data());
    const Status st = w.Write(dir_ + "/model.safetensors");
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  static std::vector<float> RandomValues(uint64_t seed) {
    std::mt19937_64 g(seed);
    std::normal_distribution<float> d(0.0f, 0.05f);
    std::vector<float> v(NumParameters(kModel));
    for (float& x : v) x = d(g);
    return v;
  }
  std::vector<float> Wte(const std::vector<float>& v) const {
    const ParamTensor t = ParameterLayout(kModel).front();
    return {v.begin() + long(t.offset), v.begin() + long(t.offset + t.numel)};
  }
  // The status of loading dir_, which must fail with `code` and a message holding `words`.
  void ExpectRefused(StatusCode code, const std::string& words) {
    auto r = LoadHuggingFaceWeights(dir_);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status().ToString();
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().ToString();
  }

  std::string dir_;
  nlohmann::json config_;
  std::vector<double> doubles_;
};

TEST_F(HfImportTest, EveryDtypeAndBothNamingsReadBackExactly) {
  const std::vector<float> v = RandomValues(1);
  for (const bool prefix : {false, true}) {
    SCOPED_TRACE(prefix ? "transformer.*" : "bare names");
    Write(SafetensorsDType::kF32, prefix, v);
    auto ck = LoadHuggingFaceWeights(dir_);
    ASSERT_TRUE(ck.ok()) << ck.status().ToString();
    EXPECT_EQ(ck->config.model, kModel);
    EXPECT_EQ(ck->params, v);
    EXPECT_TRUE(ck->exp_avg.empty());
    EXPECT_EQ(ck->cursor.next_step, 0);
  }
  Write(SafetensorsDType::kF64, false, v);  // doubles made from floats: back exactly
  auto f64 = LoadHuggingFaceWeights(dir_);
  ASSERT_TRUE(f64.ok()) << f64.status().ToString();
  EXPECT_EQ(f64->params, v);
  // 7,872 distinct half patterns spread over all 65,536 (i * 7919 mod 2^16; signs, zeros,
  // subnormals, normals; an inf or NaN pattern's exponent cleared, making it subnormal), and bf16.
  std::vector<uint16_t> halves(v.size()), bf16(v.size());
  std::vector<float> want_half(v.size()), want_bf16(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t h = uint16_t(i * 7919u);
    if (((h >> 10) & 31) == 31) h &= 0x83ffu;  // no inf or NaN: an exponent of 0 instead
    halves[i] = h;
    want_half[i] = HalfValue(h);
    uint32_t bits;
    std::memcpy(&bits, &v[i], 4);
    bf16[i] = uint16_t(bits >> 16);
    bits &= 0xffff0000u;
    std::memcpy(&want_bf16[i], &bits, 4);
  }
  Write(SafetensorsDType::kF16, true, v, halves);
  auto f16 = LoadHuggingFaceWeights(dir_);
  ASSERT_TRUE(f16.ok()) << f16.status().ToString();
  for (size_t i = 0; i < v.size(); ++i)
    ASSERT_EQ(std::memcmp(&f16->params[i], &want_half[i], 4), 0)
        << "half 0x" << std::hex << halves[i] << ": " << f16->params[i] << " != " << want_half[i];
  Write(SafetensorsDType::kBF16, false, v, bf16);
  auto b16 = LoadHuggingFaceWeights(dir_);
  ASSERT_TRUE(b16.ok()) << b16.status().ToString();
  EXPECT_EQ(b16->params, want_bf16);
}

TEST_F(HfImportTest, MaskBuffersAndATiedHeadAreAccepted) {
  const std::vector<float> v = RandomValues(2);
  const int64_t T = kModel.seq_len, V = kModel.vocab_size, C = kModel.n_embd;
  const std::vector<float> mask(size_t(T * T), 1.0f), wte = Wte(v);
  // The mask buffers as transformers saved them: float, uint8 or bool; the head stored again.
  Write(SafetensorsDType::kF32, false, v, {},
        {Floats("h.0.attn.bias", {1, 1, T, T}, mask),
         Extra{"h.1.attn.masked_bias", {1}, SafetensorsDType::kU8, {0}},
         Extra{"h.1.attn.bias",
               {1, 1, T, T},
               SafetensorsDType::kBool,
               std::vector<uint8_t>(size_t(T * T), 1)},
         Floats("lm_head.weight", {V, C}, wte)});
  auto ck = LoadHuggingFaceWeights(dir_);
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_EQ(ck->params, v);
  // safetensors' save_model of tied tensors keeps one name, the head's: it stands for wte.
  Write(SafetensorsDType::kF32, true, v, {}, {Floats("lm_head.weight", {V, C}, wte)},
        "transformer.wte.weight");
  auto head = LoadHuggingFaceWeights(dir_);
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_EQ(head->params, v);
}

TEST_F(HfImportTest, WhatAtollDoesNotComputeIsRefusedByName) {
  const std::vector<float> v = RandomValues(3);
  const int64_t V = kModel.vocab_size, C = kModel.n_embd;
  std::vector<float> other = Wte(v);
  other[5] += 1.0f;
  Write(SafetensorsDType::kF32, true, v, {}, {Floats("lm_head.weight", {V, C}, other)});
  ExpectRefused(StatusCode::kInvalidArgument, "untied LM head");
  Write(SafetensorsDType::kF32, true, v, {},
        {Floats("transformer.h.0.attn.q_norm.weight", {C}, std::vector<float>(size_t(C)))});
  ExpectRefused(StatusCode::kInvalidArgument, "h.0.attn.q_norm.weight is not part of GPT-2");
  const nlohmann::json good = config_;
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"model_type", "llama"},
           {"activation_function", "relu"},
           {"n_inner", 100},
           {"layer_norm_epsilon", 1e-6},
           {"tie_word_embeddings", false},
           {"scale_attn_by_inverse_layer_idx", true},
           {"n_embd", 15},
           {"n_layer", "2"}}) {
    SCOPED_TRACE(key);
    config_ = good;
    config_[key] = value;
    Write(SafetensorsDType::kF32, true, v);
    ExpectRefused(StatusCode::kInvalidArgument, key);
  }
  config_ = good;
  config_["activation_function"] = "gelu_pytorch_tanh";  // the same math: read
  config_["n_inner"] = nullptr;
  Write(SafetensorsDType::kF32, true, v);
  EXPECT_TRUE(LoadHuggingFaceWeights(dir_).ok());
}

TEST_F(HfImportTest, DamagedOrMissingFilesAreRefused) {
  std::vector<float> v = RandomValues(4);
  config_["n_positions"] = 32;  // wpe's rows do not match
  Write(SafetensorsDType::kF32, true, v);
  ExpectRefused(StatusCode::kCorruption, "shape [16, 16], config.json's model needs [32, 16]");
  config_["n_positions"] = kModel.seq_len;
  v[7] = NAN;
  Write(SafetensorsDType::kF32, true, v);
  ExpectRefused(StatusCode::kCorruption, "element 7 is nan");
  v[7] = 0.0f;
  const ParamTensor ln = ParameterLayout(kModel).back();
  Write(SafetensorsDType::kF32, true, v, {},
        {Floats(ln.name.substr(12), ln.shape, std::vector<float>(ln.numel))});
  ExpectRefused(StatusCode::kCorruption, "holds both");
  // A parameter of an integer dtype.
  Write(SafetensorsDType::kF32, true, v, {},
        {Extra{ln.name, ln.shape, SafetensorsDType::kI32, std::vector<uint8_t>(4 * ln.numel)}},
        ln.name);
  ExpectRefused(StatusCode::kCorruption, "dtype I32, not F32");
  fs::remove(dir_ + "/model.safetensors");
  ExpectRefused(StatusCode::kNotFound, "no model.safetensors");
  { std::ofstream(dir_ + "/pytorch_model.bin") << "pickle"; }
  ExpectRefused(StatusCode::kInvalidArgument, "safe_serialization=True");
  { std::ofstream(dir_ + "/model.safetensors.index.json") << "{}"; }
  ExpectRefused(StatusCode::kInvalidArgument, "sharded");
  { std::ofstream(dir_ + "/config.json") << "{not json"; }
  ExpectRefused(StatusCode::kCorruption, "not valid JSON");
  fs::remove_all(dir_);
  ExpectRefused(StatusCode::kNotFound, "no such directory");
  ASSERT_TRUE(MakeDirs(dir_).ok());  // empty
  auto neither = LoadWeights(dir_);
  ASSERT_FALSE(neither.ok());
  EXPECT_NE(neither.status().message().find("neither an atoll checkpoint"), std::string::npos);
}

// train.init_from: a run started from a trained run's checkpoint, or from the same weights as a
// Hugging Face directory (its model.safetensors and config.json alone), trains bit for bit alike,
// from the trained weights (a far lower first loss than a random start), on one rank and on two
// tensor-parallel ranks, and at a shorter context; another shape is refused.
class InitFromTest : public TrainerTest {};

TEST_F(InitFromTest, StartsFromAnAtollCheckpointOrAHuggingFaceDirectoryAlike) {
  cfg_.train.steps = 30;
  const std::string trained = Run(cfg_, "trained") + "/checkpoint";
  const std::string hf = root_ + "/hf";
  ASSERT_TRUE(MakeDirs(hf).ok());
  for (const char* f : {"model.safetensors", "config.json"})
    fs::copy_file(trained + "/" + f, hf + "/" + f);
  RunConfig from = cfg_;
  from.train.steps = 4;
  const std::string fresh = Run(from, "fresh");
  from.train.init_from = trained;
  const std::string a = Run(from, "from_atoll");
  from.train.init_from = hf;
  const std::string b = Run(from, "from_hf");
  EXPECT_EQ(LossColumns(a), LossColumns(b));
  const double first_fresh = Metrics(fresh)[0]["loss"].get<double>();
  const double first_a = Metrics(a)[0]["loss"].get<double>();
  const double last_trained = Metrics(root_ + "/trained").back()["loss"].get<double>();
  EXPECT_LT(first_a, first_fresh - 0.5) << "the run did not start from the trained weights";
  EXPECT_NEAR(first_a, last_trained, 0.5);
  // Two tensor-parallel ranks take their halves of the same weights: the same losses.
  RunConfig tp = from;
  tp.parallel.tp = 2;
  ASSERT_TRUE(RunRanks(tp, 2, root_ + "/tp2"));
  const auto one = Metrics(b), two = Metrics(root_ + "/tp2");
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i)
    EXPECT_NEAR(two[i]["loss"].get<double>(), one[i]["loss"].get<double>(),
                1e-5 * one[i]["loss"].get<double>())
        << "step " << i + 1;
  // A shorter context takes wpe's first rows (and starts from the trained weights); a longer one
  // is refused.
  RunConfig shorter = from;
  shorter.model.seq_len = 8;
  const std::string s8 = Run(shorter, "short");
  shorter.train.init_from.clear();
  const std::string f8 = Run(shorter, "short_fresh");
  EXPECT_LT(Metrics(s8)[0]["loss"].get<double>(), Metrics(f8)[0]["loss"].get<double>() - 0.5);
  // ... and trains as a directory holding those rows by hand does.
  {
    auto w = LoadWeights(hf);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    const std::string cut = root_ + "/hf8";
    ASSERT_TRUE(MakeDirs(cut).ok());
    ASSERT_TRUE(WriteFileAtomic(cut + "/config.json", HuggingFaceConfigJson(shorter.model)).ok());
    SafetensorsWriter sw;
    const auto whole = ParameterLayout(w->config.model);
    for (const ParamTensor& t : ParameterLayout(shorter.model)) {
      const auto it = std::find_if(whole.begin(), whole.end(),
                                   [&](const ParamTensor& u) { return u.name == t.name; });
      ASSERT_NE(it, whole.end());
      sw.AddFloats(t.name, t.shape, w->params.data() + it->offset);  // wpe: its first rows
    }
    ASSERT_TRUE(sw.Write(cut + "/model.safetensors").ok());
    RunConfig by_hand = shorter;
    by_hand.train.init_from = cut;
    EXPECT_EQ(LossColumns(Run(by_hand, "short_by_hand")), LossColumns(s8));
  }
  shorter.train.init_from = hf;
  shorter.model.seq_len = 32;
  auto longer = TryRun(shorter, "longer");
  EXPECT_EQ(longer.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(longer.status().message().find("seq_len 16"), std::string::npos)
      << longer.status().ToString();
  // Another shape: refused, naming both.
  RunConfig wide = from;
  wide.model.n_embd = 32;
  auto r = TryRun(wide, "wide");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("n_embd 16"), std::string::npos) << r.status().ToString();
  from.train.init_from = root_ + "/missing";
  EXPECT_EQ(TryRun(from, "missing").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace atl
