// Token + position embeddings.
#include <cstdint>
#include <cstring>

#include "kernels/ops.h"

namespace atl::kernels {

template <class T>
void EncoderForward(T* out, const int32_t* inp, const T* wte, const T* wpe, int B, int T_, int C,
                    int vocab_begin, int vocab_end) {
  const bool shard = vocab_end >= 0;
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < B * T_; ++bt) {
    const int t = bt % T_;
    T* o = out + size_t(bt) * C;
    const int row = inp[bt] - vocab_begin;
    if (!shard) {
      const T* e = wte + size_t(row) * C;
      const T* p = wpe + size_t(t) * C;
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
      continue;
    }
    const bool held = inp[bt] >= vocab_begin && inp[bt] < vocab_end;
    for (int c = 0; c < C; ++c) o[c] = held ? wte[size_t(row) * C + c] : T(0);
    if (wpe != nullptr)
      for (int c = 0; c < C; ++c) o[c] += wpe[size_t(t) * C + c];
  }
}

// The scatter-add into dwte is a reduction whenever a token repeats. It is split by columns, not
// by rows: each OpenMP chunk owns a fixed column range of every row of dwte and walks the tokens
// in (b, t) order, so repeated tokens always sum in the same order whatever the thread count.
template <class T>
void EncoderBackward(T* dwte, T* dwpe, const T* dout, const int32_t* inp, int B, int T_, int C,
                     int vocab_begin, int vocab_end) {
  const int vocab_limit = vocab_end >= 0 ? vocab_end : INT32_MAX;
  constexpr int kCols = 64;  // 256 bytes of float per row segment
  const int nblocks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; ++blk) {
    const int c0 = blk * kCols, c1 = c0 + kCols < C ? c0 + kCols : C;
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T_; ++t) {
        const size_t bt = size_t(b) * T_ + t;
        const T* d = dout + bt * C;
        if (dwte != nullptr && inp[bt] >= vocab_begin && inp[bt] < vocab_limit) {
          T* w = dwte + size_t(inp[bt] - vocab_begin) * C;
          for (int c = c0; c < c1; ++c) w[c] += d[c];
        }
        if (dwpe != nullptr) {
          T* p = dwpe + size_t(t) * C;
          for (int c = c0; c < c1; ++c) p[c] += d[c];
        }
      }
    }
  }
}

template void EncoderForward<float>(float*, const int32_t*, const float*, const float*, int, int,
                                    int, int, int);
template void EncoderForward<double>(double*, const int32_t*, const double*, const double*, int,
                                     int, int, int, int);
template void EncoderBackward<float>(float*, float*, const float*, const int32_t*, int, int, int,
                                     int, int);
template void EncoderBackward<double>(double*, double*, const double*, const int32_t*, int, int,
                                      int, int, int);

}  // namespace atl::kernels
