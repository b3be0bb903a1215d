// The fault injector: its spec language (and the refusals), and that each kind flips exactly the
// bit it names, where it names, once, or with a bad core's probability.
#include "train/sdc/faults.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "train/config.h"
#include "train/run.h"

namespace atl {
namespace {

TEST(Faults, ParsesEveryKindAndKey) {
  auto f = ParseFaults(
      "gemm_fwd:step=3,layer=1,gemm=2,micro=1,elem=77,bit=30 ; param:step=2,site=1,rank=3;"
      "moment:step=4,moment=v,bit=0;bad_core:p=0.25,rank=1;activation:step=5,layer=0;grad:step=6;"
      "gemm_bwd:step=7");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->size(), 7u);
  const FaultSpec& g = (*f)[0];
  EXPECT_EQ(g.kind, FaultKind::kGemmForward);
  EXPECT_EQ(g.step, 3);
  EXPECT_EQ(g.layer, 1);
  EXPECT_EQ(g.gemm, 2);
  EXPECT_EQ(g.micro, 1);
  EXPECT_EQ(g.elem, 77);
  EXPECT_EQ(g.bit, 30);
  EXPECT_EQ((*f)[1].kind, FaultKind::kParam);
  EXPECT_EQ((*f)[1].site, 1);
  EXPECT_EQ((*f)[1].rank, 3);
  EXPECT_EQ((*f)[1].bit, -1);  // drawn
  EXPECT_EQ((*f)[2].moment, 'v');
  EXPECT_EQ((*f)[3].kind, FaultKind::kBadCore);
  EXPECT_EQ((*f)[3].step, 1);  // from the first step
  EXPECT_DOUBLE_EQ((*f)[3].p, 0.25);
  EXPECT_EQ((*f)[4].kind, FaultKind::kActivation);
  EXPECT_EQ((*f)[5].kind, FaultKind::kGrad);
  EXPECT_EQ((*f)[6].kind, FaultKind::kGemmBackward);
  EXPECT_TRUE(ParseFaults("").value().empty());
  EXPECT_TRUE(ParseFaults(" ; ").value().empty());
}

TEST(Faults, RefusesBadSpecsNamingWhatIsWrong) {
  const std::pair<const char*, const char*> bad[] = {
      {"flip:step=1", "unknown kind"},
      {"param:step=1,color=red", "unknown key 'color'"},
      {"param:step=1,bit=32", "bit: 32 is out of range"},
      {"param:step=x", "step: expected an integer"},
      {"param:bit=3", "step is required"},
      {"param:step=0", "step: 0 is out of range"},
      {"param:step=2,layer=1", "layer, gemm and micro apply to"},
      {"grad:step=2,p=0.5", "p applies to bad_core only"},
      {"bad_core:rank=0", "bad_core needs p"},
      {"grad:step=2,stuck=1", "stuck applies to bad_core only"},
      {"bad_core:p=1,stuck=2", "stuck: 2 is out of range"},
      {"bad_core:p=1.5", "expected a probability"},
      {"moment:step=1,moment=w", "expected m or v"},
      {"activation:step=1,gemm=2", "gemm does not apply"},
      {"param:step=1,bit", "expected key=value"},
      {"param:step=1,moment=v", "moment applies to moment only"},
      {"grad:step=1,chunk=1", "chunk applies to wan only"},
      {"wan:step=1,rank=1", "rank must be 0"},
  };
  for (const auto& [text, why] : bad) {
    auto f = ParseFaults(text);
    ASSERT_FALSE(f.ok()) << text;
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(f.status().message().find(why), std::string::npos) << f.status().ToString();
    EXPECT_NE(f.status().message().find("faults.inject"), std::string::npos);
  }
}

TEST(Faults, TheConfigRefusesFaultsOutsideTheRun) {
  RunConfig c;
  c.faults.inject = "param:step=1,bit=30";
  EXPECT_TRUE(ValidateRunConfig(c).ok());
  const char* outside[] = {"param:step=1,site=1",
                           "param:step=1,rank=1",
                           "gemm_fwd:step=1,layer=4",
                           "param:step=301",
                           "bogus",
                           "wan:step=1"};
  for (const char* text : outside) {
    c.faults.inject = text;
    const Status s = ValidateRunConfig(c);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(s.message().find("faults.inject"), std::string::npos) << s.ToString();
  }
  c.faults.inject = "";
  c.faults.seed = -1;
  EXPECT_EQ(ValidateRunConfig(c).code(), StatusCode::kInvalidArgument);
  // [faults] reads from TOML and writes back.
  auto parsed = ParseRunConfig("[faults]\ninject = \"grad:step=2,bit=31\"\nseed = 5\n", "t.toml");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->faults.inject, "grad:step=2,bit=31");
  EXPECT_EQ(parsed->faults.seed, 5);
  auto again = ParseRunConfig(RunConfigToToml(*parsed), "again.toml");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *parsed);
  EXPECT_FALSE(ParseRunConfig("[faults]\nbits = 3\n", "t.toml").ok());
}

