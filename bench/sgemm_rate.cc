// SGEMM rate of this machine: the denominator of atoll's model FLOP utilization (MFU).
//
//   OMP_NUM_THREADS=2 build/.../bench/sgemm_rate [--threads 1,2] [--seconds 0.3] [--repeat 3]
//
// Prints GFLOP/s for square and GPT-shaped (the `small` preset: 1024 rows, C 192, V 50257)
// products, for each thread count, two ways:
//   tiles  atoll's scheme: the product cut into fixed tiles (kernels/cpu/gemm.h DefaultTiling),
//          one single-threaded OpenBLAS call per tile, tiles spread over OpenMP threads;
//   blas   one cblas_sgemm call with OpenBLAS's own threads (openblas_set_num_threads).
// Each figure is the best of --repeat timings of at least --seconds each (on a shared machine the
// best run is the least disturbed one). The OpenBLAS kernel family is whatever InitBackend leaves
// (SkylakeX on AVX-512 CPUs unless OPENBLAS_CORETYPE says otherwise: run with
// OPENBLAS_CORETYPE=Haswell to see the default kernels).
//
// The last line is JSON: {"gflops": R, ...}, R = the best square rate (either way) at
// OMP_NUM_THREADS threads (or the largest --threads): the SGEMM rate bench_vs_torch.sh and
// kernels_model_step use for MFU. No other line prints a number followed by "GFLOP".
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/ops.h"

namespace {

using atl::kernels::cpu::DefaultTiling;
using atl::kernels::cpu::GemmTiling;
using atl::kernels::cpu::ParallelGemm;

struct Shape {
  const char* name;
  bool ta, tb;
  int M, N, K;
  GemmTiling tiling;  // {0, 0}: DefaultTiling
};

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best GFLOP/s over `repeat` timings of >= `seconds` each.
template <class F>
double Rate(double flops, double seconds, int repeat, F&& run) {
  run();  // warm-up: page faults, OpenBLAS buffers
  double best = 0;
  for (int r = 0; r < repeat; ++r) {
    int iters = 0;
    const double t0 = Seconds();
    double el = 0;
    do {
      run();
      ++iters;
      el = Seconds() - t0;
    } while (el < seconds);
    best = std::max(best, flops * iters / el / 1e9);
  }
  return best;
}

std::vector<int> ParseThreads(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p;) {
    out.push_back(std::atoi(p));
    const char* c = std::strchr(p, ',');
    if (c == nullptr) break;
    p = c + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  atl::kernels::ReexecWithRuntimeDefaults(argv);  // OMP_WAIT_POLICY=passive unless set
  std::vector<int> threads = {1, 2};
  double seconds = 0.3;
  int repeat = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads"))
      threads = ParseThreads(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--seconds"))
      seconds = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--repeat"))
      repeat = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: sgemm_rate [--threads 1,2] [--seconds S] [--repeat R]\n");
      return 2;
    }
  }
  const char* env_threads = std::getenv("OMP_NUM_THREADS");
  const int ref_threads =
      env_threads ? std::atoi(env_threads) : *std::max_element(threads.begin(), threads.end());
  if (std::find(threads.begin(), threads.end(), ref_threads) == threads.end()) {
    threads.push_back(ref_threads);
  }
  const auto info = atl::kernels::InitBackend();
  const char* env_core = std::getenv("OPENBLAS_CORETYPE");
  std::printf("OpenBLAS %s, core %s (%s)\n", openblas_get_config(), info.blas_core.c_str(),
              info.blas_retargeted ? "switched to SkylakeX by InitBackend"
              : env_core           ? "from OPENBLAS_CORETYPE"
                                   : "OpenBLAS's own choice");

  const int N = 1024, C = 192, V = 50257;
  const std::vector<Shape> shapes = {
      {"square 512", false, false, 512, 512, 512, {}},
      {"square 1024", false, false, 1024, 1024, 1024, {}},
      {"square 2048", false, false, 2048, 2048, 2048, {}},
      {"qkv      x·W   1024x576x192", false, false, N, 3 * C, C, {}},
      {"attnproj x·W   1024x192x192", false, false, N, C, C, {}},
      {"fc       x·W   1024x768x192", false, false, N, 4 * C, C, {}},
      {"fcproj   x·W   1024x192x768", false, false, N, C, 4 * C, {}},
      {"fc dx    dy·W^T 1024x192x768", false, true, N, C, 4 * C, {}},
      {"fc dW    x^T·dy 192x768x1024", true, false, C, 4 * C, N, {}},
      {"head     x·wte^T 1024x50257x192", false, true, N, V, C, {N, 1024}},
      {"head dx  d·wte  1024x192x50257", false, false, N, C, V, {}},
      {"head dW  d^T·x  50257x192x1024", true, false, V, C, N, {}},
      {"attn QK^T (one head) 128x128x48", false, true, 128, 128, 48, {}},
  };
  size_t max_elems = 0;
  for (const Shape& s : shapes) {
    max_elems = std::max({max_elems, size_t(s.M) * s.K, size_t(s.K) * s.N, size_t(s.M) * s.N});
  }
  std::vector<float> A(max_elems), B(max_elems), Cm(max_elems);
  for (size_t i = 0; i < max_elems; ++i) {
    A[i] = float(i % 17) * 0.01f - 0.08f;
    B[i] = float(i % 13) * 0.01f - 0.06f;
  }

  std::printf(
      "\nGFLOP/s, best of %d x >= %.2f s   (tiles: atoll's fixed tiles over OpenMP; "
      "blas: one call, OpenBLAS threads)\n",
      repeat, seconds);
  std::printf("%-34s", "shape (M x N x K)");
  for (int t : threads) std::printf("  tiles t=%d  blas t=%d", t, t);
  std::printf("\n");
  double ref = 0;
  std::vector<double> best_square(threads.size(), 0.0);
  for (const Shape& s : shapes) {
    const double flops = 2.0 * s.M * s.N * s.K;
    const int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    const GemmTiling tiling = s.tiling.tile_m ? s.tiling : DefaultTiling(s.M, s.N, s.K);
    std::printf("%-34s", s.name);
    for (size_t ti = 0; ti < threads.size(); ++ti) {
      const int t = threads[ti];
      omp_set_num_threads(t);
      openblas_set_num_threads(1);
      const double tiles = Rate(flops, seconds, repeat, [&] {
        ParallelGemm<float>(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f,
                            Cm.data(), s.N, tiling);
      });
      openblas_set_num_threads(t);
      const double blas = Rate(flops, seconds, repeat, [&] {
        cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans,
                    s.tb ? CblasTrans : CblasNoTrans, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(),
                    ldb, 0.0f, Cm.data(), s.N);
      });
      openblas_set_num_threads(1);
      std::printf("  %10.1f  %9.1f", tiles, blas);
      if (std::strncmp(s.name, "square", 6) == 0) {
        best_square[ti] = std::max({best_square[ti], tiles, blas});
        if (t == ref_threads) ref = std::max({ref, tiles, blas});
      }
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  std::printf("\nbest square rate:");
  for (size_t ti = 0; ti < threads.size(); ++ti) {
    std::printf("  t=%d %.1f", threads[ti], best_square[ti]);
  }
  std::printf("\n{\"gflops\": %.1f, \"threads\": %d, \"core\": \"%s\"}\n", ref, ref_threads,
              info.blas_core.c_str());
  return 0;
}
