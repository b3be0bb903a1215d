// The CUDA emulator's launches (device.h): a grid's blocks in turn, a block's threads as fibers
// switched at barriers, and the deadlocks and bad shapes that would hang or fail on a GPU turned
// into launch errors that name the kernel.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_runtime.h"
#include "kernels/cuda/emu/fiber.h"
#include "kernels/cuda/emu/memory.h"

namespace atl::cuda_emu {

constinit thread_local const Indices* current = nullptr;

namespace {

// ---- A block's threads and barriers ----

// A copy cp.async started (AsyncCopy): made when its thread waits for its group.
struct PendingCopy {
  void* dst;
  const void* src;
  size_t bytes, src_bytes;
  void Make() const {
    std::memcpy(dst, src, src_bytes);
    std::memset(static_cast<char*>(dst) + src_bytes, 0, bytes - src_bytes);
  }
};

struct Thread {
  Indices idx{};
  Context ctx;  // where it resumes: set by StartFiber, and each time it waits
  unsigned linear = 0;
  bool started = false, done = false;
  std::vector<PendingCopy> open;                // not yet committed
  std::deque<std::vector<PendingCopy>> groups;  // committed, oldest first
  void Commit() {                               // the open copies become the newest group
    groups.push_back(std::move(open));
    open.clear();
  }
  void MakeCopies(size_t keep) {  // all but the newest `keep` groups
    while (groups.size() > keep) {
      for (const PendingCopy& c : groups.front()) c.Make();
      groups.pop_front();
    }
  }
};

constexpr const char* kGatherOp = "a tensor-core product";
constexpr const char* kShuffleOp = "a shuffle";

struct Warp {
  unsigned live = 0;         // lanes present and not returned
  unsigned mask = 0;         // of the barrier being gathered
  const char* op = nullptr;  // and its kind: kShuffleOp, kGatherOp
  int arrived = 0;
  uint64_t gen = 0;
  uint64_t gathers = 0;  // gathers released
  // The slots, written before they are read (not cleared for each block). A shuffle's: each
  // lane's value and what it reads, delivered by the lane that releases the barrier (Release).
  // WarpGatherBegin's in turn: gather k in gathered[k % 2], which lanes read until their next
  // warp operation; the barrier of gather k + 1 waits for every lane, so for its reads of k.
  struct Read {
    void* out;
    size_t bytes;
    int src;
  };
  unsigned char slot[32][kWarpSlotBytes];
  Read reads[32];
  unsigned char gathered[2][32][kWarpSlotBytes];
  void Reset(unsigned lanes) {
    live = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
    mask = 0;
    op = nullptr;
    arrived = 0;
    gen = gathers = 0;
  }
};

// Where the block's schedule is (RunBlock's order, kept as state so that a fiber can take the
// next thread itself): warp wk of the round, lane k of the pass; a pass repeats while it moves its
// warp on, a round while it moves the block on.
struct Cursor {
  unsigned wk = 0, k = 0;
  uint64_t warp_gen = 0, pass = 0, round = 0;  // the warp's gen and the progress at their starts
};

struct Block {
  const char* kernel = nullptr;
  const std::function<void()>* body = nullptr;
  std::vector<Thread> threads;
  std::vector<Warp> warps;
  Context scheduler;
  Context finished;  // where a fiber whose thread returned saves itself as it leaves for good
  Thread* running = nullptr;
  Cursor at;
  bool reverse = false;               // the block's threads and warps in reverse order
  std::vector<unsigned> free_stacks;  // StackOf's, not held by a started thread
  unsigned alive = 0;
  unsigned sync_arrived = 0;
  uint64_t sync_gen = 0;
  uint64_t progress = 0;  // threads returned, barriers released
  std::string error;
  unsigned WarpAt(unsigned wk) const {  // the warp wk-th in the block's order
    return reverse ? unsigned(warps.size()) - 1 - wk : wk;
  }
};
thread_local Block* g_block = nullptr;

Block& Current() {
  if (g_block == nullptr || g_block->running == nullptr)
    throw std::logic_error("CUDA emulator: a device function was called outside a kernel");
  return *g_block;
}

Thread* Next(Block& b);
void Resume(Block& b, Thread& t, Context* from);
[[noreturn]] void BackToScheduler(Block& b, Context* from);
void StartFiber(Block& b, Thread& t);

// The running thread waits (at a barrier, whose condition its caller checks again on return):
// the next thread runs, switched to directly (started on a fiber of its own if it has not
// started), or none (a deadlock) and the scheduler ends the launch. No switch when the next is
// this thread.
void Yield(Block& b) {
  Thread& self = *b.running;
  Thread* next = Next(b);
  if (next == &self) return;
  if (next == nullptr) BackToScheduler(b, &self.ctx);
  if (!next->started) StartFiber(b, *next);
  Resume(b, *next, &self.ctx);
}

// Ends the launch with `message`: this fiber is abandoned (its stack is reused by the next block).
[[noreturn]] void Fail(Block& b, const std::string& message) {
  if (b.error.empty()) b.error = message;
  BackToScheduler(b, &b.finished);
}

std::string Where(const Block& b, const Thread& t) {
  const Indices& i = t.idx;
  return fmt::format("kernel {}, block ({},{},{}), thread ({},{},{})", b.kernel, i.block.x,
                     i.block.y, i.block.z, i.thread.x, i.thread.y, i.thread.z);
}
std::string Where(const Block& b) { return Where(b, *b.running); }

// Releases warp w's barrier, every lane of its mask still running having arrived. A shuffle's
// lanes get what they read now, all written and none yet resumed: no second barrier for the
// reads (a lane writes its slot again only after it has resumed). A gather's release moves
// the next gather to the other set of slots (WarpGatherBegin).
void Release(Block& b, Warp& w) {
  if (w.op == kGatherOp) ++w.gathers;
  if (w.op == kShuffleOp) {
    const unsigned base = unsigned(&w - b.warps.data()) * 32;
    for (unsigned lanes = w.mask & w.live; lanes != 0; lanes &= lanes - 1) {
      const int lane = std::countr_zero(lanes);
      const Warp::Read& r = w.reads[lane];
      if ((w.live >> r.src & 1u) == 0)
        Fail(b, fmt::format("{} reads lane {}, which has returned or does not exist: undefined "
                            "on a GPU",
                            Where(b, b.threads[base + unsigned(lane)]), r.src));
      std::memcpy(r.out, w.slot[r.src], r.bytes);
    }
  }
  w.arrived = 0;
  ++w.gen;
}

void ReleaseSync(Block& b) {
  b.sync_arrived = 0;
  ++b.sync_gen;
  ++b.progress;
}

// The thread's body, then what its return means to the block: it may release a barrier (and
// deliver a shuffle's reads). A thread whose body throws fails the launch, as does its return
// where it hangs its warp or completes a shuffle that reads a returned lane (Fail does not
// return).
void RunThread(Block& b, Thread& t) {
  std::string thrown;
  try {
    (*b.body)();
  } catch (const std::exception& e) {
    thrown = e.what();
  } catch (...) {
    thrown = "an exception";
  }
  if (!thrown.empty()) Fail(b, fmt::format("{}: {}", Where(b), thrown));
  // The hardware finishes a returned thread's copies.
  if (!t.open.empty() || !t.groups.empty()) {
    t.Commit();
    t.MakeCopies(0);
  }
  t.done = true;
  --b.alive;
  ++b.progress;
  Warp& w = b.warps[t.linear / 32];
  const unsigned bit = 1u << (t.linear % 32);
  w.live &= ~bit;
  // Lanes waiting at a gather wait for the whole warp, which now never comes: on a GPU, a hang.
  if (w.arrived > 0 && w.op == kGatherOp)
    Fail(b, fmt::format("{} returned while the other lanes of its warp wait at a warp-wide "
                        "operation (the hardware needs the whole warp)",
                        Where(b)));
  // A shuffle waiting for this lane now waits only for the others: released here if they are in.
  if (w.arrived > 0 && w.arrived == std::popcount(w.mask & w.live)) Release(b, w);
  if (b.sync_arrived > 0 && b.sync_arrived == b.alive) ReleaseSync(b);
}

// The cursor's pass over its warp starts: what the pass is measured against.
void BeginPass(Block& b) {
  b.at.warp_gen = b.warps[b.WarpAt(b.at.wk)].gen;
  b.at.pass = b.progress;
}

// The next thread to run, in the order of the file's comment (device.h): a warp at a time, its
// lanes in turn, the warp again while that moved it on (a lane released or returned), the next
// warp; the block's round again while it moved the block on. Null when every thread has returned,
// or when a round moved nothing (a deadlock: b.error says so).
Thread* Next(Block& b) {
  const unsigned n = unsigned(b.threads.size()), warps = unsigned(b.warps.size());
  Cursor& c = b.at;
  for (;;) {
    if (b.alive == 0) return nullptr;
    const unsigned w = b.WarpAt(c.wk);
    const unsigned lo = 32 * w, lanes = std::min(32u, n - lo);
    while (c.k < lanes) {
      Thread& t = b.threads[lo + (b.reverse ? lanes - 1 - c.k : c.k)];
      ++c.k;
      if (!t.done) return &t;
    }
    c.k = 0;
    if (b.warps[w].gen == c.warp_gen && b.progress == c.pass) {  // the warp went as far as it goes
      if (++c.wk == warps) {
        if (b.progress == c.round) {
          unsigned waiting = 0;
          for (const Thread& t : b.threads) waiting += t.done ? 0 : 1;
          b.error = fmt::format(
              "kernel {} deadlocked in block ({},{},{}): {} threads wait at barriers that can "
              "never be released (__syncthreads and a warp shuffle at once, or a shuffle whose "
              "lanes took different paths)",
              b.kernel, b.threads[0].idx.block.x, b.threads[0].idx.block.y,
              b.threads[0].idx.block.z, waiting);
          return nullptr;
        }
        c.wk = 0;
        c.round = b.progress;
      }
    }
    BeginPass(b);
  }
}

// The running thread, as device functions see it (null: none).
void SetRunning(Block& b, Thread* t) {
  b.running = t;
  current = t == nullptr ? nullptr : &t->idx;
}

void Resume(Block& b, Thread& t, Context* from) {
  SetRunning(b, &t);
  Switch(from, &t.ctx);
}

// Leaves the running fiber for good (its context saved in *from, never resumed): the block has
// ended, failed or deadlocked.
[[noreturn]] void BackToScheduler(Block& b, Context* from) {
  SetRunning(b, nullptr);
  Switch(from, &b.scheduler);
  std::abort();
}

// A fiber: runs the thread it was started for, and after it returns, the threads that come next
// and have not started, on the same stack and without a switch (a thread that never waits costs
// no switch: most of an elementwise kernel's), until the next has started (it waits at a barrier,
// on a stack of its own: resumed there) or there is none. A thread that waits keeps the fiber.
void Fiber(void* stack_index) {
  Block& b = *g_block;
  Thread* next = nullptr;
  for (;;) {
    RunThread(b, *b.running);
    next = Next(b);
    if (next == nullptr || next->started) break;
    next->started = true;
    SetRunning(b, next);
  }
  // This stack is free for the next fiber started: it is left for good, for the thread that
  // waits on its own stack, or the scheduler when there is none (the block ended or deadlocked).
  b.free_stacks.push_back(unsigned(reinterpret_cast<uintptr_t>(stack_index)));
  if (next == nullptr) BackToScheduler(b, &b.finished);
  Resume(b, *next, &b.finished);
  std::abort();  // never resumed
}

bool ValidShape(dim3 grid, dim3 block) {
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  return block.x >= 1 && block.y >= 1 && block.z >= 1 && block.x <= 1024 && block.y <= 1024 &&
         block.z <= 64 && threads <= kMaxThreads && grid.x >= 1 && grid.y >= 1 && grid.z >= 1 &&
         grid.x <= 0x7fffffffu && grid.y <= 65535 && grid.z <= 65535;
}

std::atomic<uint64_t> fibers_started{0};

// Starts t on a fiber with a free stack (Fiber), to be resumed.
void StartFiber(Block& b, Thread& t) {
  fibers_started.fetch_add(1, std::memory_order_relaxed);
  t.started = true;
  const unsigned stack = b.free_stacks.back();
  b.free_stacks.pop_back();
  Start(&t.ctx, StackOf(stack), kStackBytes, &Fiber, reinterpret_cast<void*>(uintptr_t(stack)));
}

// Runs one block to the end; false (b.error says why) when it failed. The threads switch to each
// other (Yield, Fiber); the scheduler is switched back to when the block has ended, failed or
// deadlocked.
bool RunBlock(Block& b) {
  const unsigned n = unsigned(b.threads.size());
  for (Thread& t : b.threads) {
    t.started = t.done = false;
    t.open.clear();
    t.groups.clear();
  }
  for (unsigned w = 0; w < b.warps.size(); ++w) {
    const unsigned lanes = std::min(32u, n - w * 32);
    b.warps[w].Reset(lanes);
  }
  b.free_stacks.clear();
  for (unsigned i = n; i-- > 0;) b.free_stacks.push_back(i);  // stack 0 first
  b.alive = n;
  b.sync_arrived = 0;
  const Indices& first = b.threads[0].idx;
  b.reverse = (first.block.x + first.block.y + first.block.z) % 2 == 1;
  b.at = Cursor{};
  b.at.round = b.progress;
  BeginPass(b);
  Thread* t = Next(b);
  StartFiber(b, *t);
  Resume(b, *t, &b.scheduler);
  SetRunning(b, nullptr);
  if (b.error.empty() && b.alive > 0) b.error = "CUDA emulator: a block's scheduler resumed early";
  return b.error.empty();
}

}  // namespace

bool Launch(const char* kernel, dim3 grid, dim3 block, const std::function<void()>& body,
            const void* const* pointers, int count) {
  if (g_block != nullptr) {
    SetLaunchError("CUDA emulator: a kernel launched another kernel (not supported)");
    return false;
  }
  if (!ValidShape(grid, block)) {
    SetLaunchError(
        fmt::format("invalid configuration argument: kernel {} launched with grid "
                    "({},{},{}) and block ({},{},{})",
                    kernel, grid.x, grid.y, grid.z, block.x, block.y, block.z));
    return false;
  }
  for (int i = 0; i < count; ++i) {
    if (pointers[i] != nullptr && !IsDevice(pointers[i])) {
      SetLaunchError(
          fmt::format("an illegal memory access: kernel {} got argument {} = {}, which "
                      "is not device memory (a host pointer?)",
                      kernel, i, pointers[i]));
      return false;
    }
  }
  Block b;
  b.kernel = kernel;
  b.body = &body;
  const unsigned n = block.x * block.y * block.z;
  b.threads.resize(n);
  b.warps.resize((n + 31) / 32);
  for (unsigned i = 0; i < n; ++i) {
    Thread& t = b.threads[i];
    t.linear = i;
    t.idx.thread = {i % block.x, i / block.x % block.y, i / (block.x * block.y)};
    t.idx.block_dim = block;
    t.idx.grid_dim = grid;
  }
  DeviceAccess open(pointers, size_t(count));
  g_block = &b;
  bool ok = true;
  for (unsigned z = 0; z < grid.z && ok; ++z)
    for (unsigned y = 0; y < grid.y && ok; ++y)
      for (unsigned x = 0; x < grid.x && ok; ++x) {
        for (Thread& t : b.threads) t.idx.block = {x, y, z};
        ok = RunBlock(b);
      }
  g_block = nullptr;
  if (!ok) SetLaunchError(b.error);
  return ok;
}

void SyncThreads() {
  Block& b = Current();
  const uint64_t gen = b.sync_gen;
  if (++b.sync_arrived == b.alive) return ReleaseSync(b);
  while (b.sync_gen == gen) Yield(b);
}

int Lane() { return int(Current().running->linear % 32); }

namespace {
std::atomic<uint64_t> vector_accesses{0};
}  // namespace

void VectorAccess(const void* p, size_t bytes) {
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0)
    Fail(Current(), fmt::format("{}: a vector load or store of {} bytes at a misaligned address {}",
                                Where(Current()), bytes, p));
  vector_accesses.fetch_add(1, std::memory_order_relaxed);
}

