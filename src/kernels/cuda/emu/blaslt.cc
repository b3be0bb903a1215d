// The CUDA emulator's cuBLASLt (emu/include/cublasLt.h): descriptors that keep what they are set
// to, a "heuristic" that checks the problem as cuBLASLt does and records the alignment its
// algorithm may assume, and a matmul that checks everything again (shapes, device pointers and
// their extents, that alignment) and computes with the host's BLAS, batch by batch, then applies
// alpha and beta once, as cuBLASLt's epilogue does, then the bias (CUBLASLT_EPILOGUE_BIAS: a float
// per row of D, 16-byte aligned: stricter than cuBLASLt may be, so a caller that relies on less is
// caught). A and B may be bf16 (C and D float, compute float): they are widened to float exactly
// and multiplied in float.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cublasLt.h"
#include "cuda_bf16.h"
#include "kernels/cuda/emu/memory.h"

struct cublasLtContext {};
struct cublasLtMatmulDescOpaque_t {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t bias_type = -1;  // -1: D's type
};
struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch = 1;
  int64_t stride = 0;
};
struct cublasLtMatmulPreferenceOpaque_t {
  uint64_t workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
};

namespace {

template <class T>
cublasStatus_t Set(T* field, const void* buf, size_t size) {
  if (buf == nullptr || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

struct Problem {
  int64_t m, n, k;
};

// The product's m, n, k when the operands fit together (column-major, op(A) m x k, op(B) k x n,
// C and D m x n, one batch count); false otherwise.
bool Check(const cublasLtMatmulDescOpaque_t* desc, const cublasLtMatrixLayoutOpaque_t* a,
           const cublasLtMatrixLayoutOpaque_t* b, const cublasLtMatrixLayoutOpaque_t* c,
           const cublasLtMatrixLayoutOpaque_t* d, Problem* p) {
  if (desc == nullptr || a == nullptr || b == nullptr || c == nullptr || d == nullptr) return false;
  if (desc->compute != CUBLAS_COMPUTE_32F || desc->scale != CUDA_R_32F) return false;
  if (desc->epilogue != CUBLASLT_EPILOGUE_DEFAULT && desc->epilogue != CUBLASLT_EPILOGUE_BIAS)
    return false;
  if (desc->bias_type != -1 && desc->bias_type != CUDA_R_32F) return false;
  // Float throughout, or bf16 A and B with float C and D, or bf16 throughout (C as D).
  if (a->type != b->type || (a->type != CUDA_R_32F && a->type != CUDA_R_16BF)) return false;
  if (c->type != d->type || (d->type != CUDA_R_32F && d->type != a->type)) return false;
  // A bias with a bf16 D would be bf16 too (cuBLASLt's default): not modelled, refused.
  if (desc->epilogue == CUBLASLT_EPILOGUE_BIAS && d->type != CUDA_R_32F) return false;
  for (const auto* l : {a, b, c, d}) {
    if (l->rows == 0 || l->cols == 0) return false;
    if (l->ld < int64_t(l->rows) || l->batch < 1) return false;
    if (l->batch > 1 && l->stride < 0) return false;
  }
  const bool ta = desc->trans_a == CUBLAS_OP_T, tb = desc->trans_b == CUBLAS_OP_T;
  const int64_t m = int64_t(ta ? a->cols : a->rows), k = int64_t(ta ? a->rows : a->cols);
  const int64_t kb = int64_t(tb ? b->cols : b->rows), n = int64_t(tb ? b->rows : b->cols);
  if (k != kb || int64_t(d->rows) != m || int64_t(d->cols) != n) return false;
  if (c->rows != d->rows || c->cols != d->cols) return false;
  if (a->batch != d->batch || b->batch != d->batch || c->batch != d->batch) return false;
  *p = {m, n, k};
  return true;
}

// Bytes from a matrix's first element to one past its last, over every batch.
size_t Extent(const cublasLtMatrixLayoutOpaque_t* l) {
  const int64_t one = int64_t(l->ld) * int64_t(l->cols - 1) + int64_t(l->rows);
  return size_t(one + (l->batch > 1 ? l->stride * (l->batch - 1) : 0)) *
         (l->type == CUDA_R_16BF ? 2 : sizeof(float));
}

// A float copy of an operand (widened from bf16 exactly), or the operand itself.
const float* Widened(const void* p, const cublasLtMatrixLayoutOpaque_t* l,
                     std::vector<float>& copy) {
  if (l->type == CUDA_R_32F) return static_cast<const float*>(p);
  const auto* h = static_cast<const __nv_bfloat16*>(p);
  copy.resize(Extent(l) / 2);
  for (size_t i = 0; i < copy.size(); ++i) copy[i] = __bfloat162float(h[i]);
  return copy.data();
}

bool Aligned(const void* p, uint32_t align) { return reinterpret_cast<uintptr_t>(p) % align == 0; }

// The largest power of two up to 256 dividing the address (256 for null).
uint32_t BiasAlignment(const void* p) {
  uint32_t align = 256;
  while (align > 1 && !Aligned(p, align)) align >>= 1;
  return align;
}

}  // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  // One host thread for the products, as the CPU backend's BLAS (kernels/cpu/backend.cc): the
  // emulated GPU runs on the calling thread, and OpenBLAS's workers would spin between calls on
  // cores other processes need (ctest -j2, the ranks of an MPI test). (With an OpenMP build of
  // OpenBLAS this would also set the calling thread's OpenMP threads to 1; setup.sh installs the
  // pthread one.)
  openblas_set_num_threads(1);
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  *desc = new cublasLtMatmulDescOpaque_t{compute, scale};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return Set(&desc->trans_a, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return Set(&desc->trans_b, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return Set(&desc->epilogue, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return Set(&desc->bias, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      return Set(&desc->bias_type, buf, size);
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  *layout = new cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
      return Set(&layout->batch, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      return Set(&layout->stride, buf, size);
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = new cublasLtMatmulPreferenceOpaque_t;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return Set(&pref->workspace, buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return Set(&pref->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, size);
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  Problem p;
  if (handle == nullptr || pref == nullptr || requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  if (!Check(desc, a, b, c, d, &p)) return CUBLAS_STATUS_NOT_SUPPORTED;
  results[0] = cublasLtMatmulHeuristicResult_t{};
  // The algorithm assumes the alignments the caller promised (and a power of two of them), and
  // the bias pointer's, read from it as cuBLASLt does.
  for (int i = 0; i < 4; ++i) results[0].algo.data[i] = std::max<uint32_t>(pref->align[i], 4);
  if (desc->epilogue == CUBLASLT_EPILOGUE_BIAS) {
    const uint32_t align = BiasAlignment(desc->bias);
    if (align < 16) return CUBLAS_STATUS_NOT_SUPPORTED;
    results[0].algo.data[4] = align;
  }
  results[0].state = CUBLAS_STATUS_SUCCESS;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* a, cublasLtMatrixLayout_t a_layout, const void* b,
                              cublasLtMatrixLayout_t b_layout, const void* beta, const void* c,
                              cublasLtMatrixLayout_t c_layout, void* d,
                              cublasLtMatrixLayout_t d_layout, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  (void)stream;
  Problem p;
  if (handle == nullptr || algo == nullptr || alpha == nullptr || beta == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!Check(desc, a_layout, b_layout, c_layout, d_layout, &p)) return CUBLAS_STATUS_INVALID_VALUE;
  using atl::cuda_emu::IsDevice;
  if (!IsDevice(a, Extent(a_layout)) || !IsDevice(b, Extent(b_layout)) ||
      !IsDevice(c, Extent(c_layout)) || !IsDevice(d, Extent(d_layout)))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (workspace_bytes > 0 && !IsDevice(workspace, workspace_bytes))
    return CUBLAS_STATUS_INVALID_VALUE;
  const void* ptrs[4] = {a, b, c, d};
  for (int i = 0; i < 4; ++i)
    if (!Aligned(ptrs[i], uint32_t(algo->data[i]))) return CUBLAS_STATUS_INVALID_VALUE;
  const float* bias = nullptr;
  if (desc->epilogue == CUBLASLT_EPILOGUE_BIAS) {
    // A vector per batch would need a batch stride: refused, as one bias for every batch.
    if (d_layout->batch > 1 || algo->data[4] < 16 ||
        !Aligned(desc->bias, uint32_t(algo->data[4])) ||
        !IsDevice(desc->bias, size_t(p.m) * sizeof(float)))
      return CUBLAS_STATUS_INVALID_VALUE;
    bias = static_cast<const float*>(desc->bias);
  }

  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const auto ta = desc->trans_a == CUBLAS_OP_T ? CblasTrans : CblasNoTrans;
  const auto tb = desc->trans_b == CUBLAS_OP_T ? CblasTrans : CblasNoTrans;
  atl::cuda_emu::DeviceAccess open{a, b, c, d, bias};
  // As cuBLASLt: the product accumulated whole, then D = alpha * product + beta * C rounded once
  // (accumulating into C block by block of k, as a host BLAS may, rounds at C's magnitude once per
  // block, which loses a small product added to a large C).
  std::vector<float> product(size_t(p.m) * size_t(p.n)), wide_a, wide_b;
  const float* fa = Widened(a, a_layout, wide_a);
  const float* fb = Widened(b, b_layout, wide_b);
  for (int32_t i = 0; i < d_layout->batch; ++i) {
    const float* ai = fa + i * a_layout->stride;
    const float* bi = fb + i * b_layout->stride;
    cblas_sgemm(CblasColMajor, ta, tb, int(p.m), int(p.n), int(p.k), 1.0f, ai, int(a_layout->ld),
                bi, int(b_layout->ld), 0.0f, product.data(), int(p.m));
    // A bf16 D: the float result rounded to nearest (ties to even) once; a bf16 C read widened.
    const bool half = d_layout->type == CUDA_R_16BF;
    for (int64_t col = 0; col < p.n; ++col) {
      const float* pc = product.data() + col * p.m;
      const int64_t c0 = i * c_layout->stride + col * c_layout->ld;
      const int64_t d0 = i * d_layout->stride + col * d_layout->ld;
      for (int64_t r = 0; r < p.m; ++r) {  // with beta 0, C is not read
        float v = al * pc[r];
        if (be != 0.0f) {
          const float cv = half ? __bfloat162float(static_cast<const __nv_bfloat16*>(c)[c0 + r])
                                : static_cast<const float*>(c)[c0 + r];
          v = std::fma(al, pc[r], be * cv);
        }
        if (bias != nullptr) v += bias[r];
        if (half)
          static_cast<__nv_bfloat16*>(d)[d0 + r] = __float2bfloat16_rn(v);
        else
          static_cast<float*>(d)[d0 + r] = v;
      }
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}
