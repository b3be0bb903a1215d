// The silent-data-corruption checks' kernels (train/sdc/): fingerprints of ranges of device
// memory, and the largest magnitude of an array, each returned to the host in a few bytes, so
// that the checks read GPU state where it lives instead of downloading it.
#include <fmt/format.h>

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace atl::kernels::cuda {
namespace {

constexpr int kThreads = 256;  // a power of two, at least 64 (ChunkHashKernel's tree)
static_assert(kThreads >= 64 && (kThreads & (kThreads - 1)) == 0);
constexpr uint64_t kWordsPerThread = kHashChunkWords / kThreads;
static_assert(kHashChunkWords % kThreads == 0);

// Block c: chunk c of the ranges' chunks (first[r] is range r's first; first[num_ranges] the
// total), its words in RangeHashStep order per thread, then the threads in a fixed tree.
__global__ void ChunkHashKernel(uint64_t* partial, const uint32_t* words, const HashRange* ranges,
                                const uint64_t* first, int num_ranges) {
  __shared__ uint64_t tree[kThreads];
  const uint64_t c = blockIdx.x;
  int lo = 0, hi = num_ranges;  // the last range whose first chunk is at or before c
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (first[mid] <= c)
      lo = mid;
    else
      hi = mid;
  }
  const HashRange r = ranges[lo];
  const uint64_t begin = r.begin + (c - first[lo]) * kHashChunkWords;
  const uint64_t end = min(r.end, begin + kHashChunkWords);
  uint64_t h = HashMix(uint64_t(threadIdx.x) + 1);
  for (uint64_t k = 0; k < kWordsPerThread; ++k) {
    const uint64_t i = begin + k * kThreads + threadIdx.x;
    if (i < end) h = HashStep(h, words[i]);
  }
  tree[threadIdx.x] = h;
  __syncthreads();
  for (int s = kThreads / 2; s >= 32; s >>= 1) {
    if (int(threadIdx.x) < s)
      tree[threadIdx.x] = HashCombine(tree[threadIdx.x], tree[threadIdx.x + s]);
    __syncthreads();
  }
  // The tree's last 5 levels in warp 0, by shuffles: lane t takes lane t + s's value, as tree[t]
  // took tree[t + s] (the lanes above s compute what nobody reads).
  if (threadIdx.x < 32) {
    uint64_t v = tree[threadIdx.x];
    for (int s = 16; s > 0; s >>= 1) v = HashCombine(v, __shfl_down_sync(0xffffffffu, v, s));
    if (threadIdx.x == 0) partial[c] = v;
  }
}

// Thread r: range r's hash, its length's then its chunks' in order.
__global__ void RangeHashKernel(uint64_t* out, const uint64_t* partial, const HashRange* ranges,
                                const uint64_t* first, int num_ranges) {
  const int r = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (r >= num_ranges) return;
  uint64_t h = HashMix(ranges[r].end - ranges[r].begin + kHashSeed);
  for (uint64_t c = first[r]; c < first[r + 1]; ++c) h = HashCombine(h, partial[c]);
  out[r] = h;
}

// Block b: the largest |x| over its chunk of kMaxChunk elements (a non-finite one counts as
// infinity).
constexpr int64_t kMaxChunk = int64_t(1) << 16;
__global__ void MaxAbsKernel(float* partial, const float* x, int64_t n) {
  __shared__ float shared[32];
  const int64_t b = int64_t(blockIdx.x) * kMaxChunk, e = min(n, b + kMaxChunk);
  float m = 0.0f;
  for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) {
    const float a = fabsf(x[i]);
    m = fmaxf(m, a <= FLT_MAX ? a : INFINITY);  // NaN fails the comparison too
  }
  m = BlockMax(m, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = m;
}

// *out = the largest of *out and partial's.
__global__ void MaxIntoKernel(float* out, const float* partial, int64_t count) {
  __shared__ float shared[32];
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) m = fmaxf(m, partial[i]);
  m = BlockMax(m, shared);
  if (threadIdx.x == 0) *out = fmaxf(*out, m);
}

