// The compute kernels of GPT-2 training: one forward and one backward function per layer, plain
// functions over raw pointers (llm.c style), templated on the real type (float trains; double is
// the reference path for finite-difference tests).
//
// This header is backend-neutral: it says what each op computes, in which layout, and what it
// promises about determinism. cpu/ implements it with OpenBLAS + OpenMP + AVX-512; a CUDA
// backend would implement the same declarations over device pointers.
//
// Conventions
// - Row-major everywhere. B batch, T sequence length, C channels, NH heads, V vocabulary,
//   N = B*T rows. Linear weights are Hugging Face Conv1D layout [in, out]: y = x W + b.
// - Every *Backward function ADDS into its gradient outputs (parameter gradients and activation
//   gradients alike), so the caller zeroes them once and micro-batches accumulate. A gradient
//   pointer may be null where noted, and that gradient is then skipped.
// - Inputs and outputs of one call must not alias unless noted.
//
// Determinism (the contract the model and trainer rely on): for fixed shapes and inputs, every
// function returns bitwise-identical results for any OpenMP thread count. The CPU backend gets
// this by construction: work is cut into fixed chunks whose boundaries depend only on the shapes,
// each output element is written by exactly one chunk (one BLAS call or one loop), OpenBLAS runs
// single-threaded inside each chunk, and every reduction that crosses chunks (bias gradients,
// LayerNorm weight gradients, the mean loss) runs in a fixed order. No atomics, no per-thread
// partial sums.
//
// Thread-safety: the functions are reentrant, but each uses all OpenMP threads; call them from
// one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace atl::kernels {

// ---- Backend setup ------------------------------------------------------------------------

struct BackendInfo {
  std::string blas_core;         // OpenBLAS kernel family in use, e.g. "SkylakeX"
  bool blas_retargeted = false;  // true if InitBackend switched OpenBLAS's kernel family
  int max_threads = 1;           // omp_get_max_threads()
};

// Prepares the backend; idempotent, cheap after the first call. The GPT constructor calls it;
// call it yourself before timing raw kernels.
// - Pins OpenBLAS to one thread (parallelism comes from the fixed OpenMP chunks above).
// - OpenBLAS kernel family. SGEMM on AVX-512 Zen CPUs runs at ~190 GFLOP/s per core with
//   OpenBLAS's SkylakeX/Cooperlake kernels and ~100 with its AVX2 (Haswell, Zen) ones.
//   * OPENBLAS_CORETYPE set: respected (it is read when libopenblas loads; an explicit choice,
//     e.g. to pin numerics across machines). If it names an AVX2 family on an AVX-512 CPU,
//     InitBackend logs a warning once saying what that costs. (The dev VM's environment sets
//     OPENBLAS_CORETYPE=Haswell; unset, OpenBLAS 0.3.21 picks Cooperlake on its Zen 5 CPU.)
//   * unset: if OpenBLAS chose an AVX2 family although the CPU has AVX-512 (F, DQ, BW, VL), as
//     OpenBLAS versions without the CPU in their tables do, it switches to SkylakeX (SetBlasCore).
// REQUIRES: no BLAS call is running in another thread during the first call.
BackendInfo InitBackend();

// OpenMP threads waiting at a barrier spin by default (libgomp: ~3 ms before sleeping). On a
// machine whose cores other jobs share, the spinning thread takes the core its sibling needs:
// on the 2-vCPU dev VM under load, the `small` model step took ~1000 ms with 2 threads spinning
// and ~450 ms with OMP_WAIT_POLICY=passive (about the 1-thread time). libgomp reads the variable
// only when it loads, so a program cannot set it for itself; this re-executes the program
// (/proc/self/exe, same argv, same pid) with OMP_WAIT_POLICY=passive added, when it is unset.
// Call it first thing in main(), before threads, MPI or open files matter. Returns false (and
// does nothing) when OMP_WAIT_POLICY is already set, when ATOLL_NO_REEXEC is set non-empty, or
// when the exec fails; on success it does not return.
bool ReexecWithRuntimeDefaults(char** argv);

// Switches OpenBLAS's kernel family now, without restarting the process: sets OPENBLAS_CORETYPE
// (so child processes inherit it) and re-runs OpenBLAS's own load-time selection (DYNAMIC_ARCH
// builds; a no-op elsewhere). Names as OPENBLAS_CORETYPE takes them ("SkylakeX", "Haswell",
// "Cooperlake", ...). Returns the family in use afterwards (OpenBLAS keeps its own choice for
// names it does not know). Results of BLAS calls can differ in the last bits between families.
// REQUIRES: no BLAS call is running in any thread; no other thread reads the environment.
std::string SetBlasCore(const std::string& name);

// ---- Encoder: token + position embeddings --------------------------------------------------

