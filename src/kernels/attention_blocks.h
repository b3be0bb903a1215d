// The rows of a block of the GPU's tensor-core attention kernels (kernels/cuda/attention_tc.cu),
// a question of speed alone: every setting gives the same bits; and how their backward computes
// dQ (AttentionBackwardKind). Backend-neutral, so that a
// build without CUDA parses and checks the same settings (model/backend.h); C++17, as the CUDA
// sources are.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace atl::kernels {

struct AttentionBlockRows {
  // The forward's and dQ's query rows: 64 (16 a warp) or 128 (32 a warp, two row tiles that
  // share every fragment of K and V read from shared memory, and a K, V tile read from memory
  // once for 128 queries).
  int query = 64;
  // The dK/dV kernel's key rows: 64 (4 warps of 16) or 128 (8 warps of 16, which share every Q,
  // dO tile staged: read from memory once for 128 keys).
  int key = 64;
};

// Every valid setting, the default first.
inline constexpr AttentionBlockRows kAttentionBlockRowsAll[] = {
    {64, 64}, {128, 64}, {64, 128}, {128, 128}};

// "Q/K", as ParseAttentionBlockRows reads it.
inline std::string ToString(AttentionBlockRows r) {
  return std::to_string(r.query) + "/" + std::to_string(r.key);
}

// The setting to run, from each setting's time (a forward and a backward, in
// kAttentionBlockRowsAll's order; sums over ranks do as well): the fastest, unless the default's
// is within 2% of it, and then the default, so that the noise between runs does not flip the
// choice. The default when `seconds` is not one time per setting.
inline AttentionBlockRows ChooseAttentionBlockRows(const std::vector<double>& seconds) {
  constexpr size_t n = std::size(kAttentionBlockRowsAll);
  if (seconds.size() != n) return {};
  size_t fastest = 0;
  for (size_t i = 1; i < n; ++i)
    if (seconds[i] < seconds[fastest]) fastest = i;
  return seconds[0] <= 1.02 * seconds[fastest] ? kAttentionBlockRowsAll[0]
                                               : kAttentionBlockRowsAll[fastest];
}

// "64/64 1.210, 128/64 1.023, ...": each setting's milliseconds, from seconds as above.
inline std::string DescribeAttentionTimes(const std::vector<double>& seconds) {
  std::string s;
  for (size_t i = 0; i < seconds.size() && i < std::size(kAttentionBlockRowsAll); ++i) {
    char ms[32];
    std::snprintf(ms, sizeof(ms), " %.3f", 1e3 * seconds[i]);
    s += (i > 0 ? ", " : "") + ToString(kAttentionBlockRowsAll[i]) + ms;
  }
  return s;
}

inline bool ValidAttentionBlockRows(AttentionBlockRows r) {
  return (r.query == 64 || r.query == 128) && (r.key == 64 || r.key == 128);
}

// Throws std::invalid_argument unless both are 64 or 128.
inline void CheckAttentionBlockRows(AttentionBlockRows r) {
  if (!ValidAttentionBlockRows(r))
    throw std::invalid_argument("attention block rows " + ToString(r) +
                                ": query and key rows 64 or 128");
}

// "Q/K" or "Q" (key rows 64), each 64 or 128, into *out; false (and *out unchanged) otherwise.
inline bool ParseAttentionBlockRows(std::string_view s, AttentionBlockRows* out) {
  auto number = [](std::string_view v, int* n) {
    if (v.empty() || v.size() > 3) return false;
    for (char c : v)
      if (c < '0' || c > '9') return false;
    *n = std::atoi(std::string(v).c_str());
    return true;
  };
  AttentionBlockRows r;
  const size_t slash = s.find('/');
  if (!number(s.substr(0, slash), &r.query)) return false;
  if (slash != std::string_view::npos && !number(s.substr(slash + 1), &r.key)) return false;
  if (!ValidAttentionBlockRows(r)) return false;
  *out = r;
  return true;
}

// How the tensor-core attention's backward computes dQ:
//   kSplit: a kernel of its own over query blocks, which computes S and dP again before dS K
//     (7 products of a score's size in the two kernels: S, dP and dS K; S, dP, P^T dO, dS^T Q);
//   kFused: in the dK/dV kernel, from the dS it has (5 products): each key block of 64
//     leaves its partial sum Σ_j ds_ij k_j for the queries that see it, which a second pass adds
//     in key-block order (two runs the same bits, with no atomic; at 124M's attention, B 8 and T
//     1024, 214 MB of partial sums). dQ's bits are not kSplit's (another order of sums), dK's and
//     dV's are; every block-row setting gives kFused the same bits.
enum class AttentionBackwardKind { kSplit, kFused };

inline const char* ToString(AttentionBackwardKind b) {
  return b == AttentionBackwardKind::kFused ? "fused" : "split";
}

// "split" or "fused" into *out; false (and *out unchanged) otherwise.
inline bool ParseAttentionBackwardKind(std::string_view s, AttentionBackwardKind* out) {
  if (s != "split" && s != "fused") return false;
  *out = s == "fused" ? AttentionBackwardKind::kFused : AttentionBackwardKind::kSplit;
  return true;
}

}  // namespace atl::kernels
