#include "plan/matmul.h"

#include <algorithm>
#include <cmath>

namespace atl::plan {
namespace {

constexpr double kTensorCoreTile = 8;  // gpu_model.py: tensor_core_chunk_size (8 since b1f771c)
constexpr double kUsefulFraction = 0.75;

struct TileGrid {
  double rows, cols;  // number of tile rows and columns covering the m x n weight matrix
};

// gpu_model.py _tile: the fewest tiles whose bytes fit `max_tile_bytes`, each as close to square
// as the matrix allows (discrete constraints ignored, to avoid a combinatorial search).
TileGrid Tile(double m, double n, double bytes_per_word, double max_tile_bytes) {
  double words = m * n;
  double tile_count = std::ceil(words * bytes_per_word / max_tile_bytes);
  double words_per_tile = words / tile_count;
  double tile_m = std::max(std::min(m, std::sqrt(words_per_tile)), words_per_tile / n);
  double tile_n = words_per_tile / tile_m;
  return {m / tile_m, n / tile_n};
}

struct LevelIo {
  double interlevel = 0;   // bytes between this level and the one above
  double distributed = 0;  // bytes on the SM-to-SM network (both sides counted)
};

// gpu_model.py _matmul_io_bytes_between_levels: traffic between a level holding weight tiles of
// at most max_tile_bytes (num_concurrent of them at once) and the level above it.
LevelIo IoBetweenLevels(const Gpu& g, double d1, double d2, double b, double max_tile_bytes,
                        double num_concurrent, bool distributed_memory, bool weight_grads) {
  const double w = g.bytes_per_word();
  const double weight_bytes = d1 * d2 * w;
  const double left_bytes = d1 * b * w;   // Y (or dY, or dL/dX) activations
  const double right_bytes = d2 * b * w;  // X (or X^T, or dY)
  const double grad_bytes = weight_bytes;
  const bool weights_fit = weight_bytes + grad_bytes <= max_tile_bytes * num_concurrent;

  TileGrid big, small{1, 1};
  if (distributed_memory) {
    big = Tile(d1, d2, w, max_tile_bytes * num_concurrent);
    small = Tile(d1, d2, w, max_tile_bytes);
  } else {
    big = Tile(d1, d2, w, max_tile_bytes);
  }

  LevelIo io;
  if (!weights_fit) {
    // Weight gradients: load the accumulator and store it back; otherwise load the weights.
    io.interlevel += weight_grads ? 2 * grad_bytes : weight_bytes;
  }
  // A multicast on the distributed network: one send and n - 1 receives, n transfers in all
  // (nothing when one small tile covers the dimension).
  auto multicast = [](double n, double bytes) { return n > 1 ? n * bytes : 0.0; };
  // The right-hand activations are loaded once per big tile row and multicast to the small
  // tile rows.
  io.interlevel += big.rows * right_bytes;
  io.distributed += multicast(small.rows, right_bytes);
  if (weight_grads) {
    // dY is loaded once per tile column, in the same pattern.
    io.interlevel += big.cols * left_bytes;
    io.distributed += multicast(small.cols, left_bytes);
  } else {
    // Outputs are accumulated once per big tile column (load the partial sum except the first
    // time, store it every time) and reduce-scattered across small tile columns: a send and a
    // receive for each column beyond the first.
    io.interlevel += (2 * big.cols - 1) * left_bytes;
    io.distributed += 2 * (small.cols - 1) * left_bytes;
  }
  return io;
}

}  // namespace

MatmulTraffic MatmulBytes(const Gpu& g, double d1, double d2, double b, bool weight_grads) {
  const double useful_reg = kUsefulFraction * g.register_bytes_per_block;
  const double useful_l2 = kUsefulFraction * g.l2_bytes;
  // HBM <-> L2: the weight and gradient tiles stay in the usable L2, or in an SM's registers
  // when those hold more.
  LevelIo hbm_l2 =
      IoBetweenLevels(g, d1, d2, b, std::max(useful_l2, 4 * useful_reg), 1, false, weight_grads);
  // L2 <-> SM: each SM holds its 4 processing blocks' registers' worth of weight tile; with
  // distributed shared memory, SMs share loads over the SM-to-SM network.
  LevelIo l2_sm = IoBetweenLevels(g, d1, d2, b, 4 * useful_reg, g.num_sms,
                                  g.distributed_shared_memory, weight_grads);
  // SM shared memory <-> registers of each processing block.
  LevelIo sm_reg = IoBetweenLevels(g, d1, d2, b, useful_reg, 4.0 * g.num_sms, false, weight_grads);

  MatmulTraffic t;
  t.hbm_bytes = hbm_l2.interlevel;
  t.l2_bytes = hbm_l2.interlevel + l2_sm.interlevel;
  t.shared_bytes = l2_sm.interlevel + l2_sm.distributed + sm_reg.interlevel;
  t.flop = 2 * std::ceil(d1 / kTensorCoreTile) * std::ceil(d2 / kTensorCoreTile) *
           std::ceil(b / kTensorCoreTile) * kTensorCoreTile * kTensorCoreTile * kTensorCoreTile;
  return t;
}

double MatmulSeconds(const Gpu& g, double d1, double d2, double b, bool weight_grads) {
  MatmulTraffic t = MatmulBytes(g, d1, d2, b, weight_grads);
  double s = std::max(std::max(t.hbm_bytes / g.hbm_bandwidth, t.l2_bytes / g.l2_bandwidth),
                      std::max(t.shared_bytes / g.shared_bandwidth(), t.flop / g.flop_per_s()));
  return s + g.latency_per_matmul_s;
}

}  // namespace atl::plan