// out[b,t,:] = wte[inp[b,t],:] + wpe[t,:].  out [B,T,C]; wte [V,C]; wpe [>=T,C].
// Vocab-parallel shard (vocab_end >= 0): wte holds only rows [vocab_begin, vocab_end) (row 0 is
// token vocab_begin) and tokens outside contribute zeros; wpe may then be null (not added).
template <class T>
void EncoderForward(T* out, const int32_t* inp, const T* wte, const T* wpe, int B, int T_, int C,
                    int vocab_begin = 0, int vocab_end = -1);
// dwte[inp[b,t],:] += dout[b,t,:]; dwpe[t,:] += sum_b dout[b,t,:]. Repeated tokens accumulate in
// (b,t) order. dwte or dwpe may be null. With vocab_end >= 0 only tokens in [vocab_begin,
// vocab_end) add into dwte, at row token - vocab_begin.
template <class T>
void EncoderBackward(T* dwte, T* dwpe, const T* dout, const int32_t* inp, int B, int T_, int C,
                     int vocab_begin = 0, int vocab_end = -1);

// ---- LayerNorm (eps 1e-5, biased variance, as GPT-2) -----------------------------------------

// out[n,:] = (inp[n,:] - mean[n]) * rstd[n] * weight + bias.  Saves mean[N], rstd[N].
template <class T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int N,
                      int C);
// dinp, dweight, dbias ADD. dweight/dbias are column sums over the N rows, in row order.
template <class T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                       const T* mean, const T* rstd, int N, int C);

// ---- Linear layer (HF Conv1D) ----------------------------------------------------------------

// out[N,OC] = inp[N,IC] · weight[IC,OC] + bias[OC] (bias may be null).
template <class T>
void MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int N, int IC, int OC);
// dinp[N,IC] += dout · weight^T; dweight[IC,OC] += inp^T · dout; dbias[OC] += column sums of dout
// (rows in order). Any of dinp, dweight, dbias may be null.
template <class T>
void MatmulBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                    int N, int IC, int OC);

// ---- Causal multi-head self-attention ----------------------------------------------------------

// qkv [B,T,3C] holds q, k, v side by side (HF c_attn order); head h uses columns [h*hs, (h+1)*hs)
// of each, hs = C/NH. att [B,NH,T,T] receives the softmax probabilities (zero above the
// diagonal); out [B,T,C] = att · v per head, heads side by side.
template <class T>
void AttentionForward(T* out, T* att, const T* qkv, int B, int T_, int C, int NH);
// dqkv [B,T,3C] ADDS. scratch: B*NH*T*T elements, overwritten.
template <class T>
void AttentionBackward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att, int B,
                       int T_, int C, int NH);

// ---- GELU, tanh approximation (as GPT-2) -------------------------------------------------------

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).  out may alias inp.
template <class T>
void GeluForward(T* out, const T* inp, size_t n);
// dinp += gelu'(inp) * dout.
template <class T>
void GeluBackward(T* dinp, const T* inp, const T* dout, size_t n);

// ---- Residual ----------------------------------------------------------------------------------

// out = a + b.
template <class T>
void ResidualForward(T* out, const T* a, const T* b, size_t n);
// da += dout; db += dout (either may be null).
template <class T>
void ResidualBackward(T* da, T* db, const T* dout, size_t n);

// ---- Tied LM head with softmax cross-entropy ---------------------------------------------------

// logits[N,V] = x[N,C] · wte[V,C]^T. If targets is non-null also computes, per row, lse[n] =
// log sum_v exp(logits[n,v]) and losses[n] = lse[n] - logits[n, targets[n]], and returns the mean
// of losses (summed in row order); else returns 0 and leaves lse, losses untouched.
// scratch: ClassifierForwardScratch(N, V) elements, overwritten (may be null without targets).
template <class T>
T ClassifierForward(T* logits, T* lse, T* losses, T* scratch, const T* x, const T* wte,
                    const int32_t* targets, int N, int C, int V);
size_t ClassifierForwardScratch(int N, int V);
// Backward of dloss * sum_n losses[n] through the softmax and the tied head:
//   dlogits[n,v] = dloss * (exp(logits[n,v] - lse[n]) - [v == targets[n]])
//   dx[N,C] += dlogits · wte;  dwte[V,C] += dlogits^T · x.
// For the mean loss pass dloss = 1/N. dlogits is never stored whole: it is formed tile by tile
// from logits and lse. scratch: ClassifierBackwardScratch(N, C, V) elements, overwritten.
template <class T>
void ClassifierBackward(T* dx, T* dwte, T* scratch, const T* logits, const T* lse, const T* x,
                        const T* wte, const int32_t* targets, T dloss, int N, int C, int V);
size_t ClassifierBackwardScratch(int N, int C, int V);
// The row stride of the GPU's bf16 logits (kernels/cuda/ops.h ClassifierForward's logits_bf16): V
// rounded up to a multiple of 64 (50257 -> 50304), so that every row starts 128-byte aligned, as
// the GPU's fastest GEMMs (Hopper's TMA: strides multiples of 16 bytes) want of the product's
// result and of the gradient read back from it. The padding columns are never read.
constexpr int64_t LogitsRowStride(int V) { return (int64_t(V) + 63) / 64 * 64; }

}  // namespace atl::kernels
