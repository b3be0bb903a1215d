// The streaming kernels (GELU forward and backward, the residual adds, the rounding to bf16) take
// four elements a thread by 16-byte accesses where their arrays are aligned for it, one element
// at a time where not (common.cuh's Quad): the same arithmetic on each element either way, so the
// same bits. Each op runs here on the same values twice, at 16-byte aligned addresses and one
// element past them, over lengths that end inside a quad. Skipped without a usable GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

namespace atl::kernels::cuda {
namespace {

// Values on the device at an aligned address (offset 0: DeviceArray's, 256-byte aligned) or
// `offset` elements past it.
template <class T>
struct Placed {
  DeviceArray<T> room;
  T* p;
  Placed(const std::vector<T>& v, int offset) : room(v.size() + 1), p(room.data() + offset) {
    CopyToDevice(p, v.data(), v.size() * sizeof(T));
  }
  std::vector<T> Host() const {
    std::vector<T> h(room.size() - 1);
    CopyToHost(h.data(), p, h.size() * sizeof(T));
    return h;
  }
};

struct Results {
  std::vector<std::vector<float>> floats;
  std::vector<std::vector<uint16_t>> halves;
};

// The first element where two results differ, or -1.
template <class T>
int64_t FirstDifference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return int64_t(i);
  return -1;
}

void ExpectSame(const Results& a, const Results& b) {
  ASSERT_EQ(a.floats.size(), b.floats.size());
  ASSERT_EQ(a.halves.size(), b.halves.size());
  for (size_t i = 0; i < a.floats.size(); ++i)
    EXPECT_EQ(FirstDifference(a.floats[i], b.floats[i]), -1) << "float result " << i;
  for (size_t i = 0; i < a.halves.size(); ++i)
    EXPECT_EQ(FirstDifference(a.halves[i], b.halves[i]), -1) << "bf16 result " << i;
}

struct Bf16Products {  // so that the ops write their bf16 copies
  Bf16Products() { SetBf16Matmul(true); }
  ~Bf16Products() { SetBf16Matmul(false); }
};

TEST_F(CudaOps, StreamingOpsGiveTheSameBitsAtAnyAlignment) {
  const Bf16Products on;
  for (const size_t n : {size_t(1), size_t(7), size_t(1001), size_t(100003)}) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    const auto x = Random(n, 61, 3.0f), y = Random(n, 62), g = Random(n, 63), d0 = Random(n, 64);
    const std::vector<float> zeros(n);
    const std::vector<uint16_t> marks(n, 0x7fc1);  // a NaN's bits: never a rounded value
    auto run = [&](int offset) {
      const Placed<float> X(x, offset), Y(y, offset), G(g, offset);
      Placed<float> gelu(zeros, offset), added(d0, offset), written(zeros, offset),
          sum(zeros, offset), acc(d0, offset);
      Placed<uint16_t> gelu16(marks, offset), added16(marks, offset), written16(marks, offset),
          rounded(marks, offset), alone16(marks, offset);
      GeluForward(gelu.p, X.p, n, gelu16.p);
      GeluBackward(added.p, X.p, G.p, n, added16.p, GradInto::kAdd);
      GeluBackward(written.p, X.p, G.p, n, written16.p, GradInto::kWrite);
      GeluBackward(nullptr, X.p, G.p, n, alone16.p, GradInto::kWrite);
      ResidualForward(sum.p, X.p, Y.p, n);
      ResidualBackward(acc.p, nullptr, G.p, n);
      RoundToBf16(rounded.p, X.p, n);
      return Results{
          {gelu.Host(), added.Host(), written.Host(), sum.Host(), acc.Host()},
          {gelu16.Host(), added16.Host(), written16.Host(), rounded.Host(), alone16.Host()}};
    };
    const Results aligned = run(0), off = run(1);
    ExpectSame(aligned, off);
    EXPECT_NE(aligned.halves[0], marks);  // written
  }
  // GELU's backward summing a bias gradient: four columns a thread (cols a multiple of 4,
  // aligned) or one.
  struct Shape {
    int rows, cols;
  };
  for (const Shape s : {Shape{1, 4}, Shape{130, 96}}) {
    SCOPED_TRACE(testing::Message() << "rows=" << s.rows << " cols=" << s.cols);
    const size_t n = size_t(s.rows) * s.cols;
    const auto x = Random(n, 65, 3.0f), g = Random(n, 66), d0 = Random(n, 67);
    const auto db0 = Random(size_t(s.cols), 68);
    auto run = [&](int offset) {
      const Placed<float> X(x, offset), G(g, offset);
      Placed<float> d(d0, offset);
      Placed<uint16_t> d16(std::vector<uint16_t>(n, 0x7fc1), offset);
      auto db = ToDevice(db0);
      GeluBackward(d.p, X.p, G.p, n, d16.p, GradInto::kAdd, db.data(), s.cols);
      return Results{{d.Host(), ToHost(db)}, {d16.Host()}};
    };
    const Results aligned = run(0), off = run(1);
    ExpectSame(aligned, off);
    EXPECT_FALSE(SameBits(aligned.floats[1], db0));  // summed into
  }
  // A linear layer's bias gradient (MatmulBackward's dbias, ColumnSumsAdd): four columns a
  // thread where cols is a multiple of 4 and dout aligned, else one.
  for (const Shape s : {Shape{1, 4}, Shape{130, 96}, Shape{70, 10}}) {
    SCOPED_TRACE(testing::Message() << "bias: rows=" << s.rows << " cols=" << s.cols);
    const auto g = Random(size_t(s.rows) * s.cols, 69), db0 = Random(size_t(s.cols), 70);
    auto run = [&](int offset) {
      const Placed<float> G(g, offset);
      auto db = ToDevice(db0);
      MatmulBackward(nullptr, nullptr, db.data(), G.p, nullptr, nullptr, s.rows, 1, s.cols);
      return Results{{ToHost(db)}, {}};
    };
    const Results aligned = run(0), off = run(1);
    ExpectSame(aligned, off);
    EXPECT_FALSE(SameBits(aligned.floats[0], db0));  // summed into
  }
}

}  // namespace
}  // namespace atl::kernels::cuda
