// GEMM checksums (algorithm-based fault tolerance, Huang & Abraham 1984): for C = A·W (+ 1·bᵀ),
// the column sums of C must equal (1ᵀA)·W (+ rows·b). Both sides cost a pass over A, C and W
// (rows·inner + rows·cols + inner·cols multiply-adds, against the GEMM's rows·inner·cols), so a
// silently wrong element of C is found right after the GEMM that made it, with its column.
//
// The two sides differ by float rounding even when C is right. The GEMM's own error bound
// (Higham, Accuracy and Stability of Numerical Algorithms, §3.5): each element of C is a sum of
// n = inner + 1 terms (the bias is one), within γ_n · (Σ_k |a_ik| |w_kj| + |b_j|) of exact,
// γ_n = n·u / (1 - n·u), u = 2⁻²⁴. Summed over the column's rows:
//     |Σ_i c_ij - ((1ᵀA)·W)_j - rows·b_j| <= γ_n · ((1ᵀ|A|)·|W| + rows·|b|)_j
// plus the double sums' own error ((2·rows + inner)·2⁻⁵³ of the same magnitude) and what
// underflow to subnormals can lose (rows·inner·2⁻¹⁵⁰). The bound holds for any summation order
// (blocking, threads, FMA), so a clean GEMM never fails it; it is a worst case, so a flip that
// moves an element by less than about inner·u times the column's magnitude passes (harmless
// ones: the low mantissa bits, or a large change to a tiny element). The column's magnitude
// grows with rows, so the same flip is harder to see in a GEMM of more rows: the campaign's
// numbers are for its model's shapes. A GEMM whose inputs were already corrupt upstream (a value
// that overflows to inf in a correct product) fails here too: the place named is then the first
// GEMM the corruption broke, not where it struck.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

namespace atl {

struct ChecksumMismatch {
  int64_t column = -1;  // -1: the checksums agree
  double got = 0, expected = 0, bound = 0;
  int64_t columns_off = 0;  // how many columns (of a block of rows) failed
};

// CheckGemmColumns compares the column sums of each block of this many rows of C on its own: the
// rounding bound grows with the rows summed, so blocks keep it that of a short GEMM's (a flip of
// an ordinary element stands out at any number of rows), for about rows / kGemmCheckRows times
// the work of the product 1ᵀA·W.
inline constexpr int kGemmCheckRows = 256;

// w_transposed = false: c[rows, cols] = a[rows, inner] · w[inner, cols] + bias[cols] (bias may
// be null). w_transposed = true: c = a · wᵀ with w[cols, inner] (a backward input gradient). A
// non-finite column sum fails unless the expected one is non-finite too.
// column_sums (may be null): receives C's column sums, in double.
ChecksumMismatch CheckGemmColumns(const float* c, const float* a, const float* w, const float* bias,
                                  int rows, int inner, int cols, bool w_transposed,
                                  std::vector<double>* column_sums = nullptr);

// The residual add's checksum: out[rows, cols] = fl(x + y) elementwise, where x is known and only
// y's column sums are (y_sums: the GEMM's whose product was added, CheckGemmColumns's
// column_sums, already checked). Each rounded add is within u·|out| of exact (u = 2⁻²⁴), so
//     |Σ_i out_ij - Σ_i x_ij - y_sums_j| <= u·Σ_i |out_ij|
// plus the double sums' own error. The bound is that of one add, not of a GEMM's inner products,
// so it is far tighter than CheckGemmColumns's: any flip that moves an element of the block's
// output by more than about rows·u times its column's mean magnitude fails it (every exponent
// and sign flip of any element that is not tiny next to its column).
ChecksumMismatch CheckResidualColumns(const float* out, const float* x,
                                      const std::vector<double>& y_sums, int rows, int cols);

}  // namespace atl
