// Every op of kernels/cuda/ops.h against the CPU backend, in the style of ggml's
// test-backend-ops: random inputs on shapes from tiny and odd (1, 7, 13, 33) to GPT-2-like,
// the GPU's float result against the CPU's double path on the same inputs, by normalized error
// ||gpu - ref||₂ / ||ref||₂ ≤ 1e-5; the backward ops ADD into gradients that start non-zero; and
// every op run twice gives the same bits.
//
// Without a usable GPU (no device, no driver) every test is skipped, saying why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/ops.h"

namespace atl::kernels::cuda {
namespace {

namespace cpu = ::atl::kernels;

TEST_F(CudaOps, Matmul) {
  struct Shape {
    int N, IC, OC;
  };
  // 1000 rows: 16 chunks of the bias's sums, one in each slice (AddChunkSums).
  for (const Shape s : {Shape{1, 1, 1}, Shape{7, 13, 5}, Shape{33, 64, 96}, Shape{256, 768, 2304},
                        Shape{1000, 8, 40}}) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " IC=" << s.IC << " OC=" << s.OC);
    const auto inp = Random(size_t(s.N) * s.IC, 1), w = Random(size_t(s.IC) * s.OC, 2, 0.1f);
    const auto bias = Random(s.OC, 3), dout = Random(size_t(s.N) * s.OC, 4);
    const auto dinp0 = Random(inp.size(), 5), dw0 = Random(w.size(), 6), db0 = Random(s.OC, 7);
    auto di = D(inp), dw_ = D(w), db_ = D(bias), ddout = D(dout);
    std::vector<double> out(size_t(s.N) * s.OC), dinp = D(dinp0), dw = D(dw0), db = D(db0);
    cpu::MatmulForward(out.data(), di.data(), dw_.data(), db_.data(), s.N, s.IC, s.OC);
    cpu::MatmulBackward(dinp.data(), dw.data(), db.data(), ddout.data(), di.data(), dw_.data(), s.N,
                        s.IC, s.OC);
    auto g_inp = ToDevice(inp), g_w = ToDevice(w), g_b = ToDevice(bias), g_dout = ToDevice(dout);
    DeviceArray<float> g_out(out.size());
    auto g_dinp = ToDevice(dinp0), g_dw = ToDevice(dw0), g_db = ToDevice(db0);
    MatmulForward(g_out.data(), g_inp.data(), g_w.data(), g_b.data(), s.N, s.IC, s.OC);
    MatmulBackward(g_dinp.data(), g_dw.data(), g_db.data(), g_dout.data(), g_inp.data(), g_w.data(),
                   s.N, s.IC, s.OC);
    EXPECT_CLOSE(ToHost(g_out), out);
    EXPECT_INC(ToHost(g_dinp), dinp0, dinp);
    EXPECT_INC(ToHost(g_dw), dw0, dw);
    EXPECT_INC(ToHost(g_db), db0, db);
    // A bias only 4-byte aligned: added by the kernel instead of cuBLASLt's epilogue.
    std::vector<float> shifted(bias.size() + 1, 0.0f);
    std::copy(bias.begin(), bias.end(), shifted.begin() + 1);
    auto g_b4 = ToDevice(shifted);
    MatmulForward(g_out.data(), g_inp.data(), g_w.data(), g_b4.data() + 1, s.N, s.IC, s.OC);
    EXPECT_CLOSE(ToHost(g_out), out);
  }
}

