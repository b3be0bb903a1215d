// What a result's bits depend on besides the code's inputs: which build computed it and on what
// CPU. Logged where a run must be re-executed bitwise later (the op log of an asynchronous run),
// so that a re-execution elsewhere can say why it is not bitwise instead of merely failing.
//
// Thread-safety: functions; the values are computed once per process.
#pragma once

#include <string>

namespace atl {

// The executable's GNU build id (hex, from its ELF note; the same binary has the same id), or
// "xxh3:<hex>" of /proc/self/exe's bytes when there is no note. Two different ids mean two
// different builds, whose compiler may have fused or ordered floating-point operations apart.
std::string BuildId();

// The CPU this process runs on: its model name, then the vector-instruction flags that decide
// which kernels OpenBLAS and the compiler's code use ("avx avx2 fma avx512f ..."), then
// OPENBLAS_CORETYPE when it is set. E.g. "Intel(R) Xeon(R) ... | avx avx2 fma avx512f | SkylakeX".
std::string CpuDescription();

}  // namespace atl
