// Matrix products through cuBLASLt (Gemm) and the linear layer over them (MatmulForward and
// MatmulBackward of ops.h).
//
// Gemm's row-major product is cuBLASLt's column-major one with the operands swapped: a row-major
// [r, c] matrix with row stride ld is a column-major [c, r] one with leading dimension ld, so
// c = op(a)·op(b) (row-major) is cᵀ = op(b)ᵀ·op(a)ᵀ (column-major).
//
// Each distinct problem (shape, strides, transposes, pointer alignment, beta, bias) gets one plan,
// chosen once by cuBLASLt's heuristic and kept: the same problem always runs the same algorithm,
// with a workspace of fixed size, on the one stream. cuBLAS promises bitwise-identical results
// run to run on those terms (same toolkit, same GPU architecture and SM count).
//
// bf16 products (SetBf16Matmul): each operand's extent is rounded to bf16 into scratch (to
// nearest, ties to even) and cuBLASLt multiplies the bf16 copies, accumulating and writing float
// (CUBLAS_COMPUTE_32F, C and D float): the tensor cores' rate, with the sums and the result of
// float precision. Ops whose products share an operand round it once (Bf16Operands, GemmBf16 in
// common.cuh): the linear layer's backward its dout, the classifier's backward wte and x.
//
// The linear layer's bias is added by cuBLASLt's epilogue (CUBLASLT_EPILOGUE_BIAS: D = product +
// bias, broadcast over the rows of our row-major out, in float), so out is written once instead
// of written, read and written again by a kernel of its own. A bias under 16-byte alignment, or a
// problem cuBLASLt has no algorithm for with the epilogue, falls back to that kernel (AddBias).
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <map>
#include <tuple>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace atl::kernels::cuda {
namespace {

// ..., align_bias: the bias's alignment (0: no bias epilogue), out_bf16: C and D bf16.
using Key = std::tuple<bool, bool, int, int, int, int64_t, int64_t, int64_t, int, int64_t, int64_t,
                       int64_t, uint32_t, uint32_t, uint32_t, bool, bool, uint32_t, bool>;

bool bf16_products = false;
uint64_t bf16_rounded = 0;

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;  // false: cuBLASLt has no algorithm (only asked with a bias epilogue)
};

cublasLtMatrixLayout_t Layout(cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld,
                              int batch, int64_t stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  ATL_CUBLAS(cublasLtMatrixLayoutCreate(&layout, type, rows, cols, ld));
  if (batch > 1) {
    const int32_t count = batch;
    ATL_CUBLAS(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                sizeof(count)));
    ATL_CUBLAS(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &stride, sizeof(stride)));
  }
  return layout;
}

// The plan of a problem; with a bias epilogue (align_bias > 0), `bias` is a pointer of that
// alignment, which cuBLASLt's heuristic reads to choose.
const Plan& GetPlan(const Key& key, const float* bias) {
  static std::map<Key, Plan> plans;
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;
  const auto [ta, tb, m, n, k, lda, ldb, ldc, batch, sa, sb, sc, align_a, align_b, align_c,
              accumulate, bf16, align_bias, out_bf16] = key;
  const cudaDataType_t in = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  Plan p;
  ATL_CUBLAS(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // cuBLASLt's A is our b, its B our a (see the top of the file).
  const cublasOperation_t op_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  ATL_CUBLAS(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  ATL_CUBLAS(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (align_bias > 0) {
    const uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = CUDA_R_32F;
    ATL_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                              sizeof(epilogue)));
    ATL_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                              &bias_type, sizeof(bias_type)));
    ATL_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                              sizeof(bias)));
  }
  // Stored (column-major) shapes: cuBLASLt's A is n x k (k x n when transposed), B is k x m.
  p.a = tb ? Layout(in, k, n, ldb, batch, sb) : Layout(in, n, k, ldb, batch, sb);
  p.b = ta ? Layout(in, m, k, lda, batch, sa) : Layout(in, k, m, lda, batch, sa);
  p.c = Layout(out_bf16 ? CUDA_R_16BF : CUDA_R_32F, n, m, ldc, batch, sc);

  cublasLtMatmulPreference_t pref = nullptr;
  ATL_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t workspace = kBlasWorkspaceBytes;
  ATL_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &workspace, sizeof(workspace)));
  // Our b is its A, our a its B.
  ATL_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                  &align_b, sizeof(align_b)));
  ATL_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                  &align_a, sizeof(align_a)));
  ATL_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                  &align_c, sizeof(align_c)));
  ATL_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                  &align_c, sizeof(align_c)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(BlasLt(), p.desc, p.a, p.b, p.c, p.c,
                                                           pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  p.found = st == CUBLAS_STATUS_SUCCESS && found > 0;
  if (!p.found && align_bias == 0)
    ThrowCuda("cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__,
              "no cuBLASLt algorithm for this product");
  p.algo = result.algo;
  (void)accumulate;
  return plans.emplace(key, p).first->second;
}