TEST(Faults, FlipBitFlipsExactlyThatBit) {
  float x = 1.0f;
  EXPECT_EQ(FlipBit(&x, 31), 1.0f);
  EXPECT_EQ(x, -1.0f);
  x = 1.0f;
  FlipBit(&x, 30);  // the exponent's top bit: 1.0 becomes infinity
  EXPECT_TRUE(std::isinf(x));
  x = 1.0f;
  FlipBit(&x, 0);
  EXPECT_EQ(std::bit_cast<uint32_t>(x), std::bit_cast<uint32_t>(1.0f) ^ 1u);
}

TEST(Faults, BufferFaultsStrikeTheirStepOnceAndOnlyTheirRank) {
  auto specs = ParseFaults(
                   "param:step=3,elem=10,bit=31;moment:step=3,moment=v,elem=1000004,bit=31;"
                   "param:step=3,rank=1,elem=0,bit=31;grad:step=2,elem=5,bit=22")
                   .value();
  FaultInjector inj(specs, 1, /*site=*/0, /*rank=*/0, /*layers=*/0, 2, "");
  std::vector<float> p(100, 2.0f), m(100, 3.0f), v(100, 4.0f), g(100, 5.0f);
  for (int64_t s = 0; s < 5; ++s) {
    for (int twice = 0; twice < 2; ++twice) {  // a redone step does not fire again
      inj.OnBuffer(FaultKind::kParam, s, p.data(), p.size());
      inj.OnBuffer(FaultKind::kMoment, s, m.data(), m.size(), 'm');
      inj.OnBuffer(FaultKind::kMoment, s, v.data(), v.size(), 'v');
      inj.OnBuffer(FaultKind::kGrad, s, g.data(), g.size());
    }
  }
  EXPECT_EQ(p[10], -2.0f);
  EXPECT_EQ(p[0], 2.0f);   // rank 1's fault
  EXPECT_EQ(v[4], -4.0f);  // 1000004 mod 100
  for (float x : m) EXPECT_EQ(x, 3.0f);
  EXPECT_EQ(std::bit_cast<uint32_t>(g[5]), std::bit_cast<uint32_t>(5.0f) ^ (1u << 22));
  ASSERT_EQ(inj.fired().size(), 3u);
  EXPECT_EQ(inj.fired()[0].kind, FaultKind::kGrad);  // step 2 came first
  EXPECT_EQ(inj.fired()[0].step, 2);
  EXPECT_EQ(inj.fired()[1].step, 3);
  EXPECT_EQ(inj.fired()[1].elem, 10);
  EXPECT_EQ(inj.fired()[1].before, 2.0f);
  EXPECT_EQ(inj.fired()[1].after, -2.0f);
}

// A wan fault flips a bit of the chunk it names among those its site sends from the start of its
// step's WAN work on (the transport's sender thread calls OnWanPayload), once; a drawn chunk is in
// 0..3.
TEST(Faults, AWanFaultFlipsTheNamedChunkOfItsStepOnce) {
  auto specs =
      ParseFaults("wan:step=3,site=1,chunk=2,elem=5,bit=31;wan:step=4,site=1,bit=30").value();
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].kind, FaultKind::kWan);
  EXPECT_EQ(specs[0].chunk, 2);
  EXPECT_EQ(FormatSpec(specs[0]), "wan:step=3,site=1,rank=0,elem=5,bit=31,chunk=2");
  FaultInjector other(specs, 7, /*site=*/0, /*rank=*/0, 0, 2, "");
  EXPECT_FALSE(other.has_wan());
  FaultInjector inj(specs, 7, /*site=*/1, /*rank=*/0, 0, 2, "");
  ASSERT_TRUE(inj.has_wan());
  auto payload = [] {
    std::string p(8 * sizeof(float), '\0');
    const std::vector<float> ones(8, 1.0f);
    std::memcpy(p.data(), ones.data(), p.size());
    return p;
  };
  auto word = [](const std::string& p, size_t i) {
    float x;
    std::memcpy(&x, p.data() + i * sizeof(float), sizeof x);
    return x;
  };
  std::vector<std::string> sent;
  for (int64_t s = 0; s < 5; ++s) {
    inj.At(s, 0);
    inj.AtWan(s);
    for (int c = 0; c < 4; ++c) {
      sent.push_back(payload());
      inj.OnWanPayload(/*to_site=*/0, &sent.back());
    }
  }
  // Step 3 (index 2), its third chunk (2 * 4 + 2), word 5: the sign.
  EXPECT_EQ(word(sent[10], 5), -1.0f);
  ASSERT_EQ(inj.fired().size(), 2u);
  EXPECT_EQ(inj.fired()[0].chunk, 2);
  EXPECT_EQ(inj.fired()[0].to_site, 0);
  EXPECT_EQ(inj.fired()[0].step, 3);
  const int64_t drawn = inj.fired()[1].chunk;
  ASSERT_GE(drawn, 0);
  ASSERT_LT(drawn, 4);
  EXPECT_TRUE(std::isinf(word(sent[size_t(12 + drawn)], size_t(inj.fired()[1].elem))));
  size_t changed = 0;
  for (const std::string& p : sent) changed += p != payload();
  EXPECT_EQ(changed, 2u);
  EXPECT_TRUE(inj.Unfired().empty());
}

