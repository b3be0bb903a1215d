// GEMM column checksums (train/sdc/checksum.h) against the model's own GEMM kernels.
#include "train/sdc/checksum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "kernels/ops.h"
#include "train/sdc/faults.h"

namespace atl {
namespace {

// Values of mixed magnitude and sign, like activations: normal * 2^(-4..4).
std::vector<float> Random(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = RandomNormal(seed, 0, RngPurpose::kTest, i) *
           std::ldexp(1.0f, int(RandomBelow(seed, 1, RngPurpose::kTest, i, 9)) - 4);
  return v;
}

struct Gemm {
  int rows, inner, cols;
  std::vector<float> a, w, bias, c;
  // forward: c[rows, cols] = a[rows, inner] · w[inner, cols] + bias; backward: c = a · wᵀ with
  // w[cols, inner], through the kernels the model calls.
  Gemm(int r, int k, int n, bool backward, uint64_t seed)
      : rows(r),
        inner(k),
        cols(n),
        a(Random(size_t(r) * k, seed)),
        w(Random(size_t(k) * n, seed + 1)),
        bias(Random(size_t(n), seed + 2)),
        c(size_t(r) * n, 0.0f) {
    if (backward)
      kernels::MatmulBackward<float>(c.data(), nullptr, nullptr, a.data(), nullptr, w.data(), r, n,
                                     k);
    else
      kernels::MatmulForward<float>(c.data(), a.data(), w.data(), bias.data(), r, k, n);
  }
  ChecksumMismatch Check(bool backward) const {
    return CheckGemmColumns(c.data(), a.data(), w.data(), backward ? nullptr : bias.data(), rows,
                            inner, cols, backward);
  }
};

TEST(ChecksumTest, CleanGemmsPassForwardAndBackward) {
  // Shapes of the test model, tiny and small (rows = micro-batch x seq_len).
  const int shapes[][3] = {{32, 16, 48}, {32, 64, 16}, {1024, 192, 576}, {1024, 768, 192}};
  for (const auto& s : shapes) {
    for (bool backward : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << s[0] << "x" << s[1] << "x" << s[2] << (backward ? " backward" : " forward"));
      const Gemm g(s[0], s[1], s[2], backward, uint64_t(s[1] * 7 + backward));
      const ChecksumMismatch mm = g.Check(backward);
      EXPECT_EQ(mm.column, -1) << mm.got << " vs " << mm.expected << " bound " << mm.bound;
    }
  }
}

// Every exponent and sign flip of a column's largest element is caught, in its column; the
// lowest mantissa bits are below float rounding and pass (as they must: a clean GEMM differs from
// the checksum by as much).
TEST(ChecksumTest, FindsExponentAndSignFlipsInTheirColumn) {
  for (bool backward : {false, true}) {
    Gemm g(64, 96, 80, backward, 11);
    // Column 37's largest element: far above the rounding bound, which is about
    // (inner + 1)·2⁻²⁴ of the column's summed magnitude (the test's premise, checked below).
    size_t elem = 37;
    for (size_t row = 0; row < 64; ++row)
      if (std::abs(g.c[row * 80 + 37]) > std::abs(g.c[elem])) elem = row * 80 + 37;
    for (int bit = 23; bit <= 31; ++bit) {
      SCOPED_TRACE(::testing::Message() << "bit " << bit << (backward ? " backward" : ""));
      const float before = FlipBit(&g.c[elem], bit);
      const ChecksumMismatch mm = g.Check(backward);
      EXPECT_EQ(mm.column, 37);
      EXPECT_EQ(mm.columns_off, 1);
      EXPECT_GT(std::abs(mm.got - mm.expected), mm.bound);
      g.c[elem] = before;
    }
    FlipBit(&g.c[elem], 0);
    EXPECT_EQ(g.Check(backward).column, -1);
  }
}

TEST(ChecksumTest, NonFiniteOutputFails) {
  Gemm g(16, 32, 8, false, 3);
  g.c[3 * 8 + 2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(g.Check(false).column, 2);
  g.c[3 * 8 + 2] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(g.Check(false).column, 2);
}

// At small's shape (1024 rows) the column sums are compared per block of kGemmCheckRows rows, so
// the bound is a short GEMM's: a flip of any exponent or sign bit of a product at the 20th
// percentile of its column's magnitudes fails in its column, forward and backward (one column of
// one block), as at tiny's shape. (Summed over all 1024 rows, flips of bits 23-25 and 30 of that
// element stay within the bound.)
TEST(ChecksumTest, BlocksOfRowsFindEveryExponentFlipOfAnOrdinaryElementAtSmallsShape) {
  for (const auto& [rows, inner, cols] : {std::tuple{32, 64, 16}, std::tuple{1024, 768, 192}}) {
    for (bool backward : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << rows << "x" << inner << "x" << cols << (backward ? " backward" : " forward"));
      Gemm g(rows, inner, cols, backward, 11);
      ASSERT_EQ(g.Check(backward).column, -1);
      std::vector<std::pair<float, size_t>> col;
      for (int i = 0; i < rows; ++i)
        col.emplace_back(std::abs(g.c[size_t(i) * cols + 5]), size_t(i) * cols + 5);
      std::nth_element(col.begin(), col.begin() + rows / 5, col.end());
      const size_t elem = col[size_t(rows / 5)].second;
      for (int bit = 23; bit <= 31; ++bit) {
        SCOPED_TRACE(::testing::Message() << "bit " << bit);
        const float before = FlipBit(&g.c[elem], bit);
        const ChecksumMismatch mm = g.Check(backward);
        EXPECT_EQ(mm.column, 5);
        EXPECT_EQ(mm.columns_off, 1);
        g.c[elem] = before;
      }
    }
  }
}

// The residual add's checksum: a block output made by the model's kernel, x + a GEMM's product
// (whose column sums CheckGemmColumns returns), passes at the shapes of tiny and small; a flip of
// any exponent or sign bit of a median-sized element fails in its column, down to the lowest
// exponent bit (the GEMM's own bound is about inner times wider).
TEST(ChecksumTest, TheResidualAddFindsEveryExponentFlipOfAnOrdinaryElement) {
  for (const auto& [rows, inner, cols] : {std::tuple{32, 64, 16}, std::tuple{1024, 768, 192}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << inner << "x" << cols);
    Gemm g(rows, inner, cols, false, 5);
    std::vector<double> sums;
    ASSERT_EQ(g.Check(false).column, -1);
    CheckGemmColumns(g.c.data(), g.a.data(), g.w.data(), g.bias.data(), rows, inner, cols, false,
                     &sums);
    ASSERT_EQ(sums.size(), size_t(cols));
    const std::vector<float> x = Random(size_t(rows) * cols, 9);
    std::vector<float> out(x.size());
    kernels::ResidualForward<float>(out.data(), x.data(), g.c.data(), out.size());
    EXPECT_EQ(CheckResidualColumns(out.data(), x.data(), sums, rows, cols).column, -1);
    // An element of median magnitude in column 7.
    std::vector<std::pair<float, size_t>> col;
    for (int i = 0; i < rows; ++i)
      col.emplace_back(std::abs(out[size_t(i) * cols + 7]), size_t(i) * cols + 7);
    std::nth_element(col.begin(), col.begin() + rows / 2, col.end());
    const size_t elem = col[size_t(rows / 2)].second;
    for (int bit = 23; bit <= 31; ++bit) {
      SCOPED_TRACE(::testing::Message() << "bit " << bit);
      const float before = FlipBit(&out[elem], bit);
      const ChecksumMismatch mm = CheckResidualColumns(out.data(), x.data(), sums, rows, cols);
      EXPECT_EQ(mm.column, 7);
      EXPECT_EQ(mm.columns_off, 1);
      out[elem] = before;
    }
  }
}

}  // namespace
}  // namespace atl
