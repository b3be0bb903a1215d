// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11).
//
// Every random draw in atoll is a pure function of (seed, step, purpose, index): never of call
// order, thread count or rank count. That is what makes a run bitwise reproducible when it is
// split differently across ranks or resumed from a checkpoint: there is no generator state to
// save or to advance.
//
// Thread-safety: pure functions.
#pragma once

#include <array>
#include <cstdint>

namespace atl {

// What a random draw is for: part of the counter, so two purposes never share a stream.
enum class RngPurpose : uint32_t {
  kInit = 1,        // parameter initialization (index = element of the flat buffer)
  kDataSample = 2,  // which window the sampler picks (index = global sequence position)
  kDropout = 3,
  kSampling = 4,  // text generation
  kShuffle = 5,
  kJitter = 6,  // emulated WAN jitter (step = link stream, index = chunk)
  kFault = 7,   // injected faults (train/sdc/faults.h: where and which bit)
  kTest = 100,
};

// Philox4x32 with 10 rounds: 128-bit counter, 64-bit key -> 128 random bits.
std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// 64 random bits for (seed, step, purpose, index).
uint64_t RandomBits(uint64_t seed, uint64_t step, RngPurpose purpose, uint64_t index);

// Uniform in [0, 1) with 24 bits of resolution.
float RandomUniform(uint64_t seed, uint64_t step, RngPurpose purpose, uint64_t index);

// Uniform integer in [0, n) (n > 0), by 64-bit multiply-shift (bias below 2^-32 for n < 2^32).
uint64_t RandomBelow(uint64_t seed, uint64_t step, RngPurpose purpose, uint64_t index, uint64_t n);

// Standard normal by Box-Muller over the draw's 64 bits.
float RandomNormal(uint64_t seed, uint64_t step, RngPurpose purpose, uint64_t index);

// A random nonzero 64-bit number from the operating system: an identity (a process's incarnation,
// a coordinator's id), never data — it is not reproducible, by design.
uint64_t RandomIdentity();

}  // namespace atl