uint64_t VectorAccesses() { return vector_accesses.load(std::memory_order_relaxed); }

uint64_t FibersStarted() { return fibers_started.load(std::memory_order_relaxed); }

void AsyncCopy(void* dst, const void* src, size_t bytes, size_t src_bytes) {
  Block& b = Current();
  if (src_bytes > bytes)
    Fail(b, fmt::format("{}: an asynchronous copy of {} source bytes into {}", Where(b), src_bytes,
                        bytes));
  // A misaligned address, or a copy from or into the wrong kind of memory, faults on a GPU.
  const auto aligned = [bytes](const void* p) {
    return reinterpret_cast<uintptr_t>(p) % bytes == 0;
  };
  if (!aligned(dst) || !aligned(src) || IsDevice(dst) ||
      (src_bytes > 0 && !IsDevice(src, src_bytes)))
    Fail(b, fmt::format("{}: an asynchronous copy of {} bytes from {} to {}: a misaligned address, "
                        "or not from device memory into shared memory",
                        Where(b), bytes, src, dst));
  const PendingCopy copy{dst, src, bytes, src_bytes};
  const uint3 at = b.running->idx.block;
  if ((at.x + at.y + at.z) % 2 == 0)
    copy.Make();  // at once: a kernel that overwrites a tile still being read is caught here
  else
    b.running->open.push_back(copy);  // at the wait: one that reads a tile too early, here
}

