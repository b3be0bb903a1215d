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

struct AdamW::DeviceState {
  cu::DeviceArray<float> m, v;
  cu::DeviceArray<float> deltas;  // what the last step moved each parameter
  cu::DeviceArray<cu::AdamSegment> segments;
  std::vector<double> segment_squares;  // host: the deltas' squares per segment
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
  d->deltas = cu::DeviceArray<float>(n);
  std::vector<cu::AdamSegment> segs;
  for (const Segment& s : segments_)
    segs.push_back({uint64_t(s.begin), uint64_t(s.end), uint64_t(s.shift), s.decay ? 1u : 0u});
  d->segments = cu::DeviceArray<cu::AdamSegment>(segs.size());
  d->segments.Upload(segs.data(), segs.size());
  d->segment_squares.assign(segs.size(), 0.0);
  device_ = std::move(d);
  moments_at_ = Newer::kHost;  // the next step uploads them
}

void AdamW::HostMoments() const {
  if (!device_ || moments_at_ != Newer::kDevice) return;
  device_->m.Download(m_.data(), m_.size());
  device_->v.Download(v_.data(), v_.size());
  transfer_bytes_ += 2 * m_.size() * sizeof(float);
  moments_at_ = Newer::kBoth;
}

void AdamW::StepOnDevice(float* params, const float* grads, double lr, float grad_scale) {
  if (!device_) throw std::logic_error("AdamW::StepOnDevice before PlaceOnDevice");
  DeviceState& d = *device_;
  if (moments_at_ == Newer::kHost) {
    d.m.Upload(m_.data(), m_.size());
    d.v.Upload(v_.data(), v_.size());
    transfer_bytes_ += 2 * m_.size() * sizeof(float);
  }
  moments_at_ = Newer::kDevice;
  ++t_;
  const Scalars sc = ScalarsAt(lr);
  const cu::AdamScalars s{sc.beta1,     sc.one_minus_beta1, sc.beta2, sc.one_minus_beta2,
                          sc.step_size, sc.inv_bc2_sqrt,    sc.eps,   sc.decay_factor,
                          grad_scale};
  const int count = int(segments_.size());
  cu::AdamWStep(params, grads, d.m.data(), d.v.data(), d.segments.data(), count, m_.size(), s,
                d.deltas.data());
  cu::SegmentSquaredSums(d.segment_squares.data(), d.deltas.data(), d.segments.data(), count);
  std::fill(update_sq_.begin(), update_sq_.end(), 0.0);
  for (size_t j = 0; j < segments_.size(); ++j)
    update_sq_[segments_[j].tensor] += d.segment_squares[j];
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

void AdamW::HostMoments() const {}

void AdamW::StepOnDevice(float*, const float*, double, float) {
  throw std::logic_error("AdamW::StepOnDevice before PlaceOnDevice");
}

#endif

}  // namespace atl
