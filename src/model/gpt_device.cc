// GPT's device plumbing (see "Devices" in gpt.h): zeroing buffers where they live, keeping the
// GPU's parameters and gradients in step with the host copies (lazily, in whichever direction is
// newer), op events with host operands, and host views of the stage's output, the input's
// gradient and the logits.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <utility>
#include <vector>

#include "model/gpt.h"
#include "model/gpt_activations.h"

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

// Host views of what the last forward and backward left on the device.
template <class T>
const T* GPT<T>::stage_output(int slot) const {
  Slot& S = acts_->slots.at(size_t(slot));
  const T* out =
      S.residual3.data() + size_t(layer_end_ - layer_begin_ - 1) * acts_->rows * cfg_.n_embd;
  return HostView(out, size_t(S.B) * size_t(S.T_len) * size_t(cfg_.n_embd), S.host_output);
}

template <class T>
const T* GPT<T>::input_grad() const {
  const Slot& S = acts_->slots[size_t(acts_->last_backward_slot)];
  return HostView(acts_->dresidual.data(), size_t(S.B) * size_t(S.T_len) * size_t(cfg_.n_embd),
                  acts_->host_input_grad);
}

template <class T>
const T* GPT<T>::logits() const {
  const Slot& S = acts_->slots[0];
  if (!cuda()) return S.logits.data();
  const size_t n = size_t(S.B) * size_t(S.T_len) * size_t(vocab_end_ - vocab_begin_);
  host_logits_.resize(n);
  if (!S.logits_in_bf16) {
    CopyOut(device_, host_logits_.data(), S.logits.data(), n);
    return host_logits_.data();
  }
  // bf16 logits, rows LogitsRowStride(V) apart: each row's first V widened exactly.
  const size_t V = size_t(vocab_end_ - vocab_begin_), ld = size_t(kernels::LogitsRowStride(int(V)));
  std::vector<uint16_t> bits(n / V * ld);
  CopyOut(device_, bits.data(), S.logits_b.data(), bits.size());
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = uint32_t(bits[i / V * ld + i % V]) << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    host_logits_[i] = T(f);
  }
  return host_logits_.data();
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
  template const T* GPT<T>::HostView(const T*, size_t, std::vector<T>&) const;        \
  template const T* GPT<T>::stage_output(int) const;                                  \
  template const T* GPT<T>::input_grad() const;                                       \
  template const T* GPT<T>::logits() const;
ATL_INSTANTIATE(float)
ATL_INSTANTIATE(double)
#undef ATL_INSTANTIATE

}  // namespace atl