TEST_F(CudaOps, LayerNorm) {
  struct Shape {
    int N, C;
  };
  // Widths to 2048 take the one-pass backward (every width of its table: 1, 2, 4, 8, 16, 24, 32,
  // 40, 48 and 64 columns a lane; odd row counts leave a warp's rows short, or a block's warps
  // without rows); 2049 the two-pass one. 1024 rows fill every slice of the weights' sums.
  for (const Shape s :
       {Shape{1, 2}, Shape{5, 7}, Shape{65, 768}, Shape{130, 33}, Shape{1000, 96}, Shape{9, 2048},
        Shape{17, 1600}, Shape{3, 2049}, Shape{11, 1100}, Shape{1024, 40}, Shape{3, 200},
        Shape{41, 500}, Shape{4, 1024}, Shape{6, 1500}}) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C);
    const size_t nc = size_t(s.N) * s.C;
    const auto inp = Random(nc, 11, 2.0f), w = Random(s.C, 12), b = Random(s.C, 13);
    const auto dout = Random(nc, 14), dinp0 = Random(nc, 15), dw0 = Random(s.C, 16),
               db0 = Random(s.C, 17);
    auto di = D(inp), dw_ = D(w), db_ = D(b), ddout = D(dout);
    std::vector<double> out(nc), mean(s.N), rstd(s.N), dinp = D(dinp0), dw = D(dw0), db = D(db0);
    cpu::LayerNormForward(out.data(), mean.data(), rstd.data(), di.data(), dw_.data(), db_.data(),
                          s.N, s.C);
    cpu::LayerNormBackward(dinp.data(), dw.data(), db.data(), ddout.data(), di.data(), dw_.data(),
                           mean.data(), rstd.data(), s.N, s.C);
    auto g_inp = ToDevice(inp), g_w = ToDevice(w), g_b = ToDevice(b), g_dout = ToDevice(dout);
    DeviceArray<float> g_out(nc), g_mean(s.N), g_rstd(s.N);
    auto g_dinp = ToDevice(dinp0), g_dw = ToDevice(dw0), g_db = ToDevice(db0);
    LayerNormForward(g_out.data(), g_mean.data(), g_rstd.data(), g_inp.data(), g_w.data(),
                     g_b.data(), s.N, s.C);
    LayerNormBackward(g_dinp.data(), g_dw.data(), g_db.data(), g_dout.data(), g_inp.data(),
                      g_w.data(), g_mean.data(), g_rstd.data(), s.N, s.C);
    EXPECT_CLOSE(ToHost(g_out), out);
    EXPECT_CLOSE(ToHost(g_mean), mean);
    EXPECT_CLOSE(ToHost(g_rstd), rstd);
    EXPECT_INC(ToHost(g_dinp), dinp0, dinp);
    EXPECT_INC(ToHost(g_dw), dw0, dw);
    EXPECT_INC(ToHost(g_db), db0, db);
    // Any of the three gradients alone: the same bits as when all are made.
    auto g_dw1 = ToDevice(dw0), g_db1 = ToDevice(db0), g_dinp1 = ToDevice(dinp0);
    LayerNormBackward(nullptr, g_dw1.data(), nullptr, g_dout.data(), g_inp.data(), g_w.data(),
                      g_mean.data(), g_rstd.data(), s.N, s.C);
    LayerNormBackward(nullptr, nullptr, g_db1.data(), g_dout.data(), g_inp.data(), g_w.data(),
                      g_mean.data(), g_rstd.data(), s.N, s.C);
    LayerNormBackward(g_dinp1.data(), nullptr, nullptr, g_dout.data(), g_inp.data(), g_w.data(),
                      g_mean.data(), g_rstd.data(), s.N, s.C);
    EXPECT_TRUE(SameBits(ToHost(g_dw1), ToHost(g_dw)));
    EXPECT_TRUE(SameBits(ToHost(g_db1), ToHost(g_db)));
    EXPECT_TRUE(SameBits(ToHost(g_dinp1), ToHost(g_dinp)));
  }
}

// The residual add fused into the LayerNorm that reads its sum: the same bits as ResidualForward
// then LayerNormForward, the sum written to a buffer of its own or over either addend (GPT writes
// it over the second), with and without the out's bf16 copy (under bf16 products), and the out
// left out (the copy alone).
TEST_F(CudaOps, ResidualLayerNormIsTheTwoOps) {
  const int N = 37, C = 200;
  const size_t nc = size_t(N) * C;
  const auto a = Random(nc, 21, 2.0f), b = Random(nc, 22), w = Random(C, 23), bias = Random(C, 24);
  auto g_w = ToDevice(w), g_bias = ToDevice(bias);
  for (const bool bf16 : {false, true})
    for (const int into : {0, 1, 2}) {  // the sum's place: its own, a, b
      SCOPED_TRACE(testing::Message() << "bf16 " << bf16 << " into " << into);
      SetBf16Matmul(bf16);
      auto run = [&](bool fused, bool with_out) {
        auto ga = ToDevice(a), gb = ToDevice(b);
        DeviceArray<float> own(nc), out(nc), mean(N), rstd(N);
        DeviceArray<uint16_t> out16(nc);
        float* res = into == 0 ? own.data() : into == 1 ? ga.data() : gb.data();
        float* o = with_out ? out.data() : nullptr;
        if (fused) {
          ResidualLayerNormForward(res, ga.data(), gb.data(), o, mean.data(), rstd.data(),
                                   g_w.data(), g_bias.data(), N, C, out16.data());
        } else {
          ResidualForward(res, ga.data(), gb.data(), nc);
          LayerNormForward(o, mean.data(), rstd.data(), res, g_w.data(), g_bias.data(), N, C,
                           out16.data());
        }
        std::vector<float> res_h(nc);
        CopyToHost(res_h.data(), res, nc * sizeof(float));
        std::vector<std::vector<float>> got{res_h, ToHost(mean), ToHost(rstd)};
        if (with_out) got.push_back(ToHost(out));
        if (bf16) {  // the copy's bits, compared as floats (written under bf16 products only)
          const auto bits = ToHost(out16);
          got.emplace_back(bits.begin(), bits.end());
        }
        return got;
      };
      const auto two = run(false, true), one = run(true, true);
      ASSERT_EQ(two.size(), one.size());
      for (size_t i = 0; i < two.size(); ++i) EXPECT_TRUE(SameBits(two[i], one[i])) << i;
      size_t sum_wrong = 0;  // and the sum is a + b
      for (size_t i = 0; i < nc; ++i) sum_wrong += one[0][i] != a[i] + b[i];
      EXPECT_EQ(sum_wrong, 0u);
      if (bf16) {  // the copy alone
        const auto alone = run(true, false);
        EXPECT_TRUE(SameBits(alone.back(), one.back()));
        EXPECT_TRUE(SameBits(alone[1], one[1]));
      }
      SetBf16Matmul(false);
    }
}

