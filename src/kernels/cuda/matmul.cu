// Matrix products through cuBLASLt (Gemm) and the linear layer over them (MatmulForward and
// MatmulBackward of ops.h).
//
// Gemm's row-major product is cuBLASLt's column-major one with the operands swapped: a row-major
// [r, c] matrix with row stride ld is a column-major [c, r] one with leading dimension ld, so
// c = op(a)·op(b) (row-major) is cᵀ = op(b)ᵀ·op(a)ᵀ (column-major).
//
// Each distinct problem (shape, strides, transposes, pointer alignment, beta) gets one plan,
// chosen once by cuBLASLt's heuristic and kept: the same problem always runs the same algorithm,
// with a workspace of fixed size, on the one stream. cuBLAS promises bitwise-identical results
// run to run on those terms (same toolkit, same GPU architecture and SM count).
#include <cublasLt.h>

#include <map>
#include <tuple>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace atl::kernels::cuda {
namespace {

// The largest power of two (at most 256) that divides the address: cuBLASLt must not pick a
// kernel that needs more alignment than the operands have.
uint32_t Alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 4 && a % align != 0) align >>= 1;
  return align;
}

using Key = std::tuple<bool, bool, int, int, int, int64_t, int64_t, int64_t, int, int64_t, int64_t,
                       int64_t, uint32_t, uint32_t, uint32_t, bool>;

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

cublasLtMatrixLayout_t Layout(uint64_t rows, uint64_t cols, int64_t ld, int batch, int64_t stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  ATL_CUBLAS(cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, rows, cols, ld));
  if (batch > 1) {
    const int32_t count = batch;
    ATL_CUBLAS(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                sizeof(count)));
    ATL_CUBLAS(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &stride, sizeof(stride)));
  }
  return layout;
}

const Plan& GetPlan(const Key& key) {
  static std::map<Key, Plan> plans;
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;
  const auto [ta, tb, m, n, k, lda, ldb, ldc, batch, sa, sb, sc, align_a, align_b, align_c,
              accumulate] = key;
  Plan p;
  ATL_CUBLAS(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // cuBLASLt's A is our b, its B our a (see the top of the file).
  const cublasOperation_t op_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  ATL_CUBLAS(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  ATL_CUBLAS(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  // Stored (column-major) shapes: cuBLASLt's A is n x k (k x n when transposed), B is k x m.
  p.a = tb ? Layout(k, n, ldb, batch, sb) : Layout(n, k, ldb, batch, sb);
  p.b = ta ? Layout(m, k, lda, batch, sa) : Layout(k, m, lda, batch, sa);
  p.c = Layout(n, m, ldc, batch, sc);

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
  if (st != CUBLAS_STATUS_SUCCESS || found == 0)
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

}  // namespace

void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc, int batch,
          int64_t stride_a, int64_t stride_b, int64_t stride_c) {
  if (m <= 0 || n <= 0 || batch <= 0) return;
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
                beta != 0.0f};
  if (k <= 0) {  // c = beta * c: nothing to multiply (cuBLASLt rejects k = 0)
    if (beta == 1.0f) return;
    if (beta == 0.0f && batch == 1 && ldc == n) return Zero(c, size_t(m) * size_t(n) * 4);
    ThrowCuda("Gemm", __FILE__, __LINE__, "k = 0 with this beta and layout is not supported");
  }
  const Plan& p = GetPlan(key);
  ATL_CUBLAS(cublasLtMatmul(BlasLt(), p.desc, &alpha, b, p.a, a, p.b, &beta, c, p.c, c, p.c,
                            &p.algo, BlasWorkspace(), kBlasWorkspaceBytes, Stream()));
}

void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                   int IC, int OC) {
  // out[N,OC] = inp[N,IC] · weight[IC,OC]
  Gemm(false, false, N, OC, IC, 1.0f, inp, IC, weight, OC, 0.0f, out, OC);
  if (bias != nullptr) {
    const int64_t total = int64_t(N) * OC;
    ATL_LAUNCH(AddBias, Blocks(size_t(total), 256), 256, out, bias, N, OC);
  }
}

void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int N, int IC, int OC) {
  // dinp[N,IC] += dout[N,OC] · weight[IC,OC]ᵀ
  if (dinp != nullptr) Gemm(false, true, N, IC, OC, 1.0f, dout, OC, weight, OC, 1.0f, dinp, IC);
  // dweight[IC,OC] += inp[N,IC]ᵀ · dout[N,OC]
  if (dweight != nullptr) Gemm(true, false, IC, OC, N, 1.0f, inp, IC, dout, OC, 1.0f, dweight, OC);
  if (dbias != nullptr) ColumnSumsAdd(dbias, dout, N, OC);
}

}  // namespace atl::kernels::cuda
