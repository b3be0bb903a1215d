// The CUDA emulator itself: barriers and shuffles mean what they mean on a GPU, and what would
// hang or fault on a GPU (a shuffle missing a lane, threads at different barriers, a host
// pointer in a kernel, host code touching device memory, a bad launch shape, a product whose
// shapes do not fit, a tensor-core product without the whole warp) fails here with a message
// instead of passing by luck.
#include <cublasLt.h>
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"

namespace atl::kernels::cuda {
namespace {

// The message of the CudaError that fn throws ("" when it throws none).
template <class F>
std::string ErrorOf(F fn) {
  try {
    fn();
  } catch (const CudaError& e) {
    return e.what();
  }
  return "";
}

// out[t] = in[n - 1 - t] through shared memory: right only if the barrier waits for every write.
__global__ void ReverseKernel(float* out, const float* in) {
  __shared__ float s[1024];
  const unsigned t = threadIdx.x, n = blockDim.x;
  s[t] = in[blockIdx.x * n + t];
  __syncthreads();
  out[blockIdx.x * n + t] = s[n - 1 - t];
}

TEST(CudaEmulator, SyncThreadsWaitsForTheWholeBlock) {
  std::vector<float> in(3 * 256);
  std::iota(in.begin(), in.end(), 0.0f);
  auto din = ToDevice(in);
  DeviceArray<float> dout(in.size());
  ATL_LAUNCH(ReverseKernel, 3, 256, dout.data(), din.data());
  const auto out = ToHost(dout);
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < 256; ++t) ASSERT_EQ(out[b * 256 + t], in[b * 256 + 255 - t]);
}

// Block sums by common.cuh's BlockSum (warp butterflies, then warp 0), and each lane's
// neighbour by __shfl_down_sync.
__global__ void SumsKernel(float* sums, int* down, const float* in, int n) {
  __shared__ float shared[32];
  float v = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v += in[i];
  const float total = BlockSum(v, shared);
  if (threadIdx.x == 0) sums[0] = total;
  // every thread got the same total
  if (threadIdx.x == blockDim.x - 1) sums[1] = total;
  down[threadIdx.x] = __shfl_down_sync(0xffffffffu, int(threadIdx.x) * 10, 1);
}

TEST(CudaEmulator, WarpShufflesAndBlockReductions) {
  std::vector<float> in(1000);
  for (size_t i = 0; i < in.size(); ++i) in[i] = float(i % 7);
  auto din = ToDevice(in);
  DeviceArray<float> sums(2);
  DeviceArray<int> down(128);
  ATL_LAUNCH(SumsKernel, 1, 128, sums.data(), down.data(), din.data(), 1000);
  const auto s = ToHost(sums);
  const float want = std::accumulate(in.begin(), in.end(), 0.0f);
  EXPECT_EQ(s[0], want);
  EXPECT_EQ(s[1], want);
  const auto d = ToHost(down);
  for (int t = 0; t < 128; ++t)  // the last lane of each warp keeps its own value
    EXPECT_EQ(d[t], t % 32 == 31 ? t * 10 : (t + 1) * 10) << t;
}

// Lane 0 of each warp returns before the others shuffle with a full mask.
__global__ void MissingLaneKernel(float* out) {
  if (threadIdx.x % 32 == 0) return;
  out[threadIdx.x] = WarpSum(1.0f);
}

// Even warps wait at __syncthreads, odd ones shuffle: nobody is released.
__global__ void SplitBarrierKernel(float* out) {
  if ((threadIdx.x / 32) % 2 == 0) {
    __syncthreads();
  } else if (threadIdx.x % 2 == 0) {
    out[threadIdx.x] = WarpSum(1.0f);
  } else {
    __syncthreads();
  }
}

// A tensor-core product (mma.sync: the whole warp together) after lane `gone` has returned, or
// while it returns (lane 31 of block 0: lanes run in order, so 0-30 already wait).
__global__ void PartialWarpMmaKernel(float* out, int gone) {
  if (threadIdx.x % 32 == unsigned(gone)) return;
  float d[4] = {};
  const uint32_t a[4] = {}, b[2] = {};
  MmaBf16(d, a, b);
  out[threadIdx.x] = d[0];
}

// Lanes 0-15 shuffle while lanes 16-31 multiply, all with the whole warp's mask.
__global__ void MixedWarpOpsKernel(float* out) {
  if (threadIdx.x % 32 < 16) {
    out[threadIdx.x] = WarpSum(1.0f);
  } else {
    float d[4] = {};
    const uint32_t a[4] = {}, b[2] = {};
    MmaBf16(d, a, b);
    out[threadIdx.x] = d[0];
  }
}

TEST(CudaEmulator, WhatHangsAGpuFailsTheLaunch) {
  DeviceArray<float> out(64);
  std::string e = ErrorOf([&] { ATL_LAUNCH(MissingLaneKernel, 1, 64, out.data()); });
  EXPECT_NE(e.find("MissingLaneKernel"), std::string::npos) << e;
  EXPECT_NE(e.find("reads lane 0, which has returned"), std::string::npos) << e;
  for (const int gone : {5, 31}) {
    e = ErrorOf([&] { ATL_LAUNCH(PartialWarpMmaKernel, 1, 64, out.data(), gone); });
    EXPECT_NE(e.find("PartialWarpMmaKernel"), std::string::npos) << e;
    EXPECT_NE(e.find("the hardware needs the whole warp"), std::string::npos) << e;
  }
  e = ErrorOf([&] { ATL_LAUNCH(MixedWarpOpsKernel, 1, 64, out.data()); });
  EXPECT_NE(e.find("MixedWarpOpsKernel"), std::string::npos) << e;
  EXPECT_NE(e.find("different warp operations"), std::string::npos) << e;
  e = ErrorOf([&] { ATL_LAUNCH(SplitBarrierKernel, 1, 64, out.data()); });
  EXPECT_NE(e.find("SplitBarrierKernel"), std::string::npos) << e;
  EXPECT_NE(e.find("deadlock"), std::string::npos) << e;
  // The device still works afterwards.
  std::vector<float> in(256, 1.0f);
  auto din = ToDevice(in);
  DeviceArray<float> rev(256);
  ATL_LAUNCH(ReverseKernel, 1, 256, rev.data(), din.data());
  EXPECT_EQ(ToHost(rev), in);
}

__global__ void CopyKernel(float* out, const float* in, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}

TEST(CudaEmulator, AHostPointerInAKernelIsAnIllegalAddress) {
  std::vector<float> host(10, 2.0f);
  DeviceArray<float> dev(10);
  const std::string e =
      ErrorOf([&] { ATL_LAUNCH(CopyKernel, 1, 32, dev.data(), host.data(), 10); });
  EXPECT_NE(e.find("CopyKernel got argument 1"), std::string::npos) << e;
  EXPECT_NE(e.find("not device memory"), std::string::npos) << e;
  // Copies check their direction too.
  EXPECT_THROW(CopyToDevice(host.data(), dev.data(), 40), CudaError);
  EXPECT_THROW(CopyToHost(dev.data(), host.data(), 40), CudaError);
  // A copy past the allocation's end.
  std::vector<float> big(11);
  EXPECT_THROW(CopyToDevice(dev.data(), big.data(), 44), CudaError);
}

TEST(CudaEmulator, ABadLaunchShapeIsRefused) {
  DeviceArray<float> out(4), in(4);
  const std::string e = ErrorOf([&] { ATL_LAUNCH(CopyKernel, 1, 2048, out.data(), in.data(), 4); });
  EXPECT_NE(e.find("invalid configuration"), std::string::npos) << e;
}

TEST(CudaEmulator, NewDeviceMemoryIsNotZero) {
  DeviceArray<float> d(8);
  for (const float x : ToHost(d)) EXPECT_TRUE(std::isnan(x));
  d.SetZero();
  for (const float x : ToHost(d)) EXPECT_EQ(x, 0.0f);
}

TEST(CudaEmulatorDeathTest, HostCodeTouchingDeviceMemoryFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        DeviceArray<float> d(4);
        d.data()[1] = 1.0f;
      },
      "host code read or wrote device memory");
}

