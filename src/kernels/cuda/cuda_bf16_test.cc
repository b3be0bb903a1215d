// bf16 on the GPU (SetBf16Matmul): the tensor cores' fragments (mma.cuh) against a plain
// product, the products through cuBLASLt, the classifier and the bf16 copies of activations
// against the CPU's double path on the same inputs rounded to bf16 (attention on the tensor
// cores: cuda_attention_tc_test.cc). Skipped without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <vector>

#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/ops.h"

namespace atl::kernels::cuda {
namespace {

namespace cpu = ::atl::kernels;

// One warp's tensor-core product through mma.cuh's fragment map, against the double product of
// the rounded operands. A map that swaps a row or column pair, or misses the high halves, is off
// by the whole product, not by rounding.
TEST_F(CudaOps, TensorCoreFragmentsHoldTheirElements) {
  const auto a = Random(16 * 16, 91), b = Random(16 * 8, 92), d0 = Random(16 * 8, 93);
  std::vector<double> want(d0.begin(), d0.end());
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 8; ++c)
      for (int k = 0; k < 16; ++k)
        want[size_t(r) * 8 + c] +=
            double(RoundBf16(a[size_t(r) * 16 + k])) * double(RoundBf16(b[size_t(k) * 8 + c]));
  auto ga = ToDevice(a), gb = ToDevice(b), gd = ToDevice(d0);
  Bf16TileProduct(gd.data(), ga.data(), gb.data());
  EXPECT_LE(NormErr(ToHost(gd), want), kTol);
  // A product's accumulators as the next product's A operand (attention's P V and dS K): a k order
  // that A and B share but the accumulators' columns do not would pass the product above, not this.
  const auto b16 = Random(16 * 16, 94), b2 = Random(16 * 8, 95);
  std::vector<double> chain(16 * 8, 0.0);
  for (int r = 0; r < 16; ++r)
    for (int k = 0; k < 16; ++k) {
      double p = 0;
      for (int j = 0; j < 16; ++j)
        p += double(RoundBf16(a[size_t(r) * 16 + j])) * double(RoundBf16(b16[size_t(j) * 16 + k]));
      const double rounded = RoundBf16(float(p));
      for (int c = 0; c < 8; ++c)
        chain[size_t(r) * 8 + c] += rounded * double(RoundBf16(b2[size_t(k) * 8 + c]));
    }
  auto gb16 = ToDevice(b16), gb2 = ToDevice(b2);
  DeviceArray<float> gchain(16 * 8);
  Bf16TileChain(gchain.data(), ga.data(), gb16.data(), gb2.data());
  EXPECT_LE(NormErr(ToHost(gchain), chain), 1e-3);
}

// ldmatrix (mma.cuh's LdMatrix4) against the PTX ISA's map of its fragments: lane l = 4 g + t
// gets in register i matrix i's (row g, columns 2t, 2t + 1), or transposed its (rows 2t, 2t + 1,
// column g), the lower element in the low half. On the emulator this holds its stand-in to the
// map the kernels are written for; on a GPU, the hardware.
TEST_F(CudaOps, LdMatrixFragmentsHoldTheirElements) {
  std::vector<uint16_t> m(4 * 8 * 8);
  for (size_t i = 0; i < m.size(); ++i) m[i] = uint16_t(1000 + i);
  auto gm = ToDevice(m);
  for (const bool trans : {false, true}) {
    DeviceArray<uint32_t> out(32 * 4);
    LdMatrixTiles(out.data(), gm.data(), trans);
    const auto got = ToHost(out);
    for (int l = 0; l < 32; ++l)
      for (int i = 0; i < 4; ++i) {
        const int g = l / 4, t = l % 4;
        const auto at = [&](int r, int c) { return uint32_t(m[size_t(i * 64 + r * 8 + c)]); };
        const uint32_t want =
            trans ? at(2 * t, g) | at(2 * t + 1, g) << 16 : at(g, 2 * t) | at(g, 2 * t + 1) << 16;
        EXPECT_EQ(got[size_t(4 * l + i)], want) << "trans " << trans << " lane " << l << " i " << i;
      }
  }
}

// bf16 products (SetBf16Matmul): against the double product of the operands rounded to bf16
// within float accumulation, both transposes, batched, alpha and beta with C read; not the float
// product (bf16's error shows against the unrounded operands); and the linear layer against the
// CPU's within bf16 rounding.
TEST_F(CudaOps, Bf16Products) {
  const Bf16On on;
  const int m = 33, n = 17, k = 70, batch = 2;
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "ta " << ta << " tb " << tb);
      // Row strides and batch strides with gaps: the converted extents keep the layout.
      const int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2;
      const int64_t sa = int64_t(ta ? k : m) * lda + 5, sb = int64_t(tb ? n : k) * ldb + 7;
      const auto a = Random(size_t(batch) * size_t(sa), 81);
      const auto b = Random(size_t(batch) * size_t(sb), 82);
      const auto c0 = Random(size_t(batch) * m * n, 83);
      std::vector<double> want(c0.size()), unrounded(c0.size());
      for (int i = 0; i < batch; ++i)
        for (int r = 0; r < m; ++r)
          for (int col = 0; col < n; ++col) {
            double s = 0, u = 0;
            for (int x = 0; x < k; ++x) {
              const float av =
                  a[size_t(i) * size_t(sa) + (ta ? size_t(x) * lda + r : size_t(r) * lda + x)];
              const float bv =
                  b[size_t(i) * size_t(sb) + (tb ? size_t(col) * ldb + x : size_t(x) * ldb + col)];
              s += double(RoundBf16(av)) * double(RoundBf16(bv));
              u += double(av) * double(bv);
            }
            const size_t o = size_t(i) * m * n + size_t(r) * n + col;
            want[o] = 0.5 * s + 2.0 * double(c0[o]);
            unrounded[o] = 0.5 * u + 2.0 * double(c0[o]);
          }
      auto ga = ToDevice(a), gb = ToDevice(b), gc = ToDevice(c0);
      Gemm(ta, tb, m, n, k, 0.5f, ga.data(), lda, gb.data(), ldb, 2.0f, gc.data(), n, batch, sa, sb,
           int64_t(m) * n);
      const auto got = ToHost(gc);
      EXPECT_LE(NormErr(got, want), kTol);
      EXPECT_GT(NormErr(got, unrounded), 1e-4);
    }
  const int N = 37, IC = 96, OC = 51;
  const auto inp = Random(size_t(N) * IC, 84), w = Random(size_t(IC) * OC, 85, 0.1f);
  const auto bias = Random(OC, 86);
  std::vector<double> ref(size_t(N) * OC);
  const auto di = D(inp), dw = D(w), db = D(bias);
  cpu::MatmulForward(ref.data(), di.data(), dw.data(), db.data(), N, IC, OC);
  auto g_inp = ToDevice(inp), g_w = ToDevice(w), g_b = ToDevice(bias);
  DeviceArray<float> g_out(ref.size());
  MatmulForward(g_out.data(), g_inp.data(), g_w.data(), g_b.data(), N, IC, OC);
  const double err = NormErr(ToHost(g_out), ref);
  EXPECT_LE(err, 1e-2);
  EXPECT_GT(err, kTol);  // bf16's, not float's
}

