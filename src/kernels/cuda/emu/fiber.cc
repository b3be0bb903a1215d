// The CUDA emulator's fibers (fiber.h).
#include "kernels/cuda/emu/fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <stdexcept>

namespace atl::cuda_emu {

#if defined(__x86_64__)
extern "C" void atl_emu_start();
// Saves the callee-saved registers, MXCSR and the x87 control word on the current stack, stores
// the stack pointer in *save_sp, and resumes the context whose stack pointer is next_sp. A new
// context's stack is laid out as if it had called atl_emu_switch from atl_emu_start, which calls
// r13(r12) (the fiber's function and argument) and never returns.
asm(R"(
  .text
  .globl atl_emu_switch
  .type atl_emu_switch, @function
atl_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size atl_emu_switch, .-atl_emu_switch
  .globl atl_emu_start
  .type atl_emu_start, @function
atl_emu_start:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size atl_emu_start, .-atl_emu_start
)");

void Start(Context* c, char* stack, size_t bytes, void (*fn)(void*), void* arg) {
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t(15);
  auto* sp = reinterpret_cast<uint64_t*>(top - 80);  // 16-aligned: after `ret`, rsp % 16 == 0
  uint32_t csr = 0;
  uint16_t fcw = 0;
  asm volatile("stmxcsr %0" : "=m"(csr));
  asm volatile("fnstcw %0" : "=m"(fcw));
  sp[0] = uint64_t(csr) | (uint64_t(fcw) << 32);
  sp[1] = 0;                                // r15
  sp[2] = 0;                                // r14
  sp[3] = reinterpret_cast<uint64_t>(fn);   // r13
  sp[4] = reinterpret_cast<uint64_t>(arg);  // r12
  sp[5] = 0;                                // rbx
  sp[6] = 0;                                // rbp
  sp[7] = reinterpret_cast<uint64_t>(&atl_emu_start);
  c->sp = sp;
}
#else
// makecontext passes ints: the function is always the same one, the argument goes in two halves.
namespace {
void (*g_fiber_fn)(void*) = nullptr;
void Trampoline(unsigned lo, unsigned hi) {
  g_fiber_fn(reinterpret_cast<void*>((uintptr_t(hi) << 32) | uintptr_t(lo)));
}
}  // namespace
void Start(Context* c, char* stack, size_t bytes, void (*fn)(void*), void* arg) {
  g_fiber_fn = fn;
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack;
  c->uc.uc_stack.ss_size = bytes;
  c->uc.uc_link = nullptr;
  const auto bits = reinterpret_cast<uintptr_t>(arg);
  makecontext(&c->uc, reinterpret_cast<void (*)()>(&Trampoline), 2, unsigned(bits),
              unsigned(bits >> 32));
}
void Switch(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }
#endif

char* StackOf(unsigned i) {
  static thread_local char* base = nullptr;
  if (base == nullptr) {
    const size_t total = kStackBytes * kMaxThreads;
    void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("CUDA emulator: no memory for thread stacks");
    base = static_cast<char*>(p);
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    for (unsigned t = 0; t < kMaxThreads; ++t) mprotect(base + t * kStackBytes, page, PROT_NONE);
  }
  return base + size_t(i) * kStackBytes;
}

}  // namespace atl::cuda_emu
