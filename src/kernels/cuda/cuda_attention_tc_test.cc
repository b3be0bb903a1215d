// Attention on the tensor cores (attention_tc.cu, attention_tc_backward.cu) against the CPU's
// double path on the same inputs rounded to bf16, its block-row settings and its backward kinds
// against each other, and the settings timed. Skipped without a usable GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/attention_blocks.h"
#include "kernels/cuda/attention_tune.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

namespace atl::kernels::cuda {
namespace {

// Puts the block rows, the backward kind and its partial sums' limit back, whatever happens.
struct AttentionSettings {
  AttentionBlockRows rows = SetAttentionBlockRows({});
  AttentionBackwardKind kind = SetAttentionBackwardKind(AttentionBackwardKind::kSplit);
  size_t limit = SetAttentionPartialLimit(size_t(1) << 30);
  ~AttentionSettings() {
    SetAttentionBlockRows(rows);
    SetAttentionBackwardKind(kind);
    SetAttentionPartialLimit(limit);
  }
};

// GpuAttention's {out, lse, dqkv} and the bf16 copies of out and dqkv, filled with NaNs before.
struct AttentionRun {
  std::vector<std::vector<float>> got;
  std::vector<uint16_t> out16, dqkv16;
};
AttentionRun RunAttention(const AttentionCase& s, const AttentionInputs& in, GradInto into) {
  DeviceArray<uint16_t> out16(s.x()), dqkv16(3 * s.x());
  for (DeviceArray<uint16_t>* a : {&out16, &dqkv16}) {
    const std::vector<uint16_t> nan(a->size(), 0xffff);
    a->Upload(nan.data(), nan.size());
  }
  FillScratch(0xff);  // no value left from an earlier run passes for this one's
  AttentionRun r;
  r.got = GpuAttention(s, in, out16.data(), dqkv16.data(), nullptr, false, into);
  r.out16 = ToHost(out16);
  r.dqkv16 = ToHost(dqkv16);
  return r;
}
void ExpectSameBits(const AttentionRun& a, const AttentionRun& b) {
  for (size_t i = 0; i < a.got.size(); ++i) EXPECT_TRUE(SameBits(a.got[i], b.got[i])) << i;
  EXPECT_EQ(a.out16, b.out16);
  EXPECT_EQ(a.dqkv16, b.dqkv16);
}

// Columns from .. to of v's rows of `width`.
template <class T>
std::vector<T> Columns(const std::vector<T>& v, size_t width, size_t from, size_t to) {
  std::vector<T> c;
  for (size_t r = 0; r < v.size() / width; ++r)
    c.insert(c.end(), v.begin() + r * width + from, v.begin() + r * width + to);
  return c;
}

// The block-row cases: T under 64, a whole number of blocks, ending in the first half of a
// 128-row block (130, 300, 520) and in the second (100, 200, 250); head sizes 8 to 64.
constexpr AttentionCase kBlockCases[] = {
    {1, 1, 8, 2, 1},    {2, 40, 24, 1, 1},   {1, 100, 64, 1, 3},
    {1, 128, 64, 1, 1}, {2, 130, 128, 2, 3}, {1, 200, 64, 2, 1},
    {1, 250, 32, 2, 1}, {1, 300, 64, 2, 3},  {1, 520, 128, 2, 1}};

// Attention on the tensor cores: head sizes 4 to 64 (both paddings, 32 and 64), T from 1 to
// GPT-2's 1024 (16 tiles of the online softmax), rarely a multiple of 64; amp > 1 spreads the
// scores (a standard deviation of about 9 in the scaled scores, against 1). The reference is the
// CPU's double attention on the inputs rounded to bf16 (what the products see): lse within float
// rounding (its sums are float), out and the gradients within bf16's rounding of the probabilities;
// out is off the unrounded inputs' by bf16's error (the tensor cores ran); and two runs give the
// same bits. Both backward kinds (split and fused dQ).
TEST_F(CudaOps, Bf16AttentionOnTheTensorCores) {
  const Bf16On on;
  const AttentionSettings restore;
  for (const AttentionBackwardKind kind :
       {AttentionBackwardKind::kSplit, AttentionBackwardKind::kFused})
    for (const AttentionCase s :
         {AttentionCase{1, 1, 8, 2, 1}, AttentionCase{2, 7, 24, 1, 1},
          AttentionCase{1, 65, 64, 2, 1}, AttentionCase{2, 130, 80, 2, 1},
          AttentionCase{1, 200, 128, 2, 3}, AttentionCase{2, 64, 768, 12, 1},
          AttentionCase{1, 1024, 64, 1, 1}}) {
      SCOPED_TRACE(testing::Message() << s << " " << ToString(kind));
      SetAttentionBackwardKind(kind);
      const AttentionInputs in = RandomAttentionInputs(s, 121);
      const auto rq = Rounded(in.qkv), rdout = Rounded(in.dout);
      const AttentionReference want = CpuAttention(s, rq, &rdout, &in.dqkv0);
      const auto got = GpuAttention(s, in);
      EXPECT_LE(NormErr(got[0], want.out), 5e-3);
      EXPECT_LE(NormErr(got[1], RowLse(rq, s.B, s.T, s.C, s.NH)), kTol);
      ExpectIncrement("dqkv", got[2], in.dqkv0, want.dqkv, 5e-3);
      if (s.T > 1) {  // bf16's, not float's
        EXPECT_GT(NormErr(got[0], CpuAttention(s, in.qkv).out), 1e-4);
      }
      const auto again = GpuAttention(s, in);
      for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(SameBits(got[i], again[i])) << i;
    }
}

// The forward's bf16 operands kept for its backward (AttentionForward's keep): the same bits as
// the backward rounding qkv again, which it then reads no more (qkv spoiled between the two, the
// results stand; without keep they change), and rounds only dO (Bf16RoundedElements: 3 B T C
// for the forward's Q, K, V, and B T C for dO, not 4). Nothing to keep where the tensor cores do
// not run (float products, heads over 64): there qkv is read as before, and nothing rounded.
TEST_F(CudaOps, Bf16AttentionKeepsItsOperandsForTheBackward) {
  const AttentionCase h64{2, 70, 128, 2, 1}, h24{1, 33, 24, 1, 1}, h96{1, 20, 96, 1, 1};
  EXPECT_EQ(AttentionKeptElements(h64.B, h64.T, h64.C, h64.NH), 0u);  // float products
  const Bf16On on;
  // 3 B NH Tp D: Tp = T rounded up to 64, D = 64 or 32.
  EXPECT_EQ(AttentionKeptElements(h64.B, h64.T, h64.C, h64.NH), 3u * 2 * 2 * 128 * 64);
  EXPECT_EQ(AttentionKeptElements(h24.B, h24.T, h24.C, h24.NH), 3u * 1 * 1 * 64 * 32);
  EXPECT_EQ(AttentionKeptElements(h96.B, h96.T, h96.C, h96.NH), 0u);
  for (const AttentionCase& s : {h64, h24, h96}) {
    SCOPED_TRACE(testing::Message() << s);
    const AttentionInputs in = RandomAttentionInputs(s, 151);
    const uint64_t before = Bf16RoundedElements();
    const auto plain = GpuAttention(s, in);
    const uint64_t between = Bf16RoundedElements();
    const auto kept = GpuAttention(s, in, nullptr, nullptr, &s, /*spoil_qkv=*/true);
    const uint64_t after = Bf16RoundedElements();
    // Room for a larger batch and sequence, as a model sizes it for its largest micro-batch.
    const AttentionCase larger{s.B + 1, s.T + 70, s.C, s.NH, s.amp};
    const auto roomy = GpuAttention(s, in, nullptr, nullptr, &larger, /*spoil_qkv=*/true);
    const auto spoiled = GpuAttention(s, in, nullptr, nullptr, nullptr, /*spoil_qkv=*/true);
    EXPECT_FALSE(SameBits(spoiled[2], plain[2]));
    const bool tensor_cores = s.C / s.NH <= 64;
    EXPECT_EQ(between - before, tensor_cores ? 7 * s.x() : 0);
    EXPECT_EQ(after - between, tensor_cores ? 4 * s.x() : 0);
    for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(SameBits(kept[i], plain[i])) << i;
    EXPECT_EQ(SameBits(kept[2], plain[2]), tensor_cores);
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(SameBits(roomy[i], kept[i])) << i;
  }
}

// The blocks of 128 rows (SetAttentionBlockRows: the forward's and dQ's 128 queries, a warp's
// two row tiles of 16 sharing every fragment of K and V it reads; the dK/dV kernel's 128 keys,
// 8 warps sharing every Q, dO tile) give the bits of the blocks of 64: out, lse, dqkv (added to
// and written) and their bf16 copies, every output filled with NaNs before each run (so that one
// left unwritten differs); with either backward kind (split and fused dQ). T under 64, a whole
// number of blocks, ending in the first half of a 128-row block (a last block with one row tile
// of the head's: 130, 300, 520) and in the second (100, 200, 250); head sizes padded to 32 (16,
// 24, 32) and to 64; the scores spread (amp 3).
TEST_F(CudaOps, Bf16AttentionBlockRowsChangeNoBit) {
  EXPECT_THROW(SetAttentionBlockRows({96, 64}), std::invalid_argument);
  EXPECT_THROW(SetAttentionBlockRows({64, 32}), std::invalid_argument);
  const Bf16On on;
  const AttentionSettings restore;
  // Against 64/64: both kernels' 128 rows at once, then each alone (which kernel a setting
  // reaches cannot show in the bits: the bench times them).
  const AttentionBlockRows settings[] = {{64, 64}, {128, 128}, {128, 64}, {64, 128}};
  for (const AttentionCase s : kBlockCases) {
    SCOPED_TRACE(testing::Message() << s);
    const AttentionInputs in = RandomAttentionInputs(s, 161);
    for (const AttentionBackwardKind kind :
         {AttentionBackwardKind::kSplit, AttentionBackwardKind::kFused}) {
      SetAttentionBackwardKind(kind);
      for (const GradInto into : {GradInto::kAdd, GradInto::kWrite}) {
        AttentionRun got[std::size(settings)];
        for (size_t w = 0; w < std::size(settings); ++w) {
          SetAttentionBlockRows(settings[w]);
          got[w] = RunAttention(s, in, into);
        }
        for (size_t k = 1; k < std::size(settings); ++k) {
          SCOPED_TRACE(ToString(settings[k]) + " " + ToString(kind));
          ExpectSameBits(got[0], got[k]);
        }
      }
    }
  }
}

// The fused backward (dQ's partial sums per key block from the dK/dV kernel, added in key-block
// order) against the split one (dQ's own kernel) at every block-row setting: out, lse, dK, dV and
// their bf16 copies the same bits (the same kernels' arithmetic); dQ the same products of the
// same bf16 ds and K, summed in another order: within float rounding of the split's (not
// bf16's), and not its bits once a query sees keys of two blocks (T > 64: the fused sums ran).
// Scratch is filled with NaNs before each run. (Within 1e-5 assumes the split's dQ kernel, S = Q
// K^T, and the dK/dV kernel, its transpose K Q^T, give a score the same bits, as the emulator
// does; a GPU's tensor cores are expected to, summing the same 16 products.)
TEST_F(CudaOps, Bf16AttentionFusedBackward) {
  const Bf16On on;
  const AttentionSettings restore;
  // The block-row cases, and head sizes not a multiple of 4 (6, 30: the sums' last columns).
  std::vector<AttentionCase> cases(std::begin(kBlockCases), std::end(kBlockCases));
  cases.push_back({1, 90, 12, 2, 1});
  cases.push_back({2, 150, 60, 2, 3});
  for (const AttentionBlockRows rows : {AttentionBlockRows{64, 64}, AttentionBlockRows{128, 128}})
    for (const AttentionCase s : cases) {
      SCOPED_TRACE(testing::Message() << s << " " << ToString(rows));
      SetAttentionBlockRows(rows);
      const AttentionInputs in = RandomAttentionInputs(s, 171);
      for (const GradInto into : {GradInto::kAdd, GradInto::kWrite}) {
        SetAttentionBackwardKind(AttentionBackwardKind::kSplit);
        const AttentionRun split = RunAttention(s, in, into);
        SetAttentionBackwardKind(AttentionBackwardKind::kFused);
        const AttentionRun fused = RunAttention(s, in, into);
        for (int i = 0; i < 2; ++i) EXPECT_TRUE(SameBits(split.got[i], fused.got[i])) << i;
        EXPECT_EQ(split.out16, fused.out16);
        const size_t C = size_t(s.C), width = 3 * C;
        // dK, dV: the columns C .. 3C of each row; dQ: 0 .. C.
        EXPECT_TRUE(SameBits(Columns(split.got[2], width, C, width),
                             Columns(fused.got[2], width, C, width)));
        EXPECT_EQ(Columns(split.dqkv16, width, C, width), Columns(fused.dqkv16, width, C, width));
        const auto dq_split = Columns(split.got[2], width, 0, C);
        const auto dq_fused = Columns(fused.got[2], width, 0, C);
        EXPECT_LE(NormErr(dq_fused, D(dq_split)), kTol);
        if (s.T > 64) {
          EXPECT_FALSE(SameBits(dq_split, dq_fused));  // the fused sums ran
        }
      }
    }
}

// The fused backward over a batch too large for its partial sums' limit runs in parts of whole
// batch rows: the bits of one part, whatever the parts (3 rows as 1 + 1 + 1 and 2 + 1, at both
// key-row settings); under one row's partial sums, the split backward's bits.
TEST_F(CudaOps, Bf16AttentionFusedBackwardInParts) {
  const Bf16On on;
  const AttentionSettings restore;
  for (const AttentionBlockRows rows : {AttentionBlockRows{64, 64}, AttentionBlockRows{64, 128}})
    for (const AttentionCase s :
         {AttentionCase{3, 130, 128, 2, 3}, AttentionCase{3, 70, 48, 2, 1}}) {
      SCOPED_TRACE(testing::Message() << s << " " << ToString(rows));
      SetAttentionBlockRows(rows);
      const AttentionInputs in = RandomAttentionInputs(s, 181);
      const size_t row = AttentionPartialBytes(1, s.T, s.C, s.NH);
      EXPECT_EQ(AttentionPartialBytes(s.B, s.T, s.C, s.NH), s.B * row);
      for (const GradInto into : {GradInto::kAdd, GradInto::kWrite}) {
        SetAttentionBackwardKind(AttentionBackwardKind::kSplit);
        const AttentionRun split = RunAttention(s, in, into);
        SetAttentionBackwardKind(AttentionBackwardKind::kFused);
        SetAttentionPartialLimit(s.B * row);
        const AttentionRun whole = RunAttention(s, in, into);
        EXPECT_FALSE(SameBits(split.got[2], whole.got[2]));  // the fused sums ran
        for (const size_t limit : {row, 2 * row + row / 2}) {
          SCOPED_TRACE(limit / row);
          SetAttentionPartialLimit(limit);
          ExpectSameBits(whole, RunAttention(s, in, into));
        }
        SetAttentionPartialLimit(row - 1);
        ExpectSameBits(split, RunAttention(s, in, into));
      }
    }
}

// The block rows timed (TimeAttentionBlockRows, train.attention_rows = auto): under bf16 products
// every setting is timed, in kAttentionBlockRowsAll's order (whichever a round starts with), each
// a forward and a backward that took time, and the setting in force before is in force after.
// Where the attention does not run on the tensor cores (float products; heads over 64) nothing
// is timed and the reason is given.
TEST_F(CudaOps, TimeAttentionBlockRowsTimesEverySettingAndLeavesTheSetting) {
  const AttentionSettings restore;
  AttentionTimingOptions quick;  // the emulator's calls take tens of ms
  quick.warmup_s = 0;
  quick.min_steps = 1;
  quick.target_s = 0;
  quick.rounds = 2;
  {
    const Bf16On on;
    for (const AttentionBlockRows before : {AttentionBlockRows{128, 128}, AttentionBlockRows{}}) {
      SetAttentionBlockRows(before);
      const AttentionTimings t = TimeAttentionBlockRows(1, 70, 64, 2, quick);
      ASSERT_EQ(t.timed.size(), std::size(kAttentionBlockRowsAll));
      ASSERT_EQ(t.Totals().size(), t.timed.size());
      for (size_t i = 0; i < t.timed.size(); ++i) {
        EXPECT_EQ(ToString(t.timed[i].rows), ToString(kAttentionBlockRowsAll[i]));
        EXPECT_GT(t.timed[i].best.forward_s, 0);
        EXPECT_GT(t.timed[i].best.backward_s, 0);
        EXPECT_EQ(t.Totals()[i], t.timed[i].best.total());
      }
      EXPECT_TRUE(t.why_not.empty());
      EXPECT_EQ(ToString(SetAttentionBlockRows(before)), ToString(before));  // left in force
    }
    SetAttentionBlockRows({128, 64});
    const AttentionTimings wide = TimeAttentionBlockRows(1, 70, 256, 2, quick);  // heads of 128
    EXPECT_TRUE(wide.timed.empty());
    EXPECT_FALSE(wide.why_not.empty());
    EXPECT_EQ(ToString(SetAttentionBlockRows({})), "128/64");
  }
  SetAttentionBlockRows({64, 128});
  const AttentionTimings fp32 = TimeAttentionBlockRows(1, 70, 64, 2, quick);
  EXPECT_TRUE(fp32.timed.empty());
  EXPECT_NE(fp32.why_not.find("tensor cores"), std::string::npos) << fp32.why_not;
  EXPECT_EQ(ToString(SetAttentionBlockRows({})), "64/128");
}

}  // namespace
}  // namespace atl::kernels::cuda
