// AdamW on the GPU (train/optimizer.h, "On the GPU"): the moments in GPU memory, the update by
// kernels/cuda/ops.h's AdamWStep, the update's squares from its per-element moves, and the
// host's copies of the moments kept in step lazily. Without CUDA, PlaceOnDevice says so.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "train/optimizer.h"
#if ATOLL_HAVE_CUDA
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#endif

namespace atl {

#if ATOLL_HAVE_CUDA
namespace cu = kernels::cuda;

double DeviceGradSquaredSum(const float* device_grads, size_t n) {
  return cu::GradSquaredSum(device_grads, n);
}

// Pieces of at most this many elements share the update's squares out over the GPU (one block
// each; a whole wte would be one block's).
constexpr uint64_t kPiece = uint64_t(1) << 16;

struct AdamW::DeviceState {
  cu::DeviceArray<float> m, v;
  cu::DeviceArray<cu::AdamSegment> segments;
  cu::DeviceArray<float> deltas;            // what the last step moved each parameter (when wanted)
  cu::DeviceArray<cu::AdamSegment> pieces;  // the segments cut into kPiece elements
  std::vector<size_t> piece_tensor;         // host: each piece's tensor
  std::vector<double> piece_squares;        // host: the deltas' squares per piece
};

void AdamW::DeleteDeviceState::operator()(DeviceState* d) const { delete d; }

void AdamW::PlaceOnDevice() {
  if (device_) return;
  for (const Segment& s : segments_)
    if (s.shift != 0)
      throw std::logic_error("AdamW::PlaceOnDevice: a sharded optimizer (ZeRO) stays on the host");
  std::string why;
  if (!cu::Available(&why)) throw std::runtime_error("AdamW on the GPU: " + why);
  std::unique_ptr<DeviceState, DeleteDeviceState> d(new DeviceState);
  const size_t n = m_.size();
  d->m = cu::DeviceArray<float>(n);
  d->v = cu::DeviceArray<float>(n);
  std::vector<cu::AdamSegment> segs, pieces;
  for (const Segment& s : segments_) {
    segs.push_back({uint64_t(s.begin), uint64_t(s.end), uint64_t(s.shift), s.decay ? 1u : 0u});
    for (uint64_t b = s.begin; b < s.end; b += kPiece) {
      pieces.push_back({b, std::min<uint64_t>(s.end, b + kPiece), 0, 0});
      d->piece_tensor.push_back(s.tensor);
    }
  }
  d->segments = cu::DeviceArray<cu::AdamSegment>(segs.size());
  d->segments.Upload(segs.data(), segs.size());
  d->pieces = cu::DeviceArray<cu::AdamSegment>(pieces.size());
  d->pieces.Upload(pieces.data(), pieces.size());
  d->piece_squares.assign(pieces.size(), 0.0);
  device_ = std::move(d);
  m_at_ = v_at_ = Newer::kHost;  // the next step uploads them
}

void AdamW::HostMoment(std::vector<float>& host, Newer& at) const {
  if (!device_) return;
  const cu::DeviceArray<float>& dev = &host == &m_ ? device_->m : device_->v;
  transfer_bytes_ += HostCurrent(at, host.data(), dev.data(), host.size());
}

const float* AdamW::ResidentMoment(const std::vector<float>& host, Newer& at) const {
  if (!device_) return host.data();
  cu::DeviceArray<float>& dev = &host == &m_ ? device_->m : device_->v;
  transfer_bytes_ += DeviceCurrent(at, host.data(), dev.data(), host.size());
  at = Newer::kDevice;  // the checked copy: a host read downloads it
  return dev.data();
}

void AdamW::StepOnDevice(float* params, const float* grads, double lr, float grad_scale) {
  if (!device_) throw std::logic_error("AdamW::StepOnDevice before PlaceOnDevice");
  DeviceState& d = *device_;
  transfer_bytes_ += DeviceCurrent(m_at_, m_.data(), d.m.data(), m_.size());
  transfer_bytes_ += DeviceCurrent(v_at_, v_.data(), d.v.data(), v_.size());
  m_at_ = v_at_ = Newer::kDevice;
  ++t_;
  const Scalars sc = ScalarsAt(lr);
  const cu::AdamScalars s{sc.beta1,     sc.one_minus_beta1, sc.beta2, sc.one_minus_beta2,
                          sc.step_size, sc.inv_bc2_sqrt,    sc.eps,   sc.decay_factor,
                          grad_scale};
  std::fill(update_sq_.begin(), update_sq_.end(), 0.0);
  if (update_squares_on_ && d.deltas.size() != m_.size())
    d.deltas = cu::DeviceArray<float>(m_.size());
  cu::AdamWStep(params, grads, d.m.data(), d.v.data(), d.segments.data(), int(segments_.size()),
                m_.size(), s, update_squares_on_ ? d.deltas.data() : nullptr);
  if (!update_squares_on_) return;
  cu::SegmentSquaredSums(d.piece_squares.data(), d.deltas.data(), d.pieces.data(),
                         int(d.piece_squares.size()));
  for (size_t j = 0; j < d.piece_squares.size(); ++j)
    update_sq_[d.piece_tensor[j]] += d.piece_squares[j];
}

#else

double DeviceGradSquaredSum(const float*, size_t) {
  throw std::runtime_error("this atoll was built without CUDA (no nvcc when it was configured)");
}

struct AdamW::DeviceState {};

void AdamW::DeleteDeviceState::operator()(DeviceState* d) const { delete d; }

void AdamW::PlaceOnDevice() {
  throw std::runtime_error(
      "AdamW on the GPU: this atoll was built without CUDA (no nvcc when it was configured)");
}

void AdamW::HostMoment(std::vector<float>&, Newer&) const {}

const float* AdamW::ResidentMoment(const std::vector<float>& host, Newer&) const {
  return host.data();
}

void AdamW::StepOnDevice(float*, const float*, double, float) {
  throw std::logic_error("AdamW::StepOnDevice before PlaceOnDevice");
}

#endif

}  // namespace atl
