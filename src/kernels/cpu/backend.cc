// InitBackend and SetBlasCore for the CPU: OpenBLAS threads and kernel family (see ops.h).
#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/log.h"
#include "kernels/ops.h"

// OpenBLAS's DYNAMIC_ARCH entry points (exported by libopenblas, not declared in cblas.h):
// gotoblas_dynamic_quit() forgets the chosen kernel table; gotoblas_dynamic_init() chooses one
// again, reading OPENBLAS_CORETYPE exactly as it does when the library loads. Weak, so a BLAS
// built without DYNAMIC_ARCH still links (and SetBlasCore is then a no-op).
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

// AVX2-only kernel families OpenBLAS uses on CPUs it does not know as AVX-512 ones.
bool IsAvx2Family(const std::string& core) { return core == "Haswell" || core == "Zen"; }

std::string CoreName() {
  const char* core = openblas_get_corename();
  return core != nullptr ? core : "unknown";
}

BackendInfo Init() {
  BackendInfo info;
  openblas_set_num_threads(1);
  const std::string core = CoreName();
  const bool avx512 = CpuHasAvx512();
  if (avx512 && IsAvx2Family(core)) {
    if (const char* env = std::getenv("OPENBLAS_CORETYPE")) {
      LogWarning(
          "OPENBLAS_CORETYPE={} selects OpenBLAS's AVX2 kernels on this AVX-512 CPU: SGEMM runs at "
          "about half the speed of OPENBLAS_CORETYPE=SkylakeX",
          env);
    } else if (SetBlasCore("SkylakeX") != core) {
      info.blas_retargeted = true;
    }
  }
  info.blas_core = CoreName();
  return info;
}

}  // namespace

std::string SetBlasCore(const std::string& name) {
  if (gotoblas_dynamic_init == nullptr || gotoblas_dynamic_quit == nullptr) return CoreName();
  setenv("OPENBLAS_CORETYPE", name.c_str(), /*overwrite=*/1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  openblas_set_num_threads(1);
  return CoreName();
}

bool ReexecWithRuntimeDefaults(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return false;
  if (const char* no = std::getenv("ATOLL_NO_REEXEC"); no != nullptr && *no != '\0') return false;
  if (setenv("OMP_WAIT_POLICY", "passive", 0) != 0) return false;
  execv("/proc/self/exe", argv);
  unsetenv("OMP_WAIT_POLICY");  // exec failed: carry on as we are
  return false;
}

BackendInfo InitBackend() {
  static std::once_flag once;
  static BackendInfo info;
  std::call_once(once, [] { info = Init(); });
  BackendInfo out = info;
  out.blas_core = CoreName();  // SetBlasCore may have changed it since
  out.max_threads = omp_get_max_threads();
  return out;
}

}  // namespace atl::kernels
