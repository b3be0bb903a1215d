// GEMM column checksums (train/sdc/checksum.h).
#include "train/sdc/checksum.h"

#include <algorithm>
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
  // Per block of kGemmCheckRows rows: 1ᵀA and 1ᵀ|A|, and the column sums of C, in double.
  const int blocks = (rows + kGemmCheckRows - 1) / kGemmCheckRows;
  const size_t nb = size_t(std::max(blocks, 1)), ni = size_t(inner), nc = size_t(cols);
  std::vector<double> sa(nb * ni, 0.0), abs_sa(nb * ni, 0.0), got(nb * nc, 0.0);
  for (int64_t b = 0; b < int64_t(nb); ++b) {
    double* s = sa.data() + size_t(b) * ni;
    double* m = abs_sa.data() + size_t(b) * ni;
    double* g = got.data() + size_t(b) * nc;
    const int end = std::min(rows, int(b + 1) * kGemmCheckRows);
    for (int i = int(b) * kGemmCheckRows; i < end; ++i) {
      const float* ar = a + size_t(i) * ni;
      for (size_t k = 0; k < ni; ++k) {
        s[k] += double(ar[k]);
        m[k] += std::abs(double(ar[k]));
      }
      const float* cr = c + size_t(i) * nc;
      for (size_t j = 0; j < nc; ++j) g[j] += double(cr[j]);
    }
  }
  // (1ᵀA)·W and (1ᵀ|A|)·|W| per block, reading W once.
  std::vector<double> want(nb * nc, 0.0), scale(nb * nc, 0.0);
  // Columns in pieces of 64, so a piece's accumulators of every block stay in cache.
  constexpr size_t kPiece = 64;
  const int64_t pieces = int64_t((nc + kPiece - 1) / kPiece);
  if (w_transposed) {
    for (int64_t p = 0; p < pieces; ++p) {
      for (size_t j = size_t(p) * kPiece; j < std::min(nc, size_t(p + 1) * kPiece); ++j) {
        const float* wr = w + j * ni;
        for (size_t b = 0; b < nb; ++b) {
          const double* s = sa.data() + b * ni;
          const double* m = abs_sa.data() + b * ni;
          double x = 0, y = 0;
          for (size_t k = 0; k < ni; ++k) {
            x += s[k] * double(wr[k]);
            y += m[k] * std::abs(double(wr[k]));
          }
          want[b * nc + j] = x;
          scale[b * nc + j] = y;
        }
      }
    }
  } else {
    for (int64_t p = 0; p < pieces; ++p) {
      const size_t j0 = size_t(p) * kPiece, j1 = std::min(nc, j0 + kPiece);
      for (size_t k = 0; k < ni; ++k) {
        const float* wr = w + k * nc;
        for (size_t b = 0; b < nb; ++b) {
          const double s = sa[b * ni + k], m = abs_sa[b * ni + k];
          double* x = want.data() + b * nc;
          double* y = scale.data() + b * nc;
          for (size_t j = j0; j < j1; ++j) {
            x[j] += s * double(wr[j]);
            y[j] += m * std::abs(double(wr[j]));
          }
        }
      }
    }
  }
  // γ_n = n·u / (1 - n·u) for the n = inner + 1 terms of each element's sum (the bias is one),
  // plus the double sums' own error, and what underflow to subnormals can lose (2⁻¹⁵⁰ per
  // product).
  constexpr double kUnit = 0x1.0p-24;  // float's unit roundoff
  const double n = double(inner) + 1;
  ChecksumMismatch out;
  for (size_t b = 0; b < nb; ++b) {
    const int block_rows = std::min(kGemmCheckRows, rows - int(b) * kGemmCheckRows);
    const double factor = n * kUnit / (1 - n * kUnit) + (2.0 * block_rows + inner) * 0x1.0p-53;
    const double underflow = double(block_rows) * double(inner) * 0x1.0p-150;
    for (size_t j = 0; j < nc; ++j) {
      double e = want[b * nc + j], m = scale[b * nc + j];
      if (bias != nullptr) {
        e += double(block_rows) * double(bias[j]);
        m += double(block_rows) * std::abs(double(bias[j]));
      }
      Compare(int(j), got[b * nc + j], e, factor * m + underflow, &out);
    }
  }
  if (column_sums != nullptr) {
    column_sums->assign(nc, 0.0);
    for (size_t b = 0; b < nb; ++b)
      for (size_t j = 0; j < nc; ++j) (*column_sums)[j] += got[b * nc + j];
  }
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
