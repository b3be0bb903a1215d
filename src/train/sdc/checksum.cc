// GEMM column checksums (train/sdc/checksum.h).
#include "train/sdc/checksum.h"

#include <cmath>
#include <vector>

namespace atl {
namespace {

// Column j's sum g against the expected e: outside the bound (or non-finite where e is not), it
// fails; the first failing column is kept, and every one counted.
void Compare(int j, double g, double e, double bound, ChecksumMismatch* out) {
  const bool ok = std::isfinite(g) ? std::abs(g - e) <= bound : !std::isfinite(e);
  if (ok) return;
  if (out->column < 0) {
    out->column = j;
    out->got = g;
    out->expected = e;
    out->bound = bound;
  }
  ++out->columns_off;
}

}  // namespace

ChecksumMismatch CheckGemmColumns(const float* c, const float* a, const float* w, const float* bias,
                                  int rows, int inner, int cols, bool w_transposed,
                                  std::vector<double>* column_sums) {
  // 1ᵀA and 1ᵀ|A|, and the column sums of C, in double.
  std::vector<double> sa(size_t(inner), 0.0), abs_sa(size_t(inner), 0.0);
  std::vector<double> got(size_t(cols), 0.0);
  for (int i = 0; i < rows; ++i) {
    const float* ar = a + size_t(i) * size_t(inner);
    for (int k = 0; k < inner; ++k) {
      sa[size_t(k)] += double(ar[k]);
      abs_sa[size_t(k)] += std::abs(double(ar[k]));
    }
    const float* cr = c + size_t(i) * size_t(cols);
    for (int j = 0; j < cols; ++j) got[size_t(j)] += double(cr[j]);
  }
  // (1ᵀA)·W and (1ᵀ|A|)·|W|.
  std::vector<double> want(size_t(cols), 0.0), scale(size_t(cols), 0.0);
  if (w_transposed) {
    for (int j = 0; j < cols; ++j) {
      const float* wr = w + size_t(j) * size_t(inner);
      double s = 0, m = 0;
      for (int k = 0; k < inner; ++k) {
        s += sa[size_t(k)] * double(wr[k]);
        m += abs_sa[size_t(k)] * std::abs(double(wr[k]));
      }
      want[size_t(j)] = s;
      scale[size_t(j)] = m;
    }
  } else {
    for (int k = 0; k < inner; ++k) {
      const float* wr = w + size_t(k) * size_t(cols);
      const double s = sa[size_t(k)], m = abs_sa[size_t(k)];
      for (int j = 0; j < cols; ++j) {
        want[size_t(j)] += s * double(wr[j]);
        scale[size_t(j)] += m * std::abs(double(wr[j]));
      }
    }
  }
  // γ_n = n·u / (1 - n·u) for the n = inner + 1 terms of each element's sum (the bias is one),
  // plus the double sums' own error, and what underflow to subnormals can lose (2⁻¹⁵⁰ per
  // product).
  constexpr double kUnit = 0x1.0p-24;  // float's unit roundoff
  const double n = double(inner) + 1;
  const double factor = n * kUnit / (1 - n * kUnit) + (2.0 * rows + inner) * 0x1.0p-53;
  const double underflow = double(rows) * double(inner) * 0x1.0p-150;
  ChecksumMismatch out;
  for (int j = 0; j < cols; ++j) {
    double e = want[size_t(j)], m = scale[size_t(j)];
    if (bias != nullptr) {
      e += double(rows) * double(bias[j]);
      m += double(rows) * std::abs(double(bias[j]));
    }
    Compare(j, got[size_t(j)], e, factor * m + underflow, &out);
  }
  if (column_sums != nullptr) *column_sums = std::move(got);
  return out;
}

ChecksumMismatch CheckResidualColumns(const float* out, const float* x,
                                      const std::vector<double>& y_sums, int rows, int cols) {
  std::vector<double> got(size_t(cols), 0.0), xs(size_t(cols), 0.0), mag(size_t(cols), 0.0);
  for (int i = 0; i < rows; ++i) {
    const float* o = out + size_t(i) * size_t(cols);
    const float* xr = x + size_t(i) * size_t(cols);
    for (int j = 0; j < cols; ++j) {
      got[size_t(j)] += double(o[j]);
      xs[size_t(j)] += double(xr[j]);
      mag[size_t(j)] += std::abs(double(o[j])) + std::abs(double(xr[j]));
    }
  }
  constexpr double kUnit = 0x1.0p-24;
  // One rounding per element (u·|out| <= u·(|out| + |x|)), and the three double sums' (each
  // within rows·2⁻⁵³ of its magnitude; y's below |out| + |x| as y = out - x up to the rounding).
  const double factor = kUnit + 3.0 * (rows + 1) * 0x1.0p-53;
  ChecksumMismatch r;
  for (int j = 0; j < cols; ++j) {
    Compare(j, got[size_t(j)], xs[size_t(j)] + y_sums[size_t(j)],
            factor * mag[size_t(j)] + double(rows) * 0x1.0p-149, &r);
  }
  return r;
}

}  // namespace atl
