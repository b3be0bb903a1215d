#include "core/rng.h"

#include <cmath>
#include <random>

namespace atl {

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{kM0} * ctr[0];
    const uint64_t p1 = uint64_t{kM1} * ctr[2];
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    ctr = {hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0};
    key[0] += kW0;
    key[1] += kW1;
  }
  return ctr;
}

uint64_t RandomBits(uint64_t seed, uint64_t step, RngPurpose purpose, uint64_t index) {
  // Counter: (index lo, index hi, step lo, step hi ^ purpose << 24). Key: the seed.
  // Steps never reach 2^40, so folding the purpose into the top byte cannot collide.
  const std::array<uint32_t, 4> ctr = {
      uint32_t(index), uint32_t(index >> 32), uint32_t(step),
      uint32_t(step >> 32) ^ (static_cast<uint32_t>(purpose) << 24)};
  const auto r = Philox4x32(ctr, {uint32_t(seed), uint32_t(seed >> 32)});
  return (uint64_t{r[0]} << 32) | r[1];
}

float RandomUniform(uint64_t seed, uint64_t step, RngPurpose purpose, uint64_t index) {
  return float(RandomBits(seed, step, purpose, index) >> 40) * (1.0f / 16777216.0f);
}

uint64_t RandomBelow(uint64_t seed, uint64_t step, RngPurpose purpose, uint64_t index, uint64_t n) {
  const unsigned __int128 prod =
      static_cast<unsigned __int128>(RandomBits(seed, step, purpose, index)) * n;
  return uint64_t(prod >> 64);
}

float RandomNormal(uint64_t seed, uint64_t step, RngPurpose purpose, uint64_t index) {
  const uint64_t bits = RandomBits(seed, step, purpose, index);
  // u1 in (0, 1], u2 in [0, 1): 32 bits each; computed in double so the result is exact to float.
  const double u1 = (double(uint32_t(bits >> 32)) + 1.0) * (1.0 / 4294967296.0);
  const double u2 = double(uint32_t(bits)) * (1.0 / 4294967296.0);
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

uint64_t RandomIdentity() {
  std::random_device rd;
  const uint64_t v = (uint64_t(rd()) << 32) ^ uint64_t(rd());
  return v == 0 ? 1 : v;
}

}  // namespace atl
