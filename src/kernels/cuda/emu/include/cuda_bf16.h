// The CUDA emulator's stand-in for the toolkit's cuda_bf16.h: the bfloat16 type, the two
// conversions kernels/cuda/ uses and its bits, with the toolkit's rounding (to nearest, ties to
// even; a NaN stays a NaN). Only the emulated build sees this file.
#pragma once

#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
  uint16_t x;
};

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40u)};  // a quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return {uint16_t(u >> 16)};
}

inline float __bfloat162float(__nv_bfloat16 b) {
  const uint32_t u = uint32_t(b.x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.x; }
