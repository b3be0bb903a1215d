// The helpers shared by the files of world/transport/, and the test hooks (world/wan_internal.h).
#include "world/transport/core.h"

#include <fmt/format.h>

#include <algorithm>

namespace atl {

namespace transport {

std::vector<std::pair<std::string, int>> KeepaliveArgs(double keepalive_s, bool server) {
  // Half the keepalive time each way, in [100 ms, 1 day] (an int of milliseconds).
  const int half_ms = int(std::clamp(keepalive_s * 500, 100.0, 86400e3));
  std::vector<std::pair<std::string, int>> args = {{GRPC_ARG_KEEPALIVE_TIME_MS, half_ms},
                                                   {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, half_ms},
                                                   {GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1},
                                                   {GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0}};
  if (server) {
    args.emplace_back(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 50);
    args.emplace_back(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  }
  return args;
}

std::mutex g_hook_mu;
std::shared_ptr<const WanChunkHook> g_hook;
std::atomic<bool> g_hook_set{false};

std::shared_ptr<const WanChunkHook> ChunkHook() {
  if (!g_hook_set.load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard<std::mutex> lk(g_hook_mu);
  return g_hook;
}

std::shared_ptr<const WanFetchHook> g_fetch_hook;  // guarded by g_hook_mu

std::shared_ptr<const WanFetchHook> FetchHook() {
  std::lock_guard<std::mutex> lk(g_hook_mu);
  return g_fetch_hook;
}

std::string NotConnected(int site) {
  return fmt::format("site {} is not connected (absent when this site connected; see Reconnect)",
                     site);
}

}  // namespace transport

void SetWanChunkHookForTesting(WanChunkHook hook) {
  std::lock_guard<std::mutex> lk(transport::g_hook_mu);
  transport::g_hook = hook ? std::make_shared<const WanChunkHook>(std::move(hook)) : nullptr;
  transport::g_hook_set.store(transport::g_hook != nullptr);
}

void SetWanFetchHookForTesting(WanFetchHook hook) {
  std::lock_guard<std::mutex> lk(transport::g_hook_mu);
  transport::g_fetch_hook = hook ? std::make_shared<const WanFetchHook>(std::move(hook)) : nullptr;
}

}  // namespace atl