// The classifier with bf16 products: the logits against the double product of x and wte rounded
// to bf16; the gradients against the double products of the logits' gradient rounded to bf16
// (as the backward writes it) with x and wte rounded. N = 2700 at V = 50257 makes two backward
// tiles (2656 rows and 44: whole multiples of 32 rows at C = 4). Each operand is rounded once per
// op: the backward rounds wte once for every tile, and x once.
// Float logits, and logits kept in bf16 alone (logits_bf16: the float logits not written, here
// null): the bf16 ones within a bf16 rounding of the product, the loss's lse that of the logits it
// read, and the backward's gradients from them. The bf16 logits' products run over V rounded up to
// a multiple of 64 (wte's rows padded with zeros: aligned rows for cuBLASLt), so the padding
// columns of the logits are written, with zeros.
TEST_F(CudaOps, Bf16Classifier) {
  const Bf16On on;
  struct Shape {
    int N, C, V;
  };
  for (const bool half : {false, true})
    for (const Shape s : {Shape{17, 32, 1001}, Shape{2700, 4, 50257}}) {
      SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " V=" << s.V
                                      << (half ? " bf16 logits" : " float logits"));
      const size_t N = size_t(s.N), C = size_t(s.C), V = size_t(s.V);
      const auto x = Random(N * C, 131), wte = Random(V * C, 132, 0.3f);
      const auto tgt = Tokens(N, s.V, 133);
      const auto dx0 = Random(x.size(), 134), dwte0 = Random(wte.size(), 135);
      const auto rx = Rounded(x), rw = Rounded(wte);
      auto g_x = ToDevice(x), g_wte = ToDevice(wte), g_dx = ToDevice(dx0), g_dwte = ToDevice(dwte0);
      auto g_tgt = ToDevice(tgt);
      DeviceArray<float> g_logits(half ? 0 : N * V), g_lse(N), g_losses(N);
      const size_t ld = size_t(cpu::LogitsRowStride(s.V));  // bf16 logits' rows
      DeviceArray<uint16_t> g_l16(half ? N * ld : 0);
      float* logits_f = half ? nullptr : g_logits.data();
      uint16_t* l16 = half ? g_l16.data() : nullptr;
      ClassifierForward(logits_f, g_lse.data(), g_losses.data(), g_x.data(), g_wte.data(),
                        g_tgt.data(), s.N, s.C, s.V, {}, l16);
      const uint64_t rounded = Bf16RoundedElements();
      const float dloss = 1.0f / float(s.N);
      ClassifierBackward(g_dx.data(), g_dwte.data(), logits_f, g_lse.data(), g_x.data(),
                         g_wte.data(), g_tgt.data(), dloss, s.N, s.C, s.V, {}, GradInto::kAdd, l16);
      EXPECT_EQ(Bf16RoundedElements() - rounded, V * C + N * C);
      if (half) {  // the product ran over wte's rows padded with zero rows to ld (PaddedWeight)
        const auto bits = ToHost(g_l16);
        for (size_t n = 0; n < N; ++n)
          for (size_t v = V; v < ld; ++v) ASSERT_EQ(bits[n * ld + v], 0) << n << " " << v;
      }
      const auto logits = half ? WidenedLogits(ToHost(g_l16), N, V) : ToHost(g_logits);
      const auto lse = ToHost(g_lse), losses = ToHost(g_losses);
      const auto want_lse = RowLogSumExp(logits, N, V);
      std::vector<double> want_logits(N * V), dx = D(dx0), dwte = D(dwte0);
      for (size_t n = 0; n < N; ++n) {
        EXPECT_NEAR(losses[n], want_lse[n] - logits[n * V + size_t(tgt[n])], 1e-5) << n;
        for (size_t v = 0; v < V; ++v) {
          double l = 0;
          for (size_t c = 0; c < C; ++c) l += double(rx[n * C + c]) * double(rw[v * C + c]);
          want_logits[n * V + v] = l;
          // The backward's logit gradient from the GPU's own logits, rounded as it rounds it.
          const float p = std::exp(logits[n * V + v] - lse[n]);
          const double d = RoundBf16(dloss * (p - (int(v) == tgt[n] ? 1.0f : 0.0f)));
          for (size_t c = 0; c < C; ++c) {
            dx[n * C + c] += d * double(rw[v * C + c]);
            dwte[v * C + c] += d * double(rx[n * C + c]);
          }
        }
      }
      // bf16 logits: within a bf16 rounding (2^-9 relative) of the float product.
      EXPECT_LE(NormErr(logits, want_logits), half ? 1.0 / 512 : kTol);
      if (half) {
        EXPECT_GT(NormErr(logits, want_logits), kTol);  // rounded, not float
      }
      EXPECT_LE(NormErr(lse, want_lse), kTol);
      ExpectIncrement("dx", ToHost(g_dx), dx0, dx);
      ExpectIncrement("dwte", ToHost(g_dwte), dwte0, dwte);
    }
  {  // bf16 logits need bf16 products in the backward as in the forward.
    const int N = 3, C = 8, V = 40;
    auto x = ToDevice(Random(size_t(N) * C, 139)), wte = ToDevice(Random(size_t(V) * C, 140));
    auto tgt = ToDevice(Tokens(N, V, 141));
    DeviceArray<float> lse(N), losses(N), dx(size_t(N) * C);
    DeviceArray<uint16_t> l16(size_t(N) * size_t(cpu::LogitsRowStride(V)));
    ClassifierForward(nullptr, lse.data(), losses.data(), x.data(), wte.data(), tgt.data(), N, C, V,
                      {}, l16.data());
    SetBf16Matmul(false);
    EXPECT_THROW(ClassifierBackward(dx.data(), nullptr, nullptr, lse.data(), x.data(), wte.data(),
                                    tgt.data(), 1.0f, N, C, V, {}, GradInto::kWrite, l16.data()),
                 std::runtime_error);
    SetBf16Matmul(true);
  }
  // The linear layer's backward rounds dout once for its two products.
  const int N = 37, IC = 96, OC = 51;
  auto inp = ToDevice(Random(size_t(N) * IC, 136)), w = ToDevice(Random(size_t(IC) * OC, 137));
  auto dout = ToDevice(Random(size_t(N) * OC, 138));
  DeviceArray<float> dinp(size_t(N) * IC), dw(size_t(IC) * OC);
  Zero(dinp.data(), dinp.size() * 4);
  Zero(dw.data(), dw.size() * 4);
  const uint64_t rounded = Bf16RoundedElements();
  MatmulBackward(dinp.data(), dw.data(), nullptr, dout.data(), inp.data(), w.data(), N, IC, OC);
  EXPECT_EQ(Bf16RoundedElements() - rounded,
            uint64_t(N) * OC + uint64_t(IC) * OC + uint64_t(N) * IC);
}