void AsyncCommit() { Current().running->Commit(); }

void AsyncWait(int pending) { Current().running->MakeCopies(size_t(std::max(pending, 0))); }

namespace {

// The barrier of the running lane's warp for `mask`: returns when every lane of the mask still
// running has arrived (and Release has run).
void WarpBarrier(Block& b, Warp& w, unsigned mask, const char* op) {
  if (w.arrived == 0) {
    w.mask = mask;
    w.op = op;
  } else if (w.mask != mask) {
    Fail(b, fmt::format("{}: lanes of one warp shuffle with different masks ({:#x}, {:#x})",
                        Where(b), w.mask, mask));
  } else if (w.op != op) {
    Fail(b, fmt::format("{}: lanes of one warp meet at different warp operations ({}, {})",
                        Where(b), w.op, op));
  }
  const uint64_t gen = w.gen;
  if (++w.arrived == std::popcount(mask & w.live)) {
    Release(b, w);
    ++b.progress;
    return;
  }
  while (w.gen == gen) Yield(b);
}

}  // namespace

void WarpExchange(unsigned mask, const void* value, void* out, size_t bytes, int src) {
  Block& b = Current();
  const unsigned lane = b.running->linear % 32;
  Warp& w = b.warps[b.running->linear / 32];
  if ((mask >> lane & 1u) == 0)
    Fail(b, fmt::format("{} shuffles with mask {:#x}, which leaves it out", Where(b), mask));
  if (src < 0 || src >= 32 || (mask >> src & 1u) == 0)
    Fail(b, fmt::format("{} reads lane {}, outside the shuffle's mask {:#x}", Where(b), src, mask));
  std::memcpy(w.slot[lane], value, bytes);
  w.reads[lane] = {out, bytes, src};
  WarpBarrier(b, w, mask, kShuffleOp);  // *out written when it returns (Release)
}

const unsigned char* WarpGatherBegin(const void* value, size_t bytes) {
  Block& b = Current();
  const unsigned lane = b.running->linear % 32;
  Warp& w = b.warps[b.running->linear / 32];
  if (bytes > kWarpSlotBytes)
    Fail(b, fmt::format("{}: a warp gather of {} bytes a lane (at most {})", Where(b), bytes,
                        kWarpSlotBytes));
  if (w.live != 0xffffffffu)
    Fail(b, fmt::format("{}: a warp-wide operation with lanes {:#x} of 32 running (the hardware "
                        "needs the whole warp)",
                        Where(b), w.live));
  auto& slots = w.gathered[w.gathers % 2];
  std::memcpy(slots[lane], value, bytes);
  WarpBarrier(b, w, 0xffffffffu, kGatherOp);
  return &slots[0][0];
}

}  // namespace atl::cuda_emu