// Row-major Gemm over the emulated cuBLASLt against a plain triple loop, both transposes and a
// strided batch; shapes that do not fit are refused.
TEST(CudaEmulator, GemmMeansWhatItSays) {
  const int m = 5, n = 3, k = 4, batch = 2;
  std::vector<float> a(size_t(batch) * m * k), b(size_t(batch) * k * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(int(i * 7 % 11) - 5);
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(int(i * 5 % 13) - 6);
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      SCOPED_TRACE(testing::Message() << "ta=" << ta << " tb=" << tb);
      auto da = ToDevice(a), db = ToDevice(b);
      DeviceArray<float> dc(size_t(batch) * m * n);
      dc.SetZero();
      Gemm(ta, tb, m, n, k, 1.0f, da.data(), ta ? m : k, db.data(), tb ? k : n, 0.0f, dc.data(), n,
           batch, int64_t(m) * k, int64_t(k) * n, int64_t(m) * n);
      const auto c = ToHost(dc);
      for (int z = 0; z < batch; ++z)
        for (int i = 0; i < m; ++i)
          for (int j = 0; j < n; ++j) {
            float want = 0;
            for (int p = 0; p < k; ++p) {
              const float x = ta ? a[z * m * k + p * m + i] : a[z * m * k + i * k + p];
              const float y = tb ? b[z * k * n + j * k + p] : b[z * k * n + p * n + j];
              want += x * y;
            }
            ASSERT_EQ(c[z * m * n + i * n + j], want) << z << " " << i << " " << j;
          }
      // alpha and beta, C the output: 0.5 * product + 2 * (the product) = 2.5 * product.
      Gemm(ta, tb, m, n, k, 0.5f, da.data(), ta ? m : k, db.data(), tb ? k : n, 2.0f, dc.data(), n,
           batch, int64_t(m) * k, int64_t(k) * n, int64_t(m) * n);
      const auto c2 = ToHost(dc);
      for (size_t i = 0; i < c.size(); ++i) ASSERT_EQ(c2[i], 2.5f * c[i]) << i;
    }
  // lda smaller than a row: cuBLASLt refuses the layout.
  DeviceArray<float> x(100), y(100), z(100);
  EXPECT_THROW(Gemm(false, false, 4, 4, 4, 1.0f, x.data(), 2, y.data(), 4, 0.0f, z.data(), 4),
               CudaError);
}