// Flash-style on the GPU (no probabilities: each row's lse) against the CPU's stored-probability
// attention. Head sizes 4 to 128 take every thread layout (1, 2, 4 threads per row); T from 1 to
// past several blocks' rows and keys' tiles, rarely a multiple of either; `amp` scales q and k
// so that scores pass 88, where expf overflows (a softmax without its running maximum fails).
TEST_F(CudaOps, Attention) {
  for (const AttentionCase s :
       {AttentionCase{1, 1, 4, 1, 1}, AttentionCase{2, 7, 12, 3, 1}, AttentionCase{3, 64, 64, 4, 1},
        AttentionCase{1, 129, 96, 2, 1}, AttentionCase{1, 300, 32, 1, 1},
        AttentionCase{1, 70, 256, 2, 1}, AttentionCase{2, 45, 192, 2, 1},
        AttentionCase{1, 100, 128, 2, 6}, AttentionCase{2, 256, 768, 12, 1}}) {
    SCOPED_TRACE(testing::Message() << s);
    const AttentionInputs in = RandomAttentionInputs(s, 21);
    const AttentionReference want = CpuAttention(s, in.qkv, &in.dout, &in.dqkv0);
    const auto got = GpuAttention(s, in);
    EXPECT_CLOSE(got[0], want.out);
    const auto lse = RowLse(in.qkv, s.B, s.T, s.C, s.NH);
    EXPECT_CLOSE(got[1], lse);
    if (s.amp > 1) {
      EXPECT_GT(*std::max_element(lse.begin(), lse.end()), 88.0);
    }
    EXPECT_INC(got[2], in.dqkv0, want.dqkv);
  }
}

TEST_F(CudaOps, AttentionRefusesHeadsOverItsLimit) {
  DeviceArray<float> qkv(3 * 160), out(160), lse(1);
  EXPECT_THROW(AttentionForward(out.data(), lse.data(), qkv.data(), 1, 1, 160, 1),
               std::invalid_argument);
}

TEST_F(CudaOps, GeluAndResidual) {
  for (const size_t n : {size_t(1), size_t(1000), size_t(100003)}) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    const auto x = Random(n, 31, 3.0f), y = Random(n, 32), dout = Random(n, 33);
    const auto d0 = Random(n, 34), d1 = Random(n, 35);
    auto dx = D(x), dy = D(y), ddout = D(dout);
    std::vector<double> gelu(n), dgelu = D(d0), res(n), da = D(d0), db = D(d1);
    cpu::GeluForward(gelu.data(), dx.data(), n);
    cpu::GeluBackward(dgelu.data(), dx.data(), ddout.data(), n);
    cpu::ResidualForward(res.data(), dx.data(), dy.data(), n);
    cpu::ResidualBackward(da.data(), db.data(), ddout.data(), n);
    auto g_x = ToDevice(x), g_y = ToDevice(y), g_dout = ToDevice(dout), g_dgelu = ToDevice(d0),
         g_da = ToDevice(d0), g_db = ToDevice(d1);
    DeviceArray<float> g_gelu(n), g_res(n);
    GeluForward(g_gelu.data(), g_x.data(), n);
    GeluBackward(g_dgelu.data(), g_x.data(), g_dout.data(), n);
    ResidualForward(g_res.data(), g_x.data(), g_y.data(), n);
    ResidualBackward(g_da.data(), g_db.data(), g_dout.data(), n);
    EXPECT_CLOSE(ToHost(g_gelu), gelu);
    EXPECT_INC(ToHost(g_dgelu), d0, dgelu);
    EXPECT_CLOSE(ToHost(g_res), res);
    EXPECT_INC(ToHost(g_da), d0, da);
    EXPECT_INC(ToHost(g_db), d1, db);
    // GELU in place (out aliases inp), as ops.h allows.
    GeluForward(g_x.data(), g_x.data(), n);
    EXPECT_CLOSE(ToHost(g_x), gelu);
  }
}

