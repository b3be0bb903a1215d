// GPT's device plumbing (see "Devices" in gpt.h): zeroing buffers where they live, keeping the
// GPU's parameters and gradients in step with the host copies (lazily, in whichever direction is
// newer), and op events with host operands.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "model/gpt.h"

namespace atl {

template <class T>
void GPT<T>::HostCurrent(std::vector<T>& host, const Buffer<T>& dev, Newer& at) const {
  transfer_bytes_ += atl::HostCurrent(at, host.data(), dev.data(), num_params_);
}

template <class T>
void GPT<T>::DeviceCurrent(const std::vector<T>& host, Buffer<T>& dev, Newer& at) {
  const size_t moved = atl::DeviceCurrent(at, host.data(), dev.data(), num_params_);
  transfer_bytes_ += moved;
  if (moved > 0 && &dev == &dparams_) params_b_current_ = false;  // uploaded: the bf16 copy is old
}

template <class T>
T* GPT<T>::DeviceNewer(const std::vector<T>& host, Buffer<T>& dev, Newer& at) {
  DeviceCurrent(host, dev, at);
  at = Newer::kDevice;
  return dev.data();
}

template <class T>
T* GPT<T>::device_params() {
  params_b_current_ = false;  // the caller may write them
  return cuda() ? DeviceNewer(params_, dparams_, params_at_) : params_.data();
}

template <class T>
T* GPT<T>::mutable_device_grads() {
  return cuda() ? DeviceNewer(grads_, dgrads_, grads_at_) : grads_.data();
}

template <class T>
const T* GPT<T>::resident_params() const {
  if (!cuda()) return params_.data();
  // Making the GPU's copy current changes no value of the model: const to its readers. It is the
  // one checked from now on: a later host read downloads it rather than trusting a host copy no
  // check sees.
  GPT& self = const_cast<GPT&>(*this);
  return self.DeviceNewer(params_, self.dparams_, params_at_);
}

template <class T>
const T* GPT<T>::device_grads() {
  if (!cuda()) return grads_.data();
  DeviceCurrent(grads_, dgrads_, grads_at_);
  return dgrads_.data();
}

template <class T>
const T* GPT<T>::HostView(const T* p, size_t n, std::vector<T>& host) const {
  if (!cuda() || p == nullptr) return p;
  host.resize(n);
  CopyOut(device_, host.data(), p, n);
  return host.data();
}

// On the GPU the hook gets host copies of out and the operands (what it writes to out goes back),
// or with device_reader the GPU's pointers.
template <class T>
void GPT<T>::EmitOp(const OpEvent& e) {
  if (!cuda()) {
    op_hook_(e);
    return;
  }
  if (op_hook_on_device_) {
    OpEvent d = e;
    d.on_device = true;
    op_hook_(d);
    return;
  }
  std::vector<T> out, a, w, bias;
  OpEvent h = e;
  const size_t rows = size_t(e.rows), cols = size_t(e.cols), inner = size_t(e.inner);
  h.out = const_cast<T*>(HostView(e.out, e.n, out));
  // An activation event's `a` has the shape of out; a GEMM's is [rows, inner], its w [inner,
  // cols] forward and [cols, inner] backward (the same count), its bias [cols].
  h.a = HostView(e.a, e.kind == OpKind::kActivation ? e.n : rows * inner, a);
  h.w = HostView(e.w, inner * cols, w);
  h.bias = HostView(e.bias, cols, bias);
  op_hook_(h);
  CopyIn(device_, e.out, out.data(), e.n);
}

#define ATL_INSTANTIATE(T)                                                            \
  template void GPT<T>::HostCurrent(std::vector<T>&, const Buffer<T>&, Newer&) const; \
  template void GPT<T>::DeviceCurrent(const std::vector<T>&, Buffer<T>&, Newer&);     \
  template T* GPT<T>::DeviceNewer(const std::vector<T>&, Buffer<T>&, Newer&);         \
  template T* GPT<T>::device_params();                                                \
  template const T* GPT<T>::device_grads();                                           \
  template const T* GPT<T>::resident_params() const;                                  \
  template T* GPT<T>::mutable_device_grads();                                         \
  template void GPT<T>::EmitOp(const OpEvent&);                                       \
  template const T* GPT<T>::HostView(const T*, size_t, std::vector<T>&) const;
ATL_INSTANTIATE(float)
ATL_INSTANTIATE(double)
#undef ATL_INSTANTIATE

}  // namespace atl