// The bias epilogue: D = product + bias[row] (column-major D), the bias's alignment read by the
// heuristic (under 16 bytes refused), a bias outside device memory refused by the product.
TEST(CudaEmulator, BiasEpilogue) {
  const int m = 4, n = 3, k = 2;  // column-major: A m x k, B k x n, D m x n
  const std::vector<float> a = {1, 2, 3, 4, 5, 6, 7, 8}, b = {1, 0, 0, 1, 2, -1};
  const std::vector<float> bias = {0.5f, -1, 100, 0, 7};  // used from element 0 or 1
  auto da = ToDevice(a), db = ToDevice(b), dbias = ToDevice(bias);
  DeviceArray<float> dd(size_t(m) * n);
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;
  ASSERT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, m, k, m);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, n, k);
  cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m);
  const uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  ASSERT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                           sizeof(epilogue)),
            CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  auto plan = [&](const float* bias_ptr, cublasLtMatmulHeuristicResult_t* r) {
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr,
                                   sizeof(bias_ptr));
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(BlasLt(), desc, la, lb, ld, ld, pref, 1, r, &found);
    return st == CUBLAS_STATUS_SUCCESS && found == 1;
  };
  cublasLtMatmulHeuristicResult_t r{};
  EXPECT_FALSE(plan(dbias.data() + 1, &r));  // 4-byte aligned
  ASSERT_TRUE(plan(dbias.data(), &r));
  const float alpha = 1, beta = 0;
  auto run = [&](const void* bias_ptr) {
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr,
                                   sizeof(bias_ptr));
    return cublasLtMatmul(BlasLt(), desc, &alpha, da.data(), la, db.data(), lb, &beta, dd.data(),
                          ld, dd.data(), ld, &r.algo, nullptr, 0, nullptr);
  };
  ASSERT_EQ(run(dbias.data()), CUBLAS_STATUS_SUCCESS);
  const auto d = ToHost(dd);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      float want = bias[size_t(i)];
      for (int p = 0; p < k; ++p) want += a[size_t(p * m + i)] * b[size_t(j * k + p)];
      EXPECT_EQ(d[size_t(j * m + i)], want) << i << " " << j;
    }
  EXPECT_EQ(run(dbias.data() + 1), CUBLAS_STATUS_INVALID_VALUE);  // less aligned than planned
  EXPECT_EQ(run(bias.data()), CUBLAS_STATUS_INVALID_VALUE);       // host memory
  cublasLtMatmulPreferenceDestroy(pref);
  for (auto* l : {la, lb, ld}) cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(desc);
}