// GELU's backward summing the columns of what it writes into a bias gradient: the same bits as
// MatmulBackward's bias gradient of the written gradient (adding, and writing), and under bf16
// products with the float left out (the copy alone): the same copy and the same sums.
TEST_F(CudaOps, GeluBackwardSumsABiasGradient) {
  struct Shape {
    int rows, cols;
  };
  for (const bool bf16 : {false, true}) {
    SetBf16Matmul(bf16);
    for (const Shape s : {Shape{1, 1}, Shape{130, 33}, Shape{1000, 96}}) {
      SCOPED_TRACE(testing::Message()
                   << "rows=" << s.rows << " cols=" << s.cols << " bf16 " << bf16);
      const size_t n = size_t(s.rows) * s.cols;
      auto x = ToDevice(Random(n, 36, 3.0f)), dout = ToDevice(Random(n, 37));
      const auto d0 = Random(n, 38), db0 = Random(s.cols, 39);
      for (const GradInto into : {GradInto::kAdd, GradInto::kWrite}) {
        auto fused = ToDevice(d0), plain = ToDevice(d0), db_fused = ToDevice(db0),
             db_plain = ToDevice(db0);
        DeviceArray<uint16_t> copy_fused(n), copy_plain(n);
        GeluBackward(fused.data(), x.data(), dout.data(), n, copy_fused.data(), into,
                     db_fused.data(), s.cols);
        GeluBackward(plain.data(), x.data(), dout.data(), n, copy_plain.data(), into);
        MatmulBackward(nullptr, nullptr, db_plain.data(), plain.data(), nullptr, nullptr, s.rows, 1,
                       s.cols);
        EXPECT_TRUE(SameBits(ToHost(fused), ToHost(plain)));
        EXPECT_TRUE(SameBits(ToHost(db_fused), ToHost(db_plain)));
        EXPECT_FALSE(SameBits(ToHost(db_fused), db0));
        if (bf16) {
          EXPECT_EQ(ToHost(copy_fused), ToHost(copy_plain));
        }
        if (!bf16 || into == GradInto::kAdd) continue;
        auto db_alone = ToDevice(db0);
        DeviceArray<uint16_t> copy_alone(n);
        GeluBackward(nullptr, x.data(), dout.data(), n, copy_alone.data(), into, db_alone.data(),
                     s.cols);
        EXPECT_EQ(ToHost(copy_alone), ToHost(copy_plain));
        EXPECT_TRUE(SameBits(ToHost(db_alone), ToHost(db_plain)));
      }
    }
  }
  SetBf16Matmul(false);
  // A null dinp needs a copy to write and kWrite; the columns must divide n.
  DeviceArray<float> x(12), dout(12), db(5);
  EXPECT_THROW(GeluBackward(nullptr, x.data(), dout.data(), 12, nullptr, GradInto::kWrite),
               CudaError);
  EXPECT_THROW(
      GeluBackward(x.data(), x.data(), dout.data(), 12, nullptr, GradInto::kWrite, db.data(), 5),
      CudaError);
}

TEST_F(CudaOps, Encoder) {
  struct Shape {
    int B, T, C, V, begin, end;
  };
  // Few tokens (V = 3) repeat a lot; the last two are a vocabulary shard [10, 30) (wpe kept, then
  // absent).
  for (const Shape s :
       {Shape{2, 5, 7, 3, 0, -1}, Shape{4, 64, 48, 50, 0, -1}, Shape{3, 33, 16, 40, 10, 30}}) {
    for (const bool with_wpe : {true, false}) {
      if (!with_wpe && s.end < 0) continue;
      SCOPED_TRACE(testing::Message()
                   << "B=" << s.B << " T=" << s.T << " C=" << s.C << " V=" << s.V << " shard=["
                   << s.begin << "," << s.end << ") wpe=" << with_wpe);
      const int rows = s.end < 0 ? s.V : s.end - s.begin;
      const size_t n = size_t(s.B) * s.T;
      const auto tok = Tokens(n, s.V, 41);
      const auto wte = Random(size_t(rows) * s.C, 42), wpe = Random(size_t(s.T) * s.C, 43);
      const auto dout = Random(n * s.C, 44), dwte0 = Random(wte.size(), 45),
                 dwpe0 = Random(wpe.size(), 46);
      auto dwte_ = D(wte), dwpe_ = D(wpe), ddout = D(dout);
      std::vector<double> out(n * s.C), dwte = D(dwte0), dwpe = D(dwpe0);
      cpu::EncoderForward(out.data(), tok.data(), dwte_.data(), with_wpe ? dwpe_.data() : nullptr,
                          s.B, s.T, s.C, s.begin, s.end);
      cpu::EncoderBackward(dwte.data(), with_wpe ? dwpe.data() : nullptr, ddout.data(), tok.data(),
                           s.B, s.T, s.C, s.begin, s.end);
      auto g_tok = ToDevice(tok);
      auto g_wte = ToDevice(wte), g_wpe = ToDevice(wpe), g_dout = ToDevice(dout),
           g_dwte = ToDevice(dwte0), g_dwpe = ToDevice(dwpe0);
      DeviceArray<float> g_out(n * s.C);
      EncoderForward(g_out.data(), g_tok.data(), g_wte.data(), with_wpe ? g_wpe.data() : nullptr,
                     s.B, s.T, s.C, s.begin, s.end);
      EncoderBackward(g_dwte.data(), with_wpe ? g_dwpe.data() : nullptr, g_dout.data(),
                      g_tok.data(), tok.data(), s.B, s.T, s.C, s.begin, s.end);
      EXPECT_CLOSE(ToHost(g_out), out);
      EXPECT_INC(ToHost(g_dwte), dwte0, dwte);
      if (with_wpe)
        EXPECT_INC(ToHost(g_dwpe), dwpe0, dwpe);
      else
        EXPECT_TRUE(SameBits(ToHost(g_dwpe), dwpe0));
    }
  }
}

