// GradInto::kWrite (kernels/grad_into.h): each backward that makes an input gradient (LayerNorm,
// the linear layer, GELU, attention, the classifier) writes it over a buffer full of NaN. A read
// of the old contents would leave NaN, and so would an element left unwritten; the result is the
// one the op gives adding to zeros (within float rounding: a product with beta 0 may run another
// cuBLASLt algorithm than one with beta 1). The parameter gradients are still added to, with the
// same bits as under kAdd; and the bf16 copy (bf16 products) is the written gradient rounded.
// Float and bf16 products. Skipped without a usable GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

namespace atl::kernels::cuda {
namespace {

// An op's backward: the input gradient into dinp (with its bf16 copy dinp16 when not null, as
// `into` says); returns the parameter gradients it added to (host copies).
using Backward =
    std::function<std::vector<std::vector<float>>(float* dinp, uint16_t* dinp16, GradInto into)>;

void ExpectWriteMatchesAdd(const char* what, size_t n, bool has_copy, const Backward& op) {
  SCOPED_TRACE(what);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const bool copy = has_copy && Bf16Matmul();
  auto written = ToDevice(std::vector<float>(n, nan)), added = ToDevice(std::vector<float>(n, 0));
  DeviceArray<uint16_t> copy_w(copy ? n : 0), copy_a(copy ? n : 0);
  const auto params_w = op(written.data(), copy ? copy_w.data() : nullptr, GradInto::kWrite);
  const auto params_a = op(added.data(), copy ? copy_a.data() : nullptr, GradInto::kAdd);
  const std::vector<float> got = ToHost(written), want = ToHost(added);
  size_t not_finite = 0;
  double norm = 0;
  for (size_t i = 0; i < n; ++i) {
    not_finite += std::isfinite(got[i]) ? 0 : 1;
    norm += double(want[i]) * want[i];
  }
  EXPECT_EQ(not_finite, 0u) << "elements read before written, or never written";
  EXPECT_GT(norm, 0.0);
  EXPECT_CLOSE(got, D(want));
  ASSERT_EQ(params_w.size(), params_a.size());
  for (size_t i = 0; i < params_w.size(); ++i)
    EXPECT_TRUE(SameBits(params_w[i], params_a[i])) << "parameter gradient " << i;
  if (copy) {
    EXPECT_EQ(ToHost(copy_w), Bf16Bits(got));
  }
}

TEST_F(CudaOps, BackwardsCanWriteTheirInputGradient) {
  for (const bool bf16 : {false, true}) {
    SetBf16Matmul(bf16);
    SCOPED_TRACE(bf16 ? "bf16 products" : "float products");
    {
      const int N = 13, C = 33;
      const size_t nc = size_t(N) * C;
      auto x = ToDevice(Random(nc, 201, 2.0f)), w = ToDevice(Random(C, 202)),
           b = ToDevice(Random(C, 203)), dout = ToDevice(Random(nc, 204));
      DeviceArray<float> out(nc), mean(N), rstd(N);
      LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
      const auto dw0 = Random(C, 205), db0 = Random(C, 206);
      ExpectWriteMatchesAdd("layernorm", nc, true, [&](float* dinp, uint16_t* d16, GradInto into) {
        auto dw = ToDevice(dw0), db = ToDevice(db0);
        LayerNormBackward(dinp, dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                          rstd.data(), N, C, d16, into);
        return std::vector<std::vector<float>>{ToHost(dw), ToHost(db)};
      });
    }
    struct Linear {
      int N, IC, OC;
    };
    for (const Linear s : {Linear{7, 13, 5}, Linear{33, 64, 96}}) {
      auto x = ToDevice(Random(size_t(s.N) * s.IC, 211)),
           w = ToDevice(Random(size_t(s.IC) * s.OC, 212, 0.1f)),
           dout = ToDevice(Random(size_t(s.N) * s.OC, 213));
      // The operands' bf16 copies too (read under bf16 products only).
      DeviceArray<uint16_t> x16(x.size()), w16(w.size()), dout16(dout.size());
      RoundToBf16(x16.data(), x.data(), x.size());
      RoundToBf16(w16.data(), w.data(), w.size());
      RoundToBf16(dout16.data(), dout.data(), dout.size());
      const auto dw0 = Random(size_t(s.IC) * s.OC, 214), db0 = Random(s.OC, 215);
      for (const bool copies : {false, true})
        ExpectWriteMatchesAdd(copies ? "matmul, copies" : "matmul", size_t(s.N) * s.IC, false,
                              [&](float* dinp, uint16_t*, GradInto into) {
                                auto dw = ToDevice(dw0), db = ToDevice(db0);
                                const Bf16Copies c =
                                    copies ? Bf16Copies{x16.data(), dout16.data(), w16.data()}
                                           : Bf16Copies{};
                                MatmulBackward(dinp, dw.data(), db.data(), dout.data(), x.data(),
                                               w.data(), s.N, s.IC, s.OC, c, into);
                                return std::vector<std::vector<float>>{ToHost(dw), ToHost(db)};
                              });
      // A null dout: only under bf16 products, from its copy, with no bias gradient to sum.
      DeviceArray<float> dinp(size_t(s.N) * s.IC), dw(w.size()), db(s.OC);
      const Bf16Copies c{x16.data(), dout16.data(), w16.data()};
      EXPECT_THROW(MatmulBackward(dinp.data(), dw.data(), db.data(), nullptr, x.data(), w.data(),
                                  s.N, s.IC, s.OC, c, GradInto::kWrite),
                   CudaError);
      if (bf16) {
        MatmulBackward(dinp.data(), dw.data(), nullptr, nullptr, x.data(), w.data(), s.N, s.IC,
                       s.OC, c, GradInto::kWrite);
      } else {
        EXPECT_THROW(MatmulBackward(dinp.data(), dw.data(), nullptr, nullptr, x.data(), w.data(),
                                    s.N, s.IC, s.OC, c, GradInto::kWrite),
                     CudaError);
      }
    }
    {
      const size_t n = 1001;
      auto x = ToDevice(Random(n, 221, 2.0f)), dout = ToDevice(Random(n, 222));
      ExpectWriteMatchesAdd("gelu", n, true, [&](float* dinp, uint16_t* d16, GradInto into) {
        GeluBackward(dinp, x.data(), dout.data(), n, d16, into);
        return std::vector<std::vector<float>>{};
      });
    }
    // Head size 16 (the tensor cores under bf16 products) and 96 (the float kernels).
    for (const AttentionCase s : {AttentionCase{2, 13, 32, 2, 1.0f}, {1, 9, 96, 1, 1.0f}}) {
      SCOPED_TRACE(testing::Message() << s);
      const AttentionInputs in = RandomAttentionInputs(s, 231);
      auto qkv = ToDevice(in.qkv), dout = ToDevice(in.dout);
      DeviceArray<float> out(s.x()), lse(size_t(s.B) * s.NH * s.T);
      AttentionForward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
      ExpectWriteMatchesAdd("attention", 3 * s.x(), true,
                            [&](float* dqkv, uint16_t* d16, GradInto into) {
                              AttentionBackward(dqkv, dout.data(), out.data(), qkv.data(),
                                                lse.data(), s.B, s.T, s.C, s.NH, d16, into);
                              return std::vector<std::vector<float>>{};
                            });
    }
    {
      const int N = 9, C = 16, V = 37;
      auto x = ToDevice(Random(size_t(N) * C, 241)), wte = ToDevice(Random(size_t(V) * C, 242));
      auto targets = ToDevice(Tokens(N, V, 243));
      DeviceArray<float> logits(size_t(N) * V), lse(N), losses(N);
      ClassifierForward(logits.data(), lse.data(), losses.data(), x.data(), wte.data(),
                        targets.data(), N, C, V);
      const auto dwte0 = Random(size_t(V) * C, 244);
      ExpectWriteMatchesAdd(
          "classifier", size_t(N) * C, false, [&](float* dx, uint16_t*, GradInto into) {
            auto dwte = ToDevice(dwte0);
            ClassifierBackward(dx, dwte.data(), logits.data(), lse.data(), x.data(), wte.data(),
                               targets.data(), 1.0f / N, N, C, V, {}, into);
            return std::vector<std::vector<float>>{ToHost(dwte)};
          });
    }
  }
  SetBf16Matmul(false);
}

}  // namespace
}  // namespace atl::kernels::cuda