// Each thread copies 4 floats into shared memory by cp.async (Copy16) and reads them before and
// after waiting: a GPU may land the copy at any time between, and the emulator takes one end in
// even blocks (at once) and the other in odd ones (at the wait), so that a kernel relying on
// either fails in one of them.
__global__ void AsyncCopyKernel(float* before, float* after, const float* in) {
  struct alignas(16) Floats {
    float v[4 * 32];
  };
  __shared__ Floats s;
  const int t = int(threadIdx.x), at = int(blockIdx.x) * 4 * 32 + 4 * t;
  for (int i = 0; i < 4; ++i) s.v[4 * t + i] = -1.0f;
  Copy16(&s.v[4 * t], in + 4 * t);
  CopyCommit();
  for (int i = 0; i < 4; ++i) before[at + i] = s.v[4 * t + i];
  CopyWait<0>();
  for (int i = 0; i < 4; ++i) after[at + i] = s.v[4 * t + i];
}

TEST(CudaEmulator, AsyncCopiesLandBetweenTheCopyAndTheWait) {
  std::vector<float> in(4 * 32);
  std::iota(in.begin(), in.end(), 1.0f);
  auto din = ToDevice(in);
  DeviceArray<float> before(2 * in.size()), after(2 * in.size());
  ATL_LAUNCH(AsyncCopyKernel, 2, 32, before.data(), after.data(), din.data());
  const auto b = ToHost(before), a = ToHost(after);
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(b[i], in[i]) << i;              // block 0: landed at once
    EXPECT_EQ(b[in.size() + i], -1.0f) << i;  // block 1: only at the wait
    EXPECT_EQ(a[i], in[i]) << i;
    EXPECT_EQ(a[in.size() + i], in[i]) << i;
  }
}

// After a barrier, warp 1 sets a flag in shared memory at once; warp 0 shuffles 5 times, then
// reads it. Nothing orders the two, and the emulator runs a warp as far as it goes before the
// next (the one that released the barrier first: warp 1 in even blocks, whose threads run in
// index order, warp 0 in odd ones), so warp 0 reads 1 in one block and 0 in the other. Warps in
// lockstep would hide a missing barrier in a kernel whose warps do the same work.
__global__ void DriftKernel(int* seen) {
  __shared__ int flag;
  if (threadIdx.x == 0) flag = 0;
  __syncthreads();
  const int warp = int(threadIdx.x) / 32;
  if (warp == 1 && threadIdx.x % 32 == 0) flag = 1;
  int v = int(threadIdx.x);
  for (int i = 0; i < 5; ++i) v = __shfl_xor_sync(0xffffffffu, v, 1);
  if (warp == 0 && threadIdx.x == 0) seen[blockIdx.x] = flag + 0 * v;
}

// What faults on a GPU: an asynchronous copy from a misaligned address, or into device memory;
// ldmatrix on an address that is not shared memory.
__global__ void BadCopyKernel(float* out, const float* in, int how) {
  struct alignas(16) Floats {
    float v[8];
  };
  __shared__ Floats s;
  if (how == 0) Copy16(&s.v[0], in + 1);  // 4-byte aligned source
  if (how == 1) Copy16(out, in);          // into device memory
  if (how == 2) {
    uint32_t r[4];
    LdMatrix4<false>(r, in);  // global memory
  }
  CopyCommit();
  CopyWait<0>();
  out[threadIdx.x] = s.v[0];
}