// The token groups go up by a queued copy: the host does not wait for the GPU (a wait would
// idle it at the end of every backward). (Its staging buffer is free again here: the GPU is
// waited for between the calls, as a step's loss makes the host wait between two of them.)
TEST_F(CudaOps, EncoderBackwardDoesNotWait) {
  const int B = 4, T = 64, C = 48, V = 50;
  const size_t n = size_t(B) * T;
  const std::vector<int32_t> first = Tokens(n, V, 51);
  const std::vector<int32_t> second = Tokens(n, V, 54);
  const auto dout = Random(n * C, 52), dwte0 = Random(size_t(V) * C, 53);
  auto ddout = D(dout);
  std::vector<double> dwte = D(dwte0);
  for (const auto* tok : {&first, &second})
    cpu::EncoderBackward(dwte.data(), static_cast<double*>(nullptr), ddout.data(), tok->data(), B,
                         T, C);
  auto g_dwte = ToDevice(dwte0), g_dout = ToDevice(dout);
  auto g_first = ToDevice(first), g_second = ToDevice(second);
  EncoderBackward(g_dwte.data(), nullptr, g_dout.data(), g_first.data(), first.data(), B, T, C);
  Synchronize();
  const uint64_t waits = Copied().waits;  // the scratch has grown by now
  EncoderBackward(g_dwte.data(), nullptr, g_dout.data(), g_second.data(), second.data(), B, T, C);
  EXPECT_EQ(Copied().waits, waits);
  EXPECT_INC(ToHost(g_dwte), dwte0, dwte);
}

TEST_F(CudaOps, Classifier) {
  struct Shape {
    int N, C, V;
  };
  for (const Shape s :
       {Shape{1, 4, 3}, Shape{17, 32, 1001}, Shape{64, 48, 5000}, Shape{1500, 64, 50257}}) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " V=" << s.V);
    const auto x = Random(size_t(s.N) * s.C, 51), wte = Random(size_t(s.V) * s.C, 52, 0.3f);
    const auto tgt = Tokens(s.N, s.V, 53);
    const auto dx0 = Random(x.size(), 54), dwte0 = Random(wte.size(), 55);
    auto dx_ = D(x), dwte_ = D(wte);
    std::vector<double> logits(size_t(s.N) * s.V), lse(s.N), losses(s.N), dx = D(dx0),
                                                                          dwte = D(dwte0);
    std::vector<double> scratch(std::max(cpu::ClassifierForwardScratch(s.N, s.V),
                                         cpu::ClassifierBackwardScratch(s.N, s.C, s.V)));
    const double loss =
        cpu::ClassifierForward(logits.data(), lse.data(), losses.data(), scratch.data(), dx_.data(),
                               dwte_.data(), tgt.data(), s.N, s.C, s.V);
    cpu::ClassifierBackward(dx.data(), dwte.data(), scratch.data(), logits.data(), lse.data(),
                            dx_.data(), dwte_.data(), tgt.data(), 1.0 / s.N, s.N, s.C, s.V);
    auto g_tgt = ToDevice(tgt);
    auto g_x = ToDevice(x), g_wte = ToDevice(wte), g_dx = ToDevice(dx0), g_dwte = ToDevice(dwte0);
    DeviceArray<float> g_logits(logits.size()), g_lse(s.N), g_losses(s.N);
    const float g_loss = ClassifierForward(g_logits.data(), g_lse.data(), g_losses.data(),
                                           g_x.data(), g_wte.data(), g_tgt.data(), s.N, s.C, s.V);
    ClassifierBackward(g_dx.data(), g_dwte.data(), g_logits.data(), g_lse.data(), g_x.data(),
                       g_wte.data(), g_tgt.data(), 1.0f / s.N, s.N, s.C, s.V);
    EXPECT_NEAR(g_loss, loss, kTol * std::abs(loss));
    EXPECT_CLOSE(ToHost(g_logits), logits);
    EXPECT_CLOSE(ToHost(g_lse), lse);
    EXPECT_CLOSE(ToHost(g_losses), losses);
    EXPECT_INC(ToHost(g_dx), dx0, dx);
    EXPECT_INC(ToHost(g_dwte), dwte0, dwte);
  }
}