// out[r, c] += bias[c] over a row-major [rows, cols] matrix.
__global__ void AddBias(float* out, const float* bias, int64_t rows, int cols) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  out[i] += bias[i % cols];
}

// dst[i] = src[i] rounded to bf16, four a thread (Quad, common.cuh).
__global__ void ToBf16(__nv_bfloat16* dst, const float* src, size_t n, bool aligned) {
  const Quad q = QuadOf(n, aligned);
  if (q.count == 0) return;
  float x[4];
  LoadQuad(x, src, q);
  StoreQuad(dst, x, q);
}

// Elements from a row-major operand's first to one past its last: `rows` rows of `cols` at row
// stride ld, `batch` times at `stride`.
int64_t Extent(int64_t rows, int64_t cols, int64_t ld, int batch, int64_t stride) {
  return (batch > 1 ? int64_t(batch - 1) * stride : 0) + (rows - 1) * ld + cols;
}

}  // namespace

void SetBf16Matmul(bool on) { bf16_products = on; }
bool Bf16Matmul() { return bf16_products; }
uint64_t Bf16RoundedElements() { return bf16_rounded; }
void CountBf16Rounded(uint64_t n) { bf16_rounded += n; }

__nv_bfloat16* Bf16Copy(uint16_t* p) {
  return bf16_products ? reinterpret_cast<__nv_bfloat16*>(p) : nullptr;
}

void RoundToBf16(uint16_t* dst, const float* src, size_t n) {
  if (n == 0) return;
  ATL_LAUNCH(ToBf16, QuadBlocks(n, 256), 256, reinterpret_cast<__nv_bfloat16*>(dst), src, n,
             QuadAligned({src}, {dst}));
  CountBf16Rounded(n);
}

Bf16Operands::Bf16Operands(std::initializer_list<int64_t> counts) {
  if (counts.size() > 4) ThrowCuda("Bf16Operands", __FILE__, __LINE__, "at most 4 operands");
  int64_t total = 0;
  for (const int64_t n : counts) {
    offsets_[size_] = total;
    counts_[size_++] = n;
    total += (n + 127) / 128 * 128;  // the next one 256-byte aligned
  }
  if (total > 0)
    base_ =
        static_cast<__nv_bfloat16*>(Scratch(kScratchGemm, size_t(total) * sizeof(__nv_bfloat16)));
}

const __nv_bfloat16* Bf16Operands::Round(int i, const float* src, int64_t n) {
  if (i < 0 || i >= size_ || n > counts_[i])
    ThrowCuda("Bf16Operands::Round", __FILE__, __LINE__, "an operand larger than its room");
  __nv_bfloat16* dst = base_ + offsets_[i];
  if (n > 0) RoundToBf16(reinterpret_cast<uint16_t*>(dst), src, size_t(n));
  return dst;
}