// bf16 copies of activations (ops.h): LayerNorm, GELU and attention write their out rounded to
// bf16 beside the float (which is unchanged), and so do the LayerNorm, GELU and attention
// backwards their dinp and dqkv; the products that take such copies give bitwise what they give
// rounding the floats themselves, rounding only the weights. With float products no copy is
// written.
TEST_F(CudaOps, Bf16CopiesOfActivations) {
  const int N = 37, C = 64, Fl = 256, V = 1001;
  const auto x = Random(size_t(N) * C, 141), w = Random(C, 142), b = Random(C, 143);
  const auto h = Random(size_t(N) * Fl, 144);
  auto g_x = ToDevice(x), g_w = ToDevice(w), g_b = ToDevice(b), g_h = ToDevice(h);
  DeviceArray<float> ln(size_t(N) * C), mean(N), rstd(N), gelu(h.size());
  const std::vector<uint16_t> marker(h.size(), 0x7fc1);  // a NaN's bits: never a rounded value
  auto ln16 = ToDevice(std::vector<uint16_t>(marker.begin(), marker.begin() + N * C));
  auto gelu16 = ToDevice(marker);
  // Attention's copies, forward and backward, on the tensor cores (head size 32) and off them
  // (96: the float kernels, then a rounding pass): what the float results round to, the float
  // results unchanged; none with float products.
  auto attention = [&](const AttentionCase& s, bool bf16) {
    SCOPED_TRACE(testing::Message() << s << " bf16 " << bf16);
    const AttentionInputs in = RandomAttentionInputs(s, 145);
    auto out16 = ToDevice(std::vector<uint16_t>(s.x(), 0x7fc1));
    auto dqkv16 = ToDevice(std::vector<uint16_t>(3 * s.x(), 0x7fc1));
    const auto got = GpuAttention(s, in, out16.data(), dqkv16.data());
    const auto plain = GpuAttention(s, in);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(SameBits(got[i], plain[i])) << i;
    EXPECT_EQ(ToHost(out16), bf16 ? Bf16Bits(got[0]) : std::vector<uint16_t>(s.x(), 0x7fc1));
    EXPECT_EQ(ToHost(dqkv16), bf16 ? Bf16Bits(got[2]) : std::vector<uint16_t>(3 * s.x(), 0x7fc1));
  };
  const AttentionCase tc{2, 33, 64, 2, 1}, wide{1, 20, 96, 1, 1};

  // Float products: the copies are left alone.
  LayerNormForward(ln.data(), mean.data(), rstd.data(), g_x.data(), g_w.data(), g_b.data(), N, C,
                   ln16.data());
  GeluForward(gelu.data(), g_h.data(), h.size(), gelu16.data());
  EXPECT_EQ(ToHost(gelu16), marker);
  EXPECT_EQ(ToHost(ln16), std::vector<uint16_t>(marker.begin(), marker.begin() + N * C));
  attention(tc, false);
  const auto ln_float = ToHost(ln), gelu_float = ToHost(gelu);

  const Bf16On on;
  LayerNormForward(ln.data(), mean.data(), rstd.data(), g_x.data(), g_w.data(), g_b.data(), N, C,
                   ln16.data());
  GeluForward(gelu.data(), g_h.data(), h.size(), gelu16.data());
  EXPECT_TRUE(SameBits(ToHost(ln), ln_float));
  EXPECT_TRUE(SameBits(ToHost(gelu), gelu_float));
  EXPECT_EQ(ToHost(ln16), Bf16Bits(ln_float));
  EXPECT_EQ(ToHost(gelu16), Bf16Bits(gelu_float));
  // No float out: the copy alone, the same (and float products refuse it: nothing to write).
  auto ln16_only = ToDevice(std::vector<uint16_t>(size_t(N) * C, 0x7fc1));
  auto gelu16_only = ToDevice(marker);
  LayerNormForward(nullptr, mean.data(), rstd.data(), g_x.data(), g_w.data(), g_b.data(), N, C,
                   ln16_only.data());
  GeluForward(nullptr, g_h.data(), h.size(), gelu16_only.data());
  EXPECT_EQ(ToHost(ln16_only), Bf16Bits(ln_float));
  EXPECT_EQ(ToHost(gelu16_only), Bf16Bits(gelu_float));
  SetBf16Matmul(false);
  EXPECT_THROW(GeluForward(nullptr, g_h.data(), h.size(), gelu16_only.data()), std::runtime_error);
  EXPECT_THROW(LayerNormForward(nullptr, mean.data(), rstd.data(), g_x.data(), g_w.data(),
                                g_b.data(), N, C, ln16_only.data()),
               std::runtime_error);
  SetBf16Matmul(true);
  attention(tc, true);
  attention(wide, true);

  // The products on the copies: the same bits, only what has no copy rounded (the weights' copies
  // as the caller makes them: RoundToBf16).
  const auto wm = Random(size_t(Fl) * C, 146), bias = Random(C, 147);
  const auto dout = Random(size_t(N) * C, 148);
  auto g_wm = ToDevice(wm), g_bias = ToDevice(bias), g_dout = ToDevice(dout);
  DeviceArray<uint16_t> wm16(wm.size());
  RoundToBf16(wm16.data(), g_wm.data(), wm.size());
  EXPECT_EQ(ToHost(wm16), Bf16Bits(wm));
  auto linear = [&](const Bf16Copies& copy, uint64_t want_rounded) {
    DeviceArray<float> out(size_t(N) * C);
    auto dinp = ToDevice(std::vector<float>(h.size(), 0.5f));
    auto dw = ToDevice(std::vector<float>(wm.size(), 0.25f));
    const uint64_t before = Bf16RoundedElements();
    MatmulForward(out.data(), gelu.data(), g_wm.data(), g_bias.data(), N, Fl, C, copy);
    MatmulBackward(dinp.data(), dw.data(), nullptr, g_dout.data(), gelu.data(), g_wm.data(), N, Fl,
                   C, copy);
    EXPECT_EQ(Bf16RoundedElements() - before, want_rounded);
    return std::vector<std::vector<float>>{ToHost(out), ToHost(dinp), ToHost(dw)};
  };
  const uint64_t nw = uint64_t(Fl) * C, nh = uint64_t(N) * Fl, nd = uint64_t(N) * C;
  const auto plain = linear({}, nw + nh + nd + nw + nh);
  const auto copied = linear({gelu16.data()}, nw + nd + nw);
  const auto all = linear({gelu16.data(), nullptr, wm16.data()}, nd);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(SameBits(plain[i], copied[i])) << i;
    EXPECT_TRUE(SameBits(plain[i], all[i])) << i;
  }

  // The backwards' copies of dinp (after their addition), and a product on a dout copy.
  const auto dy = Random(size_t(N) * C, 151), dinp0 = Random(size_t(N) * C, 152);
  const auto dg = Random(h.size(), 153), dh0 = Random(h.size(), 154);
  auto g_dy = ToDevice(dy), g_dinp = ToDevice(dinp0), g_dg = ToDevice(dg), g_dh = ToDevice(dh0);
  DeviceArray<float> g_dlw(C), g_dlb(C);
  auto dinp16 = ToDevice(std::vector<uint16_t>(dy.size(), 0x7fc1));
  auto dh16 = ToDevice(marker);
  LayerNormBackward(g_dinp.data(), g_dlw.data(), g_dlb.data(), g_dy.data(), g_x.data(), g_w.data(),
                    mean.data(), rstd.data(), N, C, dinp16.data());
  GeluBackward(g_dh.data(), g_h.data(), g_dg.data(), h.size(), dh16.data());
  const auto dinp = ToHost(g_dinp), dh = ToHost(g_dh);
  EXPECT_EQ(ToHost(dinp16), Bf16Bits(dinp));
  EXPECT_EQ(ToHost(dh16), Bf16Bits(dh));
  auto g_dinp_again = ToDevice(dinp0), g_dh_again = ToDevice(dh0);
  LayerNormBackward(g_dinp_again.data(), nullptr, nullptr, g_dy.data(), g_x.data(), g_w.data(),
                    mean.data(), rstd.data(), N, C);
  GeluBackward(g_dh_again.data(), g_h.data(), g_dg.data(), h.size());
  EXPECT_TRUE(SameBits(ToHost(g_dinp_again), dinp));
  EXPECT_TRUE(SameBits(ToHost(g_dh_again), dh));
  auto backward = [&](const uint16_t* dout16, uint64_t want_rounded) {
    auto dx = ToDevice(std::vector<float>(size_t(N) * C, 0.5f));
    auto dw = ToDevice(std::vector<float>(size_t(C) * Fl, 0.25f));
    const uint64_t before = Bf16RoundedElements();
    // The product fed by the GELU's gradient: dout [N, Fl] (g_dh), inp [N, C] (ln).
    MatmulBackward(dx.data(), dw.data(), nullptr, g_dh.data(), ln.data(), g_wm.data(), N, C, Fl,
                   Bf16Copies{ln16.data(), dout16});
    EXPECT_EQ(Bf16RoundedElements() - before, want_rounded);
    return std::vector<std::vector<float>>{ToHost(dx), ToHost(dw)};
  };
  const auto plain_b = backward(nullptr, nh + nw), copied_b = backward(dh16.data(), nw);
  for (size_t i = 0; i < plain_b.size(); ++i) EXPECT_TRUE(SameBits(plain_b[i], copied_b[i])) << i;

  const auto wte = Random(size_t(V) * C, 149, 0.3f);
  const auto tgt = Tokens(N, V, 150);
  auto g_wte = ToDevice(wte);
  auto g_tgt = ToDevice(tgt);
  DeviceArray<uint16_t> wte16(wte.size());
  RoundToBf16(wte16.data(), g_wte.data(), wte.size());
  // half: bf16 logits (rows LogitsRowStride(V) apart), from `shift` elements past an aligned
  // place (2: the loss's and the gradient's scalar kernels instead of their 8-wide ones).
  const size_t ld = size_t(cpu::LogitsRowStride(V));
  auto classifier = [&](const Bf16Copies& copy, uint64_t want_rounded, bool half = false,
                        size_t shift = 0) {
    DeviceArray<float> logits(half ? 0 : size_t(N) * V), lse_c(N), losses(N);
    DeviceArray<uint16_t> l16(half ? size_t(N) * ld + shift : 0);
    float* lf = half ? nullptr : logits.data();
    uint16_t* lh = half ? l16.data() + shift : nullptr;
    auto dx = ToDevice(std::vector<float>(size_t(N) * C, 0.5f));
    auto dwte = ToDevice(std::vector<float>(wte.size(), 0.25f));
    const uint64_t before = Bf16RoundedElements();
    const float loss = ClassifierForward(lf, lse_c.data(), losses.data(), ln.data(), g_wte.data(),
                                         g_tgt.data(), N, C, V, copy, lh);
    ClassifierBackward(dx.data(), dwte.data(), lf, lse_c.data(), ln.data(), g_wte.data(),
                       g_tgt.data(), 1.0f / N, N, C, V, copy, GradInto::kAdd, lh);
    EXPECT_EQ(Bf16RoundedElements() - before, want_rounded);
    std::vector<float> widened;
    if (half) {
      const auto bits = ToHost(l16);
      for (size_t i = 0; i < size_t(N) * ld; ++i) widened.push_back(FromBf16Bits(bits[shift + i]));
    }
    return std::vector<std::vector<float>>{
        {loss}, half ? widened : ToHost(logits), ToHost(dx), ToHost(dwte), ToHost(lse_c)};
  };
  const uint64_t nv = uint64_t(V) * C;
  for (const bool half : {false, true}) {
    SCOPED_TRACE(half ? "bf16 logits" : "float logits");
    const auto plain_c = classifier({}, nv + nd + nv + nd, half);
    const auto copied_c = classifier({ln16.data()}, nv + nv, half);
    const auto all_c = classifier({ln16.data(), nullptr, wte16.data()}, 0, half);
    for (size_t i = 0; i < plain_c.size(); ++i) {
      EXPECT_TRUE(SameBits(plain_c[i], copied_c[i])) << i;
      EXPECT_TRUE(SameBits(plain_c[i], all_c[i])) << i;
    }
    if (!half) continue;
    // Logits 4-byte aligned: the product may take another plan (a float sum rounded to bf16 may
    // then differ by a bf16 step) and the loss sums in another order, so near, not the same bits.
    const auto shifted = classifier({ln16.data(), nullptr, wte16.data()}, 0, true, 2);
    for (size_t i = 0; i < plain_c.size(); ++i)
      EXPECT_LE(NormErr(shifted[i], D(plain_c[i])), 1.0 / 256) << i;
  }
}

}  // namespace
}  // namespace atl::kernels::cuda