// Logits in the hundreds, where exp overflows a float: the loss's one-pass softmax keeps a running
// maximum per thread and rescales as it rises (V = 1000: four columns a thread, some threads none
// when V < 256); float logits, and bf16 ones under bf16 products (within their rounding).
TEST_F(CudaOps, ClassifierLossOfLargeLogits) {
  for (const bool bf16 : {false, true})
    for (const int V : {1000, 100}) {
      SCOPED_TRACE(testing::Message() << "V " << V << (bf16 ? " bf16 logits" : " float logits"));
      const int N = 6, C = 16;
      const auto x = Random(size_t(N) * C, 56, 40.0f), wte = Random(size_t(V) * C, 57);
      const auto tgt = Tokens(N, V, 58);
      auto dx_ = D(x), dwte_ = D(wte);
      std::vector<double> logits(size_t(N) * V), lse(N), losses(N);
      std::vector<double> scratch(cpu::ClassifierForwardScratch(N, V));
      const double loss =
          cpu::ClassifierForward(logits.data(), lse.data(), losses.data(), scratch.data(),
                                 dx_.data(), dwte_.data(), tgt.data(), N, C, V);
      ASSERT_GT(*std::max_element(logits.begin(), logits.end()), 100.0);  // exp overflows a float
      auto g_x = ToDevice(x), g_wte = ToDevice(wte);
      auto g_tgt = ToDevice(tgt);
      DeviceArray<float> g_logits(logits.size()), g_lse(N), g_losses(N);
      DeviceArray<uint16_t> g_l16(size_t(N) * size_t(cpu::LogitsRowStride(V)));
      SetBf16Matmul(bf16);
      const float g_loss =
          ClassifierForward(g_logits.data(), g_lse.data(), g_losses.data(), g_x.data(),
                            g_wte.data(), g_tgt.data(), N, C, V, {}, bf16 ? g_l16.data() : nullptr);
      SetBf16Matmul(false);
      if (!bf16) {
        EXPECT_NEAR(g_loss, loss, kTol * std::abs(loss));
        EXPECT_CLOSE(ToHost(g_lse), lse);
        EXPECT_CLOSE(ToHost(g_losses), losses);
        continue;
      }
      // bf16 logits: lse and the losses those of the logits the loss read (widened, in double).
      const auto logits16 = WidenedLogits(ToHost(g_l16), N, size_t(V));
      const auto lse16 = RowLogSumExp(logits16, N, size_t(V));
      std::vector<double> losses16(N);
      for (int n = 0; n < N; ++n) losses16[n] = lse16[n] - logits16[size_t(n) * V + tgt[n]];
      EXPECT_CLOSE(ToHost(g_lse), lse16);
      EXPECT_CLOSE(ToHost(g_losses), losses16);
      EXPECT_NEAR(g_loss, loss, 1e-2 * std::abs(loss));  // and near the float product's
    }
}

// The optional arguments: no bias, gradients left out (null), logits without targets.
TEST_F(CudaOps, OptionalArguments) {
  const int N = 37, IC = 24, OC = 40, V = 301;
  const auto inp = Random(size_t(N) * IC, 91), w = Random(size_t(IC) * OC, 92, 0.1f);
  const auto dout = Random(size_t(N) * OC, 93), dw0 = Random(w.size(), 94);
  auto di = D(inp), dw_ = D(w), ddout = D(dout);
  std::vector<double> out(size_t(N) * OC), dw = D(dw0);
  cpu::MatmulForward(out.data(), di.data(), dw_.data(), static_cast<const double*>(nullptr), N, IC,
                     OC);
  cpu::MatmulBackward(static_cast<double*>(nullptr), dw.data(), static_cast<double*>(nullptr),
                      ddout.data(), di.data(), dw_.data(), N, IC, OC);
  auto g_inp = ToDevice(inp), g_w = ToDevice(w), g_dout = ToDevice(dout), g_dw = ToDevice(dw0);
  DeviceArray<float> g_out(out.size());
  MatmulForward(g_out.data(), g_inp.data(), g_w.data(), nullptr, N, IC, OC);
  MatmulBackward(nullptr, g_dw.data(), nullptr, g_dout.data(), g_inp.data(), g_w.data(), N, IC, OC);
  EXPECT_CLOSE(ToHost(g_out), out);
  EXPECT_INC(ToHost(g_dw), dw0, dw);

  // Logits only: the loss is 0 and lse, losses are not touched.
  const auto wte = Random(size_t(V) * IC, 95, 0.3f), marker = Random(N, 96);
  auto dwte_ = D(wte);
  std::vector<double> logits(size_t(N) * V);
  cpu::ClassifierForward(logits.data(), static_cast<double*>(nullptr),
                         static_cast<double*>(nullptr), static_cast<double*>(nullptr), di.data(),
                         dwte_.data(), nullptr, N, IC, V);
  auto g_wte = ToDevice(wte), g_lse = ToDevice(marker), g_losses = ToDevice(marker);
  DeviceArray<float> g_logits(logits.size());
  EXPECT_EQ(ClassifierForward(g_logits.data(), g_lse.data(), g_losses.data(), g_inp.data(),
                              g_wte.data(), nullptr, N, IC, V),
            0.0f);
  EXPECT_CLOSE(ToHost(g_logits), logits);
  EXPECT_TRUE(SameBits(ToHost(g_lse), marker));
  EXPECT_TRUE(SameBits(ToHost(g_losses), marker));
}