namespace {

// The product of Gemm and GemmBf16, on operands of the given type; with `bias` (n floats, batch
// 1) added to every row of c by the epilogue where it is 16-byte aligned and cuBLASLt has an
// algorithm for it, the product alone otherwise. Returns whether the bias was added. out_bf16
// (bf16 operands, no bias): c is bf16, the float result rounded to nearest once.
bool Product(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a,
             int64_t lda, const void* b, int64_t ldb, float beta, void* c, int64_t ldc, int batch,
             int64_t stride_a, int64_t stride_b, int64_t stride_c, bool bf16,
             const float* bias = nullptr, bool out_bf16 = false) {
  if (bias != nullptr && Alignment(bias) < 16) bias = nullptr;  // the kernel's, then
  if (out_bf16 && (!bf16 || bias != nullptr))
    ThrowCuda("Product", __FILE__, __LINE__, "a bf16 result needs bf16 operands and no bias");
  const Key key{trans_a,
                trans_b,
                m,
                n,
                k,
                lda,
                ldb,
                ldc,
                batch,
                batch > 1 ? stride_a : 0,
                batch > 1 ? stride_b : 0,
                batch > 1 ? stride_c : 0,
                Alignment(a),
                Alignment(b),
                Alignment(c),
                beta != 0.0f,
                bf16,
                bias != nullptr ? Alignment(bias) : 0u,
                out_bf16};
  const Plan& p = GetPlan(key, bias);
  if (!p.found)  // only with a bias
    return Product(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, batch, stride_a,
                   stride_b, stride_c, bf16);
  if (bias != nullptr)
    ATL_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                              sizeof(bias)));
  ATL_CUBLAS(cublasLtMatmul(BlasLt(), p.desc, &alpha, b, p.a, a, p.b, &beta, c, p.c, c, p.c,
                            &p.algo, BlasWorkspace(), kBlasWorkspaceBytes, Stream()));
  return bias != nullptr;
}

// Whether c = alpha op(a) op(b) + beta c has a product to run; when k = 0 (cuBLASLt rejects it)
// applies c = beta * c itself (c's elements `elem` bytes).
bool HasProduct(int m, int n, int k, float beta, void* c, int64_t ldc, int batch,
                size_t elem = sizeof(float)) {
  if (m <= 0 || n <= 0 || batch <= 0) return false;
  if (k > 0) return true;
  if (beta == 1.0f) return false;
  if (beta == 0.0f && batch == 1 && ldc == n) {
    Zero(c, size_t(m) * size_t(n) * elem);
    return false;
  }
  ThrowCuda("Gemm", __FILE__, __LINE__, "k = 0 with this beta and layout is not supported");
}

}  // namespace

void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc, int batch,
          int64_t stride_a, int64_t stride_b, int64_t stride_c) {
  if (!HasProduct(m, n, k, beta, c, ldc, batch)) return;
  if (!bf16_products) {
    Product(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, batch, stride_a,
            stride_b, stride_c, false);
    return;
  }
  // Stored shapes: a is [m, k] ([k, m] transposed), b is [k, n] ([n, k] transposed).
  const int64_t ea =
      trans_a ? Extent(k, m, lda, batch, stride_a) : Extent(m, k, lda, batch, stride_a);
  const int64_t eb =
      trans_b ? Extent(n, k, ldb, batch, stride_b) : Extent(k, n, ldb, batch, stride_b);
  Bf16Operands ops({ea, eb});
  Product(trans_a, trans_b, m, n, k, alpha, ops.Round(0, a, ea), lda, ops.Round(1, b, eb), ldb,
          beta, c, ldc, batch, stride_a, stride_b, stride_c, true);
}

void GemmBf16(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const __nv_bfloat16* a,
              int64_t lda, const __nv_bfloat16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (!HasProduct(m, n, k, beta, c, ldc, 1)) return;
  Product(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, 1, 0, 0, 0, true);
}

