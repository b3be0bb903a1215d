// InitBackend for the CPU: OpenBLAS threads and kernel family (see ops.h for the why).
#include <cblas.h>
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "kernels/ops.h"

// OpenBLAS's DYNAMIC_ARCH entry points (exported by libopenblas; not declared in cblas.h).
// gotoblas_dynamic_quit() forgets the chosen kernel table; gotoblas_dynamic_init() chooses one
// again, reading OPENBLAS_CORETYPE exactly as it does when the library loads.
extern "C" {
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
}

namespace atl::kernels {
namespace {

bool CpuHasAvx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

// AVX2-only kernel families OpenBLAS falls back to on CPUs it does not know as AVX-512 ones.
bool IsAvx2Family(const char* core) {
  for (const char* name : {"Haswell", "Zen"}) {
    if (std::strcmp(core, name) == 0) return true;
  }
  return false;
}

BackendInfo Init() {
  BackendInfo info;
  openblas_set_num_threads(1);
  const char* core = openblas_get_corename();
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr && core != nullptr && IsAvx2Family(core) &&
      CpuHasAvx512() && gotoblas_dynamic_init != nullptr && gotoblas_dynamic_quit != nullptr) {
    // setenv before any other thread of ours runs: the first InitBackend happens in a
    // constructor, before kernels start OpenMP teams.
    setenv("OPENBLAS_CORETYPE", "SkylakeX", /*overwrite=*/0);
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    openblas_set_num_threads(1);
    info.blas_retargeted = true;
  }
  core = openblas_get_corename();
  info.blas_core = core ? core : "unknown";
  info.max_threads = omp_get_max_threads();
  return info;
}

}  // namespace

BackendInfo InitBackend() {
  static std::once_flag once;
  static BackendInfo info;
  std::call_once(once, [] { info = Init(); });
  BackendInfo out = info;
  out.max_threads = omp_get_max_threads();
  return out;
}

}  // namespace atl::kernels
