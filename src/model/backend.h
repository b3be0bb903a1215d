// Where a GPT's buffers live and which kernels run on them: the CPU backend (kernels/ops.h) or,
// when atoll is built with CUDA, the GPU backend (kernels/cuda/ops.h). GPT uses these two pieces
// so that one forward and one backward serve both devices:
//   - Buffer<T>: an array on the host or on the GPU, zeroed at allocation;
//   - Ops<T>: each op of ops.h, sent to the device's backend (float only on the GPU).
// Everything here is inline; without CUDA the GPU branches compile away and Device::kCuda is
// refused by DeviceUsable.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/attention_blocks.h"
#include "kernels/grad_into.h"
#include "kernels/ops.h"
#if ATOLL_HAVE_CUDA
#include "kernels/cuda/attention_tune.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#endif

namespace atl {

enum class Device { kCpu, kCuda };

inline const char* DeviceName(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

// "cpu" or "cuda"; false for anything else.
inline bool ParseDevice(const std::string& s, Device* out) {
  if (s == "cpu")
    *out = Device::kCpu;
  else if (s == "cuda")
    *out = Device::kCuda;
  else
    return false;
  return true;
}

// Whether this build and this machine can run on `d`; when not, *why says why.
inline bool DeviceUsable(Device d, std::string* why) {
  if (d == Device::kCpu) return true;
#if ATOLL_HAVE_CUDA
  return kernels::cuda::Available(why);
#else
  *why = "this atoll was built without CUDA (no nvcc when it was configured)";
  return false;
#endif
}

// The GPU's matrix products on bf16 operands (float sums and results) or float: the process's
// setting (kernels/cuda/ops.h SetBf16Matmul). Nothing to set without CUDA.
inline void SetBf16Matmul(bool on) {
#if ATOLL_HAVE_CUDA
  kernels::cuda::SetBf16Matmul(on);
#else
  (void)on;
#endif
}

// Whether the GPU is atoll's CUDA emulator (kernels/cuda/runtime.h Emulated; false without CUDA).
inline bool GpuEmulated() {
#if ATOLL_HAVE_CUDA
  return kernels::cuda::Emulated();
#else
  return false;
#endif
}

// Whether the GPU's products are on bf16 operands now (false without CUDA).
inline bool Bf16Matmul() {
#if ATOLL_HAVE_CUDA
  return kernels::cuda::Bf16Matmul();
#else
  return false;
#endif
}

// Float elements the GPU has rounded to bf16 for products so far (kernels/cuda/ops.h; 0 without
// CUDA).
inline uint64_t Bf16RoundedElements() {
#if ATOLL_HAVE_CUDA
  return kernels::cuda::Bf16RoundedElements();
#else
  return 0;
#endif
}

// The rows of a block of the GPU's tensor-core attention kernels (kernels/attention_blocks.h,
// kernels/cuda/ops.h SetAttentionBlockRows: the same bits, a question of speed); returns the
// previous setting. Without CUDA nothing is set (64/64 returned), and rows other than 64 or 128
// are refused all the same.
inline kernels::AttentionBlockRows SetAttentionBlockRows(kernels::AttentionBlockRows rows) {
#if ATOLL_HAVE_CUDA
  return kernels::cuda::SetAttentionBlockRows(rows);
#else
  kernels::CheckAttentionBlockRows(rows);
  return {};
#endif
}

// How the GPU's tensor-core attention computes dQ (kernels/attention_blocks.h, kernels/cuda/ops.h
// SetAttentionBackwardKind); returns the previous setting. Without CUDA nothing is set (kSplit
// returned).
inline kernels::AttentionBackwardKind SetAttentionBackwardKind(
    kernels::AttentionBackwardKind backward) {
#if ATOLL_HAVE_CUDA
  return kernels::cuda::SetAttentionBackwardKind(backward);
#else
  (void)backward;
  return kernels::AttentionBackwardKind::kSplit;
#endif
}

// Each block-row setting's forward + backward seconds at this shape (kAttentionBlockRowsAll's
// order; kernels/attention_blocks.h ChooseAttentionBlockRows picks from them), timed on this GPU
// now under the precision and backward kind set (kernels/cuda/attention_tune.h), the setting left
// as it was. Empty, with *why_not, where nothing is timed: the attention at this shape off the
// tensor cores, the CUDA emulator (whose times say nothing of a GPU's), a build without CUDA.
inline std::vector<double> TimeAttentionBlockRows(int B, int T, int C, int NH,
                                                  std::string* why_not) {
#if ATOLL_HAVE_CUDA
  if (GpuEmulated()) {
    *why_not = "on the CUDA emulator, whose times say nothing of a GPU's";
    return {};
  }
  const kernels::cuda::AttentionTimings t = kernels::cuda::TimeAttentionBlockRows(B, T, C, NH);
  *why_not = t.why_not;
  return t.Totals();
#else
  (void)B, (void)T, (void)C, (void)NH;
  *why_not = "this atoll was built without CUDA";
  return {};
#endif
}

// The bf16 elements the GPU's attention forward keeps for its backward at this shape now
// (kernels/cuda/ops.h AttentionKeptElements; 0 without CUDA).
inline size_t AttentionKeptElements(int B, int T, int C, int NH) {
#if ATOLL_HAVE_CUDA
  return kernels::cuda::AttentionKeptElements(B, T, C, NH);
#else
  (void)B, (void)T, (void)C, (void)NH;
  return 0;
#endif
}

// What a device computes with, for comparing replicas' bits: "cpu", or "cuda <GPU name> sm_XY
// cudart <version>".
inline std::string DeviceDescription(Device d) {
#if ATOLL_HAVE_CUDA
  if (d == Device::kCuda) {
    const kernels::cuda::DeviceInfo info = kernels::cuda::Probe();
    return fmt::format("cuda {} sm_{}{} cudart {}", info.name, info.cc_major, info.cc_minor,
                       kernels::cuda::RuntimeVersion());
  }
#endif
  return DeviceName(d);
}

// An array of T on the host or the GPU. Host buffers are plain vectors (index them); device
// buffers only give their pointer.
template <class T>
class Buffer {
 public:
  void Allocate(Device d, size_t n) {
    device_ = d;
#if ATOLL_HAVE_CUDA
    if (d == Device::kCuda) {
      dev_ = kernels::cuda::DeviceArray<T>(n);
      dev_.SetZero();
      return;
    }
#endif
    host_.assign(n, T(0));
  }
  T* data() { return device_ == Device::kCuda ? DevicePtr() : host_.data(); }
  const T* data() const {
    return device_ == Device::kCuda ? const_cast<Buffer*>(this)->DevicePtr() : host_.data();
  }
  size_t size() const { return device_ == Device::kCuda ? DeviceSize() : host_.size(); }
  // Every element 0 (on the GPU: queued).
  void SetZero() {
#if ATOLL_HAVE_CUDA
    if (device_ == Device::kCuda) return dev_.SetZero();
#endif
    std::fill(host_.begin(), host_.end(), T(0));
  }
  // Host buffers only.
  T& operator[](size_t i) { return host_[i]; }
  const T& operator[](size_t i) const { return host_[i]; }
  std::vector<T>& host() { return host_; }

 private:
#if ATOLL_HAVE_CUDA
  T* DevicePtr() { return dev_.data(); }
  size_t DeviceSize() const { return dev_.size(); }
  kernels::cuda::DeviceArray<T> dev_;
#else
  T* DevicePtr() { return nullptr; }
  size_t DeviceSize() const { return 0; }
#endif
  Device device_ = Device::kCpu;
  std::vector<T> host_;
};

// Copies between host memory and a buffer of `device` (either side may be the host).
template <class T>
void CopyIn(Device device, T* dst, const T* host_src, size_t n) {
#if ATOLL_HAVE_CUDA
  if (device == Device::kCuda) return kernels::cuda::CopyToDevice(dst, host_src, n * sizeof(T));
#endif
  std::copy(host_src, host_src + n, dst);
}
template <class T>
void CopyOut(Device device, T* host_dst, const T* src, size_t n) {
#if ATOLL_HAVE_CUDA
  if (device == Device::kCuda) return kernels::cuda::CopyToHost(host_dst, src, n * sizeof(T));
#endif
  std::copy(src, src + n, host_dst);
}

// *slot = max(*slot, the largest |x_i| of n floats), all in GPU memory (infinity when one is not
// finite), queued: the step guard's activation signal (train/sdc/monitor.h), read there and
// downloaded once a step.
inline void DeviceMaxAbsInto(float* slot, const float* x, size_t n) {
#if ATOLL_HAVE_CUDA
  kernels::cuda::MaxAbsInto(slot, x, n);
#else
  (void)slot, (void)x, (void)n;
  throw std::logic_error("DeviceMaxAbsInto in an atoll built without CUDA");
#endif
}

// Bytes copied host -> GPU and GPU -> host so far in this process ({0, 0} without CUDA).
inline std::pair<uint64_t, uint64_t> DeviceCopies() {
#if ATOLL_HAVE_CUDA
  const kernels::cuda::CopyCounts c = kernels::cuda::Copied();
  return {c.to_device, c.to_host};
#else
  return {0, 0};
#endif
}

// Bytes the GPU's zeroing passes have set so far in this process (0 without CUDA).
inline uint64_t DeviceZeroed() {
#if ATOLL_HAVE_CUDA
  return kernels::cuda::Zeroed();
#else
  return 0;
#endif
}

// Times the host has waited for the GPU so far in this process (0 without CUDA): each one idles
// the GPU until the host issues more work.
inline uint64_t DeviceWaits() {
#if ATOLL_HAVE_CUDA
  return kernels::cuda::Copied().waits;
#else
  return 0;
#endif
}

// Waits for the GPU's queued work (nothing on the CPU, or without CUDA).
inline void SynchronizeDevice() {
#if ATOLL_HAVE_CUDA
  kernels::cuda::Synchronize();
#endif
}

// Which copy of a buffer kept both on the host and on the GPU is newer (kBoth: they are the same):
// GPT's parameters and gradients, AdamW's moments on the GPU.
enum class Newer { kHost, kDevice, kBoth };

// The host's copy made current: the GPU's n elements downloaded when they are newer; then both
// are the same. Returns the bytes moved.
template <class T>
size_t HostCurrent(Newer& at, T* host, const T* dev, size_t n) {
  if (at != Newer::kDevice) return 0;
  CopyOut(Device::kCuda, host, dev, n);
  at = Newer::kBoth;
  return n * sizeof(T);
}
// The GPU's copy made current: the host's n elements uploaded when they are newer.
template <class T>
size_t DeviceCurrent(Newer& at, const T* host, T* dev, size_t n) {
  if (at != Newer::kHost) return 0;
  CopyIn(Device::kCuda, dev, host, n);
  at = Newer::kBoth;
  return n * sizeof(T);
}

// The ops of kernels/ops.h on one device. On the GPU (float only): device pointers throughout,
// plus the token ids on the host for the embedding gradient, and the bf16 copies of the products'
// inputs (kernels/cuda/ops.h; `*_b`, null for none), which the CPU has no use for. A backward
// given GradInto::kWrite writes its input gradient over the buffer (kernels/grad_into.h): the
// GPU's kernels do so themselves; on the CPU the buffer is zeroed first, then added to.
template <class T>
struct Ops {
  using GradInto = kernels::GradInto;
  bool cuda = false;
#if ATOLL_HAVE_CUDA
  static constexpr bool kCan = std::is_same_v<T, float>;
#define ATL_GPU(call)      \
  if constexpr (kCan) {    \
    if (cuda) return call; \
  }
#else
#define ATL_GPU(call)
#endif
  void EncoderForward(T* out, const int32_t* inp, const T* wte, const T* wpe, int B, int T_, int C,
                      int vb, int ve) const {
    ATL_GPU(kernels::cuda::EncoderForward(out, inp, wte, wpe, B, T_, C, vb, ve));
    kernels::EncoderForward(out, inp, wte, wpe, B, T_, C, vb, ve);
  }
  void EncoderBackward(T* dwte, T* dwpe, const T* dout, const int32_t* inp, const int32_t* host_inp,
                       int B, int T_, int C, int vb, int ve) const {
    ATL_GPU(kernels::cuda::EncoderBackward(dwte, dwpe, dout, inp, host_inp, B, T_, C, vb, ve));
    kernels::EncoderBackward(dwte, dwpe, dout, host_inp, B, T_, C, vb, ve);
  }
  void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int N,
                        int C, uint16_t* out_b = nullptr) const {
    ATL_GPU(kernels::cuda::LayerNormForward(out, mean, rstd, inp, w, b, N, C, out_b));
    kernels::LayerNormForward(out, mean, rstd, inp, w, b, N, C);
  }
  // res = a + b, then LayerNormForward of res (one kernel on the GPU; the same bits).
  void ResidualLayerNormForward(T* res, const T* a, const T* b, T* out, T* mean, T* rstd,
                                const T* w, const T* bias, int N, int C,
                                uint16_t* out_b = nullptr) const {
    ATL_GPU(
        kernels::cuda::ResidualLayerNormForward(res, a, b, out, mean, rstd, w, bias, N, C, out_b));
    kernels::ResidualForward(res, a, b, size_t(N) * size_t(C));
    kernels::LayerNormForward(out, mean, rstd, res, w, bias, N, C);
  }
  void LayerNormBackward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w,
                         const T* mean, const T* rstd, int N, int C, uint16_t* dinp_b = nullptr,
                         GradInto into = GradInto::kAdd) const {
    ATL_GPU(kernels::cuda::LayerNormBackward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, dinp_b,
                                             into));
    ZeroFor(into, dinp, size_t(N) * size_t(C));
    kernels::LayerNormBackward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void MatmulForward(T* out, const T* inp, const T* w, const T* b, int N, int IC, int OC,
                     const uint16_t* inp_b = nullptr, const uint16_t* w_b = nullptr) const {
    ATL_GPU(kernels::cuda::MatmulForward(out, inp, w, b, N, IC, OC,
                                         (kernels::cuda::Bf16Copies{inp_b, nullptr, w_b})));
    kernels::MatmulForward(out, inp, w, b, N, IC, OC);
  }
  void MatmulBackward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, int N, int IC,
                      int OC, const uint16_t* inp_b = nullptr, const uint16_t* dout_b = nullptr,
                      const uint16_t* w_b = nullptr, GradInto into = GradInto::kAdd) const {
    ATL_GPU(kernels::cuda::MatmulBackward(dinp, dw, db, dout, inp, w, N, IC, OC,
                                          (kernels::cuda::Bf16Copies{inp_b, dout_b, w_b}), into));
    ZeroFor(into, dinp, size_t(N) * size_t(IC));
    kernels::MatmulBackward(dinp, dw, db, dout, inp, w, N, IC, OC);
  }
  // att: the probabilities [B, NH, T, T] on the CPU; each row's log-sum-exp [B, NH, T] on the GPU
  // (flash-style, kernels/cuda/ops.h), whose backward also reads the forward's out. keep, kept:
  // the GPU's only (the bf16 operands the backward of that forward takes; ops.h there).
  void AttentionForward(T* out, T* att, const T* qkv, int B, int T_, int C, int NH,
                        uint16_t* out_b = nullptr, uint16_t* keep = nullptr) const {
    ATL_GPU(kernels::cuda::AttentionForward(out, att, qkv, B, T_, C, NH, out_b, keep));
    kernels::AttentionForward(out, att, qkv, B, T_, C, NH);
  }
  // scratch: the CPU's (B*NH*T*T elements); the GPU uses its own.
  void AttentionBackward(T* dqkv, T* scratch, const T* dout, const T* out, const T* qkv,
                         const T* att, int B, int T_, int C, int NH, uint16_t* dqkv_b = nullptr,
                         GradInto into = GradInto::kAdd, const uint16_t* kept = nullptr) const {
    ATL_GPU(kernels::cuda::AttentionBackward(dqkv, dout, out, qkv, att, B, T_, C, NH, dqkv_b, into,
                                             kept));
    ZeroFor(into, dqkv, size_t(B) * size_t(T_) * 3 * size_t(C));
    kernels::AttentionBackward(dqkv, scratch, dout, qkv, att, B, T_, C, NH);
  }
  void GeluForward(T* out, const T* inp, size_t n, uint16_t* out_b = nullptr) const {
    ATL_GPU(kernels::cuda::GeluForward(out, inp, n, out_b));
    kernels::GeluForward(out, inp, n);
  }
  // dbias, cols: the GPU's only (kernels/cuda/ops.h: the bias gradient of the linear layer whose
  // dout dinp is, summed here).
  void GeluBackward(T* dinp, const T* inp, const T* dout, size_t n, uint16_t* dinp_b = nullptr,
                    GradInto into = GradInto::kAdd, T* dbias = nullptr, int cols = 0) const {
    ATL_GPU(kernels::cuda::GeluBackward(dinp, inp, dout, n, dinp_b, into, dbias, cols));
    if (dbias != nullptr) throw std::logic_error("GeluBackward: bias sums are the GPU's only");
    (void)cols;
    ZeroFor(into, dinp, n);
    kernels::GeluBackward(dinp, inp, dout, n);
  }
  void ResidualForward(T* out, const T* a, const T* b, size_t n) const {
    ATL_GPU(kernels::cuda::ResidualForward(out, a, b, n));
    kernels::ResidualForward(out, a, b, n);
  }
  // scratch: the CPU's (ClassifierForwardScratch / BackwardScratch); the GPU uses its own.
  T ClassifierForward(T* logits, T* lse, T* losses, T* scratch, const T* x, const T* wte,
                      const int32_t* targets, int N, int C, int V, const uint16_t* x_b = nullptr,
                      const uint16_t* wte_b = nullptr, uint16_t* logits_b = nullptr) const {
    ATL_GPU(kernels::cuda::ClassifierForward(logits, lse, losses, x, wte, targets, N, C, V,
                                             (kernels::cuda::Bf16Copies{x_b, nullptr, wte_b}),
                                             logits_b));
    (void)logits_b;
    return kernels::ClassifierForward(logits, lse, losses, scratch, x, wte, targets, N, C, V);
  }
  void ClassifierBackward(T* dx, T* dwte, T* scratch, const T* logits, const T* lse, const T* x,
                          const T* wte, const int32_t* targets, T dloss, int N, int C, int V,
                          const uint16_t* x_b = nullptr, const uint16_t* wte_b = nullptr,
                          GradInto into = GradInto::kAdd,
                          const uint16_t* logits_b = nullptr) const {
    ATL_GPU(kernels::cuda::ClassifierBackward(dx, dwte, logits, lse, x, wte, targets, dloss, N, C,
                                              V, (kernels::cuda::Bf16Copies{x_b, nullptr, wte_b}),
                                              into, logits_b));
    (void)logits_b;
    ZeroFor(into, dx, size_t(N) * size_t(C));
    kernels::ClassifierBackward(dx, dwte, scratch, logits, lse, x, wte, targets, dloss, N, C, V);
  }
  // dst[i] = src[i] rounded to bf16 (bits), i < n: the GPU only (the CPU has no bf16 products).
  void RoundToBf16(uint16_t* dst, const T* src, size_t n) const {
    ATL_GPU(kernels::cuda::RoundToBf16(dst, src, n));
    (void)dst, (void)src, (void)n;
  }
  // Zeroes n elements at p (p on this device).
  void Zero(T* p, size_t n) const {
    ATL_GPU(kernels::cuda::Zero(p, n * sizeof(T)));
    std::fill(p, p + n, T(0));
  }
  // Waits for the device (for the per-op profile); nothing on the CPU.
  void Sync() const { ATL_GPU(kernels::cuda::Synchronize()); }
#undef ATL_GPU

 private:
  // On the CPU, a gradient to write is zeroed (static chunks: values, so any split is exact),
  // then added to.
  static void ZeroFor(GradInto into, T* p, size_t n) {
    if (into != GradInto::kWrite || p == nullptr) return;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < int64_t(n); ++i) p[i] = T(0);
  }
};

}  // namespace atl
