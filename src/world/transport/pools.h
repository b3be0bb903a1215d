// Memory the WAN transport reuses: the blocks chunk payloads are copied into for gRPC to send
// from, and the received chunk messages (their payloads keep their capacity).
//
// Thread-safety: both pools are thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "world/proto/transport.pb.h"

namespace atl::transport {

// Payload blocks handed to gRPC: each chunk's payload is copied once into a block that gRPC owns
// until it has written it; released blocks come back here, so steady traffic reuses warm memory
// instead of page-faulting fresh allocations. (gRPC may keep a written message referenced for a
// while, so memory it holds must not be the caller's.)
class BlockPool : public std::enable_shared_from_this<BlockPool> {
 public:
  ~BlockPool() {
    for (auto& [cap, block] : free_) delete[] block;
  }
  // A slice of `bytes` copied from `src`; its block returns to the pool when gRPC drops it.
  grpc::Slice Copy(const char* src, size_t bytes) {
    char* block = nullptr;
    size_t cap = bytes;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = free_.lower_bound(bytes);
      if (it != free_.end() && it->first <= 2 * bytes) {
        cap = it->first;
        block = it->second;
        free_bytes_ -= cap;
        free_.erase(it);
      }
    }
    if (!block) block = new char[cap];
    std::memcpy(block, src, bytes);
    return grpc::Slice(block, bytes, &Lent::Release, new Lent{shared_from_this(), block, cap});
  }

 private:
  struct Lent {
    std::shared_ptr<BlockPool> pool;
    char* block;
    size_t cap;
    static void Release(void* p) {
      auto* lent = static_cast<Lent*>(p);
      lent->pool->Put(lent->block, lent->cap);
      delete lent;
    }
  };
  void Put(char* block, size_t cap) {
    std::lock_guard<std::mutex> lk(mu_);
    if (free_bytes_ + cap > kMaxFreeBytes) {
      delete[] block;
      return;
    }
    free_.emplace(cap, block);
    free_bytes_ += cap;
  }
  static constexpr size_t kMaxFreeBytes = size_t{64} << 20;
  std::mutex mu_;
  std::multimap<size_t, char*> free_;  // capacity -> block
  size_t free_bytes_ = 0;
};

// Received chunks are recycled: a chunk read into a recycled message reuses its payload's
// capacity, so a steady stream of chunks allocates (and page-faults) nothing.
class ChunkPool {
 public:
  std::unique_ptr<::atl::wan::Chunk> Get() {
    std::lock_guard<std::mutex> lk(mu_);
    if (free_.empty()) return std::make_unique<::atl::wan::Chunk>();
    auto c = std::move(free_.back());
    free_.pop_back();
    bytes_ -= c->payload().capacity();
    return c;
  }
  void Put(std::unique_ptr<::atl::wan::Chunk> c) {
    if (!c) return;
    const size_t cap = c->payload().capacity();
    std::lock_guard<std::mutex> lk(mu_);
    if (free_.size() >= kMaxChunks || bytes_ + cap > kMaxBytes) return;
    c->Clear();  // keeps the payload's capacity
    bytes_ += cap;
    free_.push_back(std::move(c));
  }

 private:
  static constexpr size_t kMaxChunks = 64, kMaxBytes = size_t{128} << 20;
  std::mutex mu_;
  std::vector<std::unique_ptr<::atl::wan::Chunk>> free_;
  size_t bytes_ = 0;
};

}  // namespace atl::transport