TEST(CudaEmulator, WhatFaultsOnAGpuInTheCopiesFailsTheLaunch) {
  auto in = ToDevice(std::vector<float>(64, 1.0f));
  DeviceArray<float> out(64);
  for (const int how : {0, 1, 2}) {
    const std::string e =
        ErrorOf([&] { ATL_LAUNCH(BadCopyKernel, 1, 32, out.data(), in.data(), how); });
    EXPECT_NE(e.find("BadCopyKernel"), std::string::npos) << how << ": " << e;
    EXPECT_NE(e.find(how == 2 ? "ldmatrix" : "asynchronous copy"), std::string::npos) << e;
  }
}

// A vector load or store at an address that is not a multiple of its size (a GPU's misaligned
// address fault).
__global__ void MisalignedKernel(float* out, const float* in, int how) {
  if (how == 0) out[0] = __uint_as_float(Load16(in + 2).x);
  if (how == 1) Store16(out + 1, uint4{});
  if (how == 2) Store8(out + 1, uint2{});
  if (how == 3) out[0] = __uint_as_float(Load4(reinterpret_cast<const char*>(in) + 2));
  if (how == 4) out[0] = __uint_as_float(Load16(in + 4).x) + __uint_as_float(Load4(in + 1));
}

TEST(CudaEmulator, MisalignedVectorAccessesFailTheLaunch) {
  auto in = ToDevice(std::vector<float>(8, 1.0f));
  DeviceArray<float> out(8);
  for (const int how : {0, 1, 2, 3}) {
    const std::string e =
        ErrorOf([&] { ATL_LAUNCH(MisalignedKernel, 1, 1, out.data(), in.data(), how); });
    EXPECT_NE(e.find("misaligned"), std::string::npos) << how << ": " << e;
  }
  // Aligned ones run.
  EXPECT_EQ(ErrorOf([&] { ATL_LAUNCH(MisalignedKernel, 1, 1, out.data(), in.data(), 4); }), "");
  EXPECT_EQ(ToHost(out)[0], 2.0f);
}

// The streaming ops take four elements a thread by vector accesses where their arrays are
// aligned (common.cuh's Quad), counted here: GELU's forward with its bf16 copy makes a 16-byte
// load, a 16-byte store and an 8-byte store a whole quad; one element past an aligned address,
// none.
TEST(CudaEmulator, StreamingOpsUseVectorAccessesWhereAligned) {
  SetBf16Matmul(true);
  const size_t n = 1001;  // 250 whole quads, then one element
  DeviceArray<float> in(n + 1), out(n + 1);
  DeviceArray<uint16_t> out16(n + 1);
  Zero(in.data(), (n + 1) * sizeof(float));
  for (const int offset : {0, 1}) {
    const uint64_t before = ::atl::cuda_emu::VectorAccesses();
    GeluForward(out.data() + offset, in.data() + offset, n, out16.data() + offset);
    EXPECT_EQ(::atl::cuda_emu::VectorAccesses() - before, offset == 0 ? 3 * (n / 4) : 0) << offset;
  }
  SetBf16Matmul(false);
  // A bias gradient's column sums (MatmulBackward, ColumnSumsAdd): each quad of dout loaded, each
  // chunk's quad of sums stored (130 rows: 3 chunks of 64), where dout is aligned.
  const int rows = 130, cols = 96;
  DeviceArray<float> dout(size_t(rows) * cols + 1), db(cols);
  Zero(dout.data(), (size_t(rows) * cols + 1) * sizeof(float));
  Zero(db.data(), cols * sizeof(float));
  for (const int offset : {0, 1}) {
    const uint64_t before = ::atl::cuda_emu::VectorAccesses();
    MatmulBackward(nullptr, nullptr, db.data(), dout.data() + offset, nullptr, nullptr, rows, 1,
                   cols);
    EXPECT_EQ(::atl::cuda_emu::VectorAccesses() - before,
              offset == 0 ? size_t(rows + 3) * (cols / 4) : 0)
        << offset;
  }
}