bool GemmWithCopies(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    const uint16_t* a_bf16, int64_t lda, const float* b, const uint16_t* b_bf16,
                    int64_t ldb, float beta, float* c, int64_t ldc, const float* bias,
                    __nv_bfloat16* c_bf16) {
  const bool out_bf16 = bf16_products && c_bf16 != nullptr;
  if (out_bf16 ? !HasProduct(m, n, k, beta, c_bf16, ldc, 1, 2)
               : !HasProduct(m, n, k, beta, c, ldc, 1))
    return false;
  if (!bf16_products)
    return Product(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, 1, 0, 0, 0,
                   false, bias);
  const __nv_bfloat16 *a16 = Bf16Copy(a_bf16), *b16 = Bf16Copy(b_bf16);
  const int64_t ea = trans_a ? Extent(k, m, lda, 1, 0) : Extent(m, k, lda, 1, 0);
  const int64_t eb = trans_b ? Extent(n, k, ldb, 1, 0) : Extent(k, n, ldb, 1, 0);
  Bf16Operands ops({a16 == nullptr ? ea : 0, b16 == nullptr ? eb : 0});
  return Product(trans_a, trans_b, m, n, k, alpha, a16 != nullptr ? a16 : ops.Round(0, a, ea), lda,
                 b16 != nullptr ? b16 : ops.Round(1, b, eb), ldb, beta,
                 out_bf16 ? static_cast<void*>(c_bf16) : c, ldc, 1, 0, 0, 0, true, bias, out_bf16);
}

void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                   int IC, int OC, const Bf16Copies& copies) {
  if (N <= 0) return;
  // out[N,OC] = inp[N,IC] · weight[IC,OC] + bias
  const bool added = GemmWithCopies(false, false, N, OC, IC, 1.0f, inp, copies.inp, IC, weight,
                                    copies.weight, OC, 0.0f, out, OC, bias);
  if (bias != nullptr && !added) {
    const int64_t total = int64_t(N) * OC;
    ATL_LAUNCH(AddBias, Blocks(size_t(total), 256), 256, out, bias, N, OC);
  }
}

void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int N, int IC, int OC, const Bf16Copies& copies,
                    GradInto into) {
  if (N <= 0) return;
  if (dout == nullptr && (!bf16_products || copies.dout == nullptr || dbias != nullptr))
    ThrowCuda("MatmulBackward", __FILE__, __LINE__,
              "no dout: a null dout needs bf16 products, its copy, and no bias gradient");
  const float beta_in = into == GradInto::kAdd ? 1.0f : 0.0f;      // dinp's
  if (bf16_products && (dinp != nullptr || dweight != nullptr)) {  // dout rounded once for both
    const int64_t nd = int64_t(N) * OC, nw = int64_t(IC) * OC, ni = int64_t(N) * IC;
    const __nv_bfloat16 *in = Bf16Copy(copies.inp), *d = Bf16Copy(copies.dout),
                        *w = Bf16Copy(copies.weight);
    Bf16Operands ops({d == nullptr ? nd : 0, dinp != nullptr && w == nullptr ? nw : 0,
                      dweight != nullptr && in == nullptr ? ni : 0});
    if (d == nullptr) d = ops.Round(0, dout, nd);
    // dinp[N,IC] (+)= dout[N,OC] · weight[IC,OC]ᵀ
    if (dinp != nullptr)
      GemmBf16(false, true, N, IC, OC, 1.0f, d, OC, w != nullptr ? w : ops.Round(1, weight, nw), OC,
               beta_in, dinp, IC);
    // dweight[IC,OC] += inp[N,IC]ᵀ · dout[N,OC]
    if (dweight != nullptr)
      GemmBf16(true, false, IC, OC, N, 1.0f, in != nullptr ? in : ops.Round(2, inp, ni), IC, d, OC,
               1.0f, dweight, OC);
  } else {
    if (dinp != nullptr)
      Gemm(false, true, N, IC, OC, 1.0f, dout, OC, weight, OC, beta_in, dinp, IC);
    if (dweight != nullptr)
      Gemm(true, false, IC, OC, N, 1.0f, inp, IC, dout, OC, 1.0f, dweight, OC);
  }
  if (dbias != nullptr) ColumnSumsAdd(dbias, dout, N, OC);
}

}  // namespace atl::kernels::cuda