TEST(Faults, DrawnPlacesDependOnlyOnTheSeed) {
  auto specs = ParseFaults("param:step=1;param:step=2;param:step=3;param:step=4").value();
  auto places = [&](uint64_t seed) {
    FaultInjector inj(specs, seed, 0, 0, 0, 2, "");
    std::vector<float> p(1 << 16, 1.0f);
    for (int64_t s = 0; s < 4; ++s) inj.OnBuffer(FaultKind::kParam, s, p.data(), p.size());
    std::vector<std::pair<int64_t, int>> out;
    for (const FaultRecord& r : inj.fired()) out.emplace_back(r.elem, r.bit);
    return out;
  };
  EXPECT_EQ(places(7), places(7));
  EXPECT_NE(places(7), places(8));
  EXPECT_EQ(places(7).size(), 4u);
}

// A model small enough to run in a test: 2 blocks.
struct TinyModel {
  GPTConfig cfg{.vocab_size = 32, .seq_len = 8, .n_layer = 2, .n_head = 2, .n_embd = 8};
  GPT<float> model{cfg, 2};
  std::vector<int32_t> x, y;
  TinyModel() {
    model.InitParameters(3);
    for (int i = 0; i < 16; ++i) {
      x.push_back(i % 32);
      y.push_back((i * 5 + 1) % 32);
    }
  }
  float Step() {
    model.ZeroGrad();
    const float loss = model.Forward(x.data(), y.data(), 2, 8);
    model.Backward();
    return loss;
  }
};

TEST(Faults, AGemmFaultFlipsTheNamedProductAndChangesWhatFollows) {
  struct Case {
    const char* spec;
    GPT<float>::OpKind kind;
    int layer, gemm;
  };
  using K = GPT<float>::OpKind;
  for (const Case& c :
       {Case{"gemm_fwd:step=1,layer=1,gemm=2,elem=9,bit=30", K::kGemmForward, 1, 2},
        Case{"gemm_bwd:step=1,layer=0,gemm=1,elem=9,bit=30", K::kGemmBackward, 0, 1},
        Case{"activation:step=1,layer=0,elem=9,bit=30", K::kActivation, 0, -1}}) {
    SCOPED_TRACE(c.spec);
    // The clean run's product at that point, and the faulty run's as the computation goes on.
    auto product_at = [&c](std::vector<float>* out) {
      return [&c, out](const GPT<float>::OpEvent& e) {
        if (e.kind == c.kind && e.layer == c.layer && e.gemm == c.gemm)
          out->assign(e.out, e.out + e.n);
      };
    };
    TinyModel clean, t;
    std::vector<float> clean_product, product;
    clean.model.set_op_hook(product_at(&clean_product));
    const float clean_loss = clean.Step();
    FaultInjector inj(ParseFaults(c.spec).value(), 1, 0, 0, 0, 2, "");
    auto after = product_at(&product);
    t.model.set_op_hook([&](const GPT<float>::OpEvent& e) {
      inj.OnOp(FaultKindOfOp(e.kind), e.layer, e.gemm, e.out, e.n);
      after(e);
    });
    inj.At(0, 0);
    const float loss = t.Step();
    ASSERT_EQ(inj.fired().size(), 1u);
    const FaultRecord& r = inj.fired()[0];
    EXPECT_EQ(r.elem, 9);
    EXPECT_EQ(r.bit, 30);
    EXPECT_EQ(r.layer, c.layer);
    EXPECT_EQ(r.gemm, c.gemm);
    // Exactly element 9 of that product differs from the clean run's, by bit 30.
    ASSERT_EQ(product.size(), clean_product.size());
    ASSERT_GT(product.size(), 9u);
    for (size_t i = 0; i < product.size(); ++i) {
      const uint32_t want = std::bit_cast<uint32_t>(clean_product[i]) ^ (i == 9 ? 1u << 30 : 0u);
      ASSERT_EQ(std::bit_cast<uint32_t>(product[i]), want) << i;
    }
    // A forward fault changes the loss; every fault changes some gradient.
    if (c.kind != K::kGemmBackward) {
      EXPECT_NE(loss, clean_loss);
    }
    bool differs = false;
    for (size_t i = 0; i < clean.model.num_params(); ++i)
      differs |= std::bit_cast<uint32_t>(t.model.grads()[i]) !=
                 std::bit_cast<uint32_t>(clean.model.grads()[i]);
    EXPECT_TRUE(differs);
    // The same step again (a redo) fires nothing: the product is the clean one.
    inj.At(0, 0);
    t.Step();
    EXPECT_EQ(inj.fired().size(), 1u);
    EXPECT_EQ(product, clean_product);
  }
}