// AdamW against its formula (train/optimizer.h) in double, over segments with and without decay,
// a gap, and a shift between state and parameter coordinates.
TEST_F(CudaOps, AdamW) {
  const uint64_t n = 100003;
  // State [0, 40000) -> params [7, 40007) decaying; [40000, 60000) not updated (a gap);
  // [60000, n) -> params shifted by 7 as well, no decay.
  const std::vector<AdamSegment> segs = {{0, 40000, 7, 1}, {60000, n, 7, 0}};
  const auto p0 = Random(n + 7, 61), g = Random(n, 62, 0.01f);
  auto m0 = Random(n, 63, 0.001f), v0 = Random(n, 64, 1e-5f);
  for (float& x : v0) x = std::abs(x);
  const double lr = 3e-4, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, t = 3;
  const float scale = 0.5f;
  AdamScalars s{float(b1),
                float(1 - b1),
                float(b2),
                float(1 - b2),
                float(lr / (1 - std::pow(b1, t))),
                float(1 / std::sqrt(1 - std::pow(b2, t))),
                float(eps),
                float(1 - lr * wd),
                scale};
  std::vector<double> p = D(p0), m = D(m0), v = D(v0);
  for (const AdamSegment& seg : segs) {
    for (uint64_t i = seg.begin; i < seg.end; ++i) {
      const double gi = double(g[i]) * scale;
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      const double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(b2, t)) + eps;
      double& pi = p[i + seg.shift];
      pi = pi * (seg.decay ? 1 - lr * wd : 1.0) - lr / (1 - std::pow(b1, t)) * m[i] / denom;
    }
  }
  auto g_p = ToDevice(p0), g_g = ToDevice(g), g_m = ToDevice(m0), g_v = ToDevice(v0);
  auto g_segs = ToDevice(segs);
  const std::vector<float> marker(n, 42.0f);
  auto g_deltas = ToDevice(marker);
  AdamWStep(g_p.data(), g_g.data(), g_m.data(), g_v.data(), g_segs.data(), int(segs.size()), n, s,
            g_deltas.data());
  const auto got_p = ToHost(g_p), got_m = ToHost(g_m), got_v = ToHost(g_v);
  EXPECT_INC(got_p, p0, p);
  EXPECT_INC(got_m, m0, m);
  EXPECT_INC(got_v, v0, v);
  // The gap and the parameters before the shift are untouched, bitwise.
  for (uint64_t i = 40000; i < 60000; ++i) ASSERT_EQ(got_m[i], m0[i]) << i;
  for (uint64_t i = 0; i < 7; ++i) ASSERT_EQ(got_p[i], p0[i]) << i;
  for (uint64_t i = 40007; i < 60007; ++i) ASSERT_EQ(got_p[i], p0[i]) << i;
  // What each parameter moved (the gap not written), and its squares summed per segment.
  const auto deltas = ToHost(g_deltas);
  std::vector<double> want_sq(segs.size(), 0.0);
  for (size_t j = 0; j < segs.size(); ++j)
    for (uint64_t i = segs[j].begin; i < segs[j].end; ++i) {
      const double d = double(got_p[i + 7]) - double(p0[i + 7]);
      ASSERT_EQ(deltas[i], float(d)) << i;
      want_sq[j] += d * d;
    }
  for (uint64_t i = 40000; i < 60000; ++i) ASSERT_EQ(deltas[i], 42.0f) << i;
  std::vector<double> got_sq(segs.size(), -1.0);
  SegmentSquaredSums(got_sq.data(), g_deltas.data(), g_segs.data(), int(segs.size()));
  for (size_t j = 0; j < segs.size(); ++j) {
    EXPECT_GT(want_sq[j], 0.0);
    EXPECT_NEAR(got_sq[j], want_sq[j], 1e-6 * want_sq[j]) << j;
  }
}