// The range tables uploaded so far, on the device: the checks hash the same few layouts (a
// model's tensors, its moments') every step, so a step uploads none after its first. At most
// kTables kept, the least recently used replaced. RangeHashes returns only when its kernels are
// done (its result comes back), so no kernel still reads a table when it is replaced.
class TableCache {
 public:
  const uint64_t* Find(const std::vector<uint64_t>& table) {
    ++clock_;
    for (Entry& e : entries_)
      if (e.table == table) {
        e.used = clock_;
        return e.device;
      }
    Entry* slot = nullptr;
    if (entries_.size() < kTables) {
      slot = &entries_.emplace_back();
    } else {
      slot = &entries_.front();
      for (Entry& e : entries_)
        if (e.used < slot->used) slot = &e;
    }
    if (slot->capacity < table.size()) {
      Free(slot->device);
      slot->device = nullptr;
      slot->capacity = 0;
      slot->device = static_cast<uint64_t*>(Malloc(table.size() * sizeof(uint64_t)));
      slot->capacity = table.size();
    }
    slot->table = table;
    slot->used = clock_;
    CopyToDevice(slot->device, table.data(), table.size() * sizeof(uint64_t));
    return slot->device;
  }

 private:
  static constexpr size_t kTables = 16;
  struct Entry {
    std::vector<uint64_t> table;
    uint64_t* device = nullptr;
    size_t capacity = 0;
    uint64_t used = 0;
  };
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
};

}  // namespace

void RangeHashes(uint64_t* host_out, const void* data, const HashRange* host_ranges,
                 int num_ranges) {
  if (num_ranges <= 0) return;
  const size_t R = size_t(num_ranges);
  // The table: the ranges, then each range's first chunk (and the total).
  std::vector<uint64_t> table(2 * R + R + 1);
  uint64_t chunks = 0;
  for (size_t r = 0; r < R; ++r) {
    table[2 * r] = host_ranges[r].begin;
    table[2 * r + 1] = host_ranges[r].end;
    table[2 * R + r] = chunks;
    chunks += (host_ranges[r].end - host_ranges[r].begin + kHashChunkWords - 1) / kHashChunkWords;
  }
  table[3 * R] = chunks;
  if (chunks > uint64_t(INT32_MAX))
    throw CudaError(fmt::format("RangeHashes: {} chunks, over a grid's limit", chunks));
  static TableCache cache;  // one thread drives the GPU (runtime.h)
  const uint64_t* device_table = cache.Find(table);
  const auto* ranges = reinterpret_cast<const HashRange*>(device_table);
  const uint64_t* first = device_table + 2 * R;
  auto* partial = static_cast<uint64_t*>(Scratch(kScratchOp, (chunks + R) * sizeof(uint64_t)));
  uint64_t* out = partial + chunks;
  if (chunks > 0)
    ATL_LAUNCH(ChunkHashKernel, unsigned(chunks), kThreads, partial,
               static_cast<const uint32_t*>(data), ranges, first, num_ranges);
  ATL_LAUNCH(RangeHashKernel, Blocks(R, 128), 128, out, static_cast<const uint64_t*>(partial),
             ranges, first, num_ranges);
  CopyToHost(host_out, out, R * sizeof(uint64_t));
}

void MaxAbsInto(float* slot, const float* x, size_t n) {
  if (n == 0) return;
  const int64_t chunks = (int64_t(n) + kMaxChunk - 1) / kMaxChunk;
  auto* partial = static_cast<float*>(Scratch(kScratchReduce, size_t(chunks) * sizeof(float)));
  ATL_LAUNCH(MaxAbsKernel, unsigned(chunks), kThreads, partial, x, int64_t(n));
  ATL_LAUNCH(MaxIntoKernel, 1, 1024, slot, static_cast<const float*>(partial), chunks);
}

}  // namespace atl::kernels::cuda