TEST(Faults, ABadCoreCorruptsGemmsWithItsProbability) {
  for (double p : {1.0, 0.25}) {
    TinyModel t;
    FaultInjector inj(ParseFaults(fmt::format("bad_core:p={},bit=31,step=2", p)).value(), 4, 0, 0,
                      0, 2, "");
    t.model.set_op_hook([&](const GPT<float>::OpEvent& e) {
      inj.OnOp(FaultKindOfOp(e.kind), e.layer, e.gemm, e.out, e.n);
    });
    inj.At(0, 0);
    t.Step();
    EXPECT_TRUE(inj.fired().empty()) << "before its first step";
    const int steps = 40;
    for (int s = 1; s <= steps; ++s) {
      inj.At(s, 0);
      t.Step();
    }
    const double calls = steps * 2 * 2 * 4.0;  // steps x (fwd + bwd) x layers x GEMMs
    for (const FaultRecord& r : inj.fired()) {
      EXPECT_GE(r.gemm, 0);  // GEMMs only, never activations
      EXPECT_EQ(r.bit, 31);
    }
    if (p == 1.0) {
      EXPECT_EQ(double(inj.fired().size()), calls);
    } else {
      EXPECT_GT(double(inj.fired().size()), 0.15 * calls);
      EXPECT_LT(double(inj.fired().size()), 0.35 * calls);
    }
  }
}

// A stuck core strikes the same element and bit whenever it computes the same micro-batch of
// the same step again (a replay repeats it); a flaky one draws afresh. Another micro-batch: other
// draws.
TEST(Faults, AStuckCoreRepeatsItsFaultAndAFlakyOneDoesNot) {
  for (const bool stuck : {true, false}) {
    SCOPED_TRACE(stuck ? "stuck" : "flaky");
    TinyModel t;
    FaultInjector inj(
        ParseFaults(fmt::format("bad_core:p=1,layer=1,gemm=2,step=3{}", stuck ? ",stuck=1" : ""))
            .value(),
        4, 0, 0, 0, 2, "");
    t.model.set_op_hook([&](const GPT<float>::OpEvent& e) {
      inj.OnOp(FaultKindOfOp(e.kind), e.layer, e.gemm, e.out, e.n);
    });
    for (int run = 0; run < 2; ++run) {  // the step, then its replay
      inj.At(2, 5);
      t.Step();
    }
    inj.At(2, 6);  // another micro-batch of the step
    t.Step();
    const auto& f = inj.fired();
    ASSERT_EQ(f.size(), 6u);  // forward and backward GEMM 2 of block 1, three times
    for (int k = 0; k < 2; ++k) {
      const bool same =
          f[size_t(k)].elem == f[size_t(k) + 2].elem && f[size_t(k)].bit == f[size_t(k) + 2].bit;
      EXPECT_EQ(same, stuck) << "GEMM " << k;
      EXPECT_FALSE(f[size_t(k)].elem == f[size_t(k) + 4].elem &&
                   f[size_t(k)].bit == f[size_t(k) + 4].bit);
    }
  }
}

}  // namespace
}  // namespace atl