TEST(CudaEmulator, WarpsDriftApartBetweenBarriers) {
  DeviceArray<int> seen(2);
  ATL_LAUNCH(DriftKernel, 2, 64, seen.data());
  EXPECT_EQ(ToHost(seen), (std::vector<int>{1, 0}));
}

// Block b's log (129 ints from log + 129 b: a count, then entries): each thread's index as it
// starts and, for the two in three that wait at the barrier (the others return, which counts
// as arriving), 100 + its index as it goes on. A GPU promises no order; the emulator's is
// device.h's, which this pins.
__global__ void OrderKernel(int* log) {
  int* at = log + 129 * blockIdx.x;
  const int t = int(threadIdx.x);
  at[1 + at[0]++] = t;
  if (t % 3 == 0) return;
  __syncthreads();
  at[1 + at[0]++] = 100 + t;
}

TEST(CudaEmulator, ThreadsRunInTheDocumentedOrder) {
  DeviceArray<int> log(2 * 129);
  Zero(log.data(), 2 * 129 * sizeof(int));
  const uint64_t before = ::atl::cuda_emu::FibersStarted();
  ATL_LAUNCH(OrderKernel, 2, 64, log.data());
  const uint64_t fibers = ::atl::cuda_emu::FibersStarted() - before;
  const auto got = ToHost(log);
  // Even blocks: threads 0-63 start in turn; when the last arrives (63 returns), warp 1, the one
  // running, goes on first (32-62), then warp 0 in the block's next round. Odd blocks: the same
  // in reverse.
  std::vector<int> even, odd;
  for (int t = 0; t < 64; ++t) even.push_back(t);
  for (int t = 32; t < 64; ++t)
    if (t % 3 != 0) even.push_back(100 + t);
  for (int t = 0; t < 32; ++t)
    if (t % 3 != 0) even.push_back(100 + t);
  for (int t = 63; t >= 0; --t) odd.push_back(t);
  for (int t = 31; t >= 0; --t)
    if (t % 3 != 0) odd.push_back(100 + t);
  for (int t = 63; t >= 32; --t)
    if (t % 3 != 0) odd.push_back(100 + t);
  for (int b = 0; b < 2; ++b) {
    const auto& want = b == 0 ? even : odd;
    ASSERT_EQ(got[129 * b], int(want.size())) << b;
    EXPECT_EQ(std::vector<int>(got.begin() + 129 * b + 1, got.begin() + 129 * b + 1 + want.size()),
              want)
        << b;
  }
  // A thread has a fiber of its own where the one before it waited: the first of the block, and
  // the one after each of the 42 that wait (43 a block).
  // Each block's first; in even blocks thread t after t - 1, in odd ones after t + 1.
  int own = 2;
  for (int t = 1; t < 64; ++t) own += (t - 1) % 3 != 0 ? 1 : 0;
  for (int t = 62; t >= 0; --t) own += (t + 1) % 3 != 0 ? 1 : 0;
  EXPECT_EQ(fibers, uint64_t(own));
  // A kernel that never waits: one fiber a block, however many threads.
  std::vector<float> in(1000, 3.0f);
  auto din = ToDevice(in);
  DeviceArray<float> dout(1000);
  const uint64_t copy_before = ::atl::cuda_emu::FibersStarted();
  ATL_LAUNCH(CopyKernel, 4, 256, dout.data(), din.data(), 1000);
  EXPECT_EQ(::atl::cuda_emu::FibersStarted() - copy_before, 4u);
  EXPECT_EQ(ToHost(dout), in);
  // Every thread of a 1024-thread block waiting at once: 1024 stacks.
  std::vector<float> big(1024);
  std::iota(big.begin(), big.end(), 0.0f);
  auto dbig = ToDevice(big);
  DeviceArray<float> rev(1024);
  const uint64_t rev_before = ::atl::cuda_emu::FibersStarted();
  ATL_LAUNCH(ReverseKernel, 1, 1024, rev.data(), dbig.data());
  EXPECT_EQ(::atl::cuda_emu::FibersStarted() - rev_before, 1024u);
  const auto r = ToHost(rev);
  for (int t = 0; t < 1024; ++t) ASSERT_EQ(r[t], big[1023 - t]) << t;
}

}  // namespace
}  // namespace atl::kernels::cuda
