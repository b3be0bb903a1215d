// The CUDA emulator's fibers, on which scheduler.cc runs a block's GPU threads: a stack each and
// a switch that saves only what the calling convention keeps (x86-64; ucontext elsewhere).
#pragma once

#include <cstddef>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace atl::cuda_emu {

constexpr size_t kStackBytes = size_t(64) << 10;
constexpr unsigned kMaxThreads = 1024;  // a block's threads at most, so its stacks at most

#if defined(__x86_64__)
struct Context {
  void* sp = nullptr;
};
extern "C" void atl_emu_switch(void** save_sp, void* next_sp);
#else
struct Context {
  ucontext_t uc;
};
#endif

// Makes c a context that, switched to, calls fn(arg) on the stack [stack, stack + bytes), with the
// calling thread's MXCSR and x87 control word; fn never returns.
void Start(Context* c, char* stack, size_t bytes, void (*fn)(void*), void* arg);

// Saves the running context in *from and resumes *to.
#if defined(__x86_64__)
inline void Switch(Context* from, Context* to) { atl_emu_switch(&from->sp, to->sp); }
#else
void Switch(Context* from, Context* to);
#endif

// Stack i (below kMaxThreads) of the calling host thread: kStackBytes, a guard page at its low
// end; all reserved at the first call.
char* StackOf(unsigned i);

}  // namespace atl::cuda_emu