TEST_F(CudaOps, GradSquaredSum) {
  for (const size_t n : {size_t(1), size_t(65537), size_t(3000001)}) {
    const auto g = Random(n, 71);
    double want = 0;
    for (float x : g) want += double(x) * double(x);
    auto dev = ToDevice(g);
    EXPECT_NEAR(GradSquaredSum(dev.data(), n), want, 1e-12 * want) << n;
  }
}

// Every op with a reduction, run twice on the same inputs: the same bits; with float products,
// and with bf16 products (and logits in bf16).
TEST_F(CudaOps, TwoRunsGiveTheSameBits) {
  const int B = 2, T = 128, C = 96, NH = 1, V = 3001, N = B * T;  // head size 96: 4 threads a row
  const auto qkv = Random(size_t(N) * 3 * C, 81), dout = Random(size_t(N) * C, 82);
  const auto w = Random(size_t(C) * 3 * C, 83, 0.1f), x = Random(size_t(N) * C, 84);
  const auto wte = Random(size_t(V) * C, 85, 0.3f);
  const auto tok = Tokens(N, 50, 86), tgt = Tokens(N, V, 87);
  auto run = [&](bool bf16) {
    SetBf16Matmul(bf16);
    std::vector<std::vector<float>> outs;
    auto g_qkv = ToDevice(qkv), g_dout = ToDevice(dout), g_w = ToDevice(w), g_x = ToDevice(x),
         g_wte = ToDevice(wte);
    auto g_tok = ToDevice(tok), g_tgt = ToDevice(tgt);
    DeviceArray<float> att(size_t(B) * NH * T), out(size_t(N) * C), dqkv(qkv.size());
    DeviceArray<float> dw(w.size()), db(3 * C), dx(x.size()), dwte(wte.size()), lnw(C), lnb(C);
    DeviceArray<float> logits(size_t(N) * V), lse(N), losses(N), mean(N), rstd(N);
    DeviceArray<uint16_t> logits16(size_t(N) * size_t(cpu::LogitsRowStride(V)));
    uint16_t* l16 = bf16 ? logits16.data() : nullptr;
    for (auto* a : {&dqkv, &dw, &db, &dx, &dwte, &lnw, &lnb}) a->SetZero();
    AttentionForward(out.data(), att.data(), g_qkv.data(), B, T, C, NH);
    AttentionBackward(dqkv.data(), g_dout.data(), out.data(), g_qkv.data(), att.data(), B, T, C,
                      NH);
    MatmulBackward(nullptr, dw.data(), db.data(), g_qkv.data(), g_x.data(), g_w.data(), N, C,
                   3 * C);
    LayerNormForward(out.data(), mean.data(), rstd.data(), g_x.data(), g_x.data(), g_x.data(), N,
                     C);
    LayerNormBackward(dx.data(), lnw.data(), lnb.data(), g_dout.data(), g_x.data(), g_x.data(),
                      mean.data(), rstd.data(), N, C);
    const float loss = ClassifierForward(logits.data(), lse.data(), losses.data(), g_x.data(),
                                         g_wte.data(), g_tgt.data(), N, C, V, {}, l16);
    ClassifierBackward(dx.data(), dwte.data(), logits.data(), lse.data(), g_x.data(), g_wte.data(),
                       g_tgt.data(), 1.0f / N, N, C, V, {}, GradInto::kAdd, l16);
    EncoderBackward(dwte.data(), nullptr, g_dout.data(), g_tok.data(), tok.data(), B, T, C);
    for (auto* a : {&att, &out, &dqkv, &dw, &db, &dx, &dwte, &lnw, &lnb, &lse})
      outs.push_back(ToHost(*a));
    outs.push_back({loss, float(GradSquaredSum(dwte.data(), dwte.size()))});
    SetBf16Matmul(false);
    return outs;
  };
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 products" : "float products");
    const auto a = run(bf16), b = run(bf16);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(SameBits(a[i], b[i])) << "output " << i;
  }
}

TEST(CudaRuntime, ProbeSaysWhyWithoutADevice) {
  const DeviceInfo info = Probe();
  if (info.count > 0) {
    EXPECT_FALSE(info.name.empty());
    EXPECT_GT(info.sm_count, 0);
    EXPECT_GT(info.memory_bytes, size_t(0));
  } else {
    EXPECT_FALSE(info.reason.empty());
    std::string why;
    EXPECT_FALSE(Available(&why));
    EXPECT_EQ(why, info.reason);
  }
}

}  // namespace
}  // namespace atl::kernels::cuda
