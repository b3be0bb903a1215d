// What the WAN transport's tests share: n endpoints in one process connected on loopback (a
// thread per site), values whose sums are exact, the chunk hook, a dead address. Included by
// wan_test.cc, wan_fault_test.cc and world/transport/{connect,rejoin}_test.cc (one binary each).
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/log.h"
#include "world/proto/transport.pb.h"
#include "world/wan.h"
#include "world/wan_internal.h"

namespace atl::testing_wan {

inline WorldSecurity Insecure() {
  WorldSecurity s;
  s.insecure = true;
  return s;
}

// n sites, each with its own endpoint, connected concurrently.
struct World {
  std::vector<std::unique_ptr<WanEndpoint>> eps;
  std::vector<std::unique_ptr<Communicator>> comms;

  ~World() {
    comms.clear();
    eps.clear();
  }

  // Runs fn(comm, site) on one thread per site.
  void Run(const std::function<void(Communicator&, int)>& fn) {
    std::vector<std::thread> threads;
    for (int s = 0; s < int(comms.size()); ++s) threads.emplace_back([&, s] { fn(*comms[s], s); });
    for (auto& t : threads) t.join();
  }
  // Every site connected.
  bool ok() const {
    for (const auto& c : comms)
      if (!c) return false;
    return !comms.empty();
  }
  // Destroys a site's communicator and endpoint: its peers see it vanish.
  void Drop(int s) {
    comms[size_t(s)].reset();
    eps[size_t(s)].reset();
  }
};

// A forked child killed (SIGKILL) and reaped when the test ends, however it ends.
struct ReapAtExit {
  pid_t pid;
  ~ReapAtExit() {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};

// A pipe carrying lines between this process and a child process.
struct Pipe {
  int fd[2] = {-1, -1};
  Pipe() { EXPECT_EQ(::pipe(fd), 0); }
  ~Pipe() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
  void Write(const std::string& line) const {
    const std::string l = line + "\n";
    [[maybe_unused]] ssize_t n = ::write(fd[1], l.data(), l.size());
  }
  std::string Read() const {
    std::string line;
    char c;
    while (::read(fd[0], &c, 1) == 1 && c != '\n') line.push_back(c);
    return line;
  }
};

using Tweak = std::function<void(WanOptions&)>;

// Listens on n loopback endpoints and connects them; the statuses of the Connect calls.
inline std::vector<Status> TryStart(World& w, int n, const Tweak& tweak = nullptr,
                                    std::vector<WorldSecurity> security = {}) {
  if (security.empty()) security.assign(n, Insecure());
  std::vector<WanPeer> peers;
  for (int s = 0; s < n; ++s) {
    auto ep = WanEndpoint::Listen("127.0.0.1:0", security[s]);
    EXPECT_TRUE(ep.ok()) << ep.status().ToString();
    if (!ep.ok()) return {ep.status()};
    peers.push_back({s, (*ep)->address()});
    w.eps.push_back(std::move(*ep));
  }
  w.comms.resize(n);
  std::vector<Status> st(n);
  std::vector<std::thread> threads;
  for (int s = 0; s < n; ++s) {
    threads.emplace_back([&, s] {
      WanOptions o;
      o.site = s;
      o.peers = peers;
      o.timeout_s = 30;
      if (tweak) tweak(o);
      auto c = w.eps[s]->Connect(o);
      if (c.ok())
        w.comms[s] = std::move(*c);
      else
        st[s] = c.status();
    });
  }
  for (auto& t : threads) t.join();
  return st;
}

inline std::unique_ptr<World> Start(int n, const Tweak& tweak = nullptr,
                                    std::vector<WorldSecurity> security = {}) {
  auto w = std::make_unique<World>();
  auto st = TryStart(*w, n, tweak, std::move(security));
  for (size_t s = 0; s < st.size(); ++s) EXPECT_TRUE(st[s].ok()) << st[s].ToString();
  return w;
}

inline Tweak SmallChunks(size_t bytes) {
  return [bytes](WanOptions& o) { o.chunk_bytes = bytes; };
}

template <class T>
T Value(int site, size_t i) {
  if constexpr (sizeof(T) == 8 && std::is_integral_v<T>)
    return T(i) * 1000003 + (T(site) << 40);
  else if constexpr (std::is_integral_v<T>)
    return T(i) * 3 + T(site) * 100000;
  else
    return T(double((i * 7 + size_t(site) * 3) % 1000) * 0.25);  // sums are exact
}

template <class T>
void CheckAllReduce(World& w, size_t count) {
  const int n = int(w.comms.size());
  std::vector<T> expect(count, T(0));
  for (int s = 0; s < n; ++s)
    for (size_t i = 0; i < count; ++i) expect[i] += Value<T>(s, i);
  w.Run([&](Communicator& c, int s) {
    std::vector<T> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = Value<T>(s, i);
    Status st = c.AllReduce(std::span<T>(v));
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(v[i], expect[i]) << "site " << s << " element " << i << " of " << count;
  });
}

struct HookGuard {
  explicit HookGuard(WanChunkHook h) { SetWanChunkHookForTesting(std::move(h)); }
  ~HookGuard() { SetWanChunkHookForTesting(nullptr); }
};

// A loopback address where nobody listens, for as long as this object lives: the port stays
// bound (not listening, so a connection is refused) and no other process can take it. A port
// found free and let go could be handed to a test running beside this one, whose endpoint would
// then answer as the "dead" peer and see a stranger's stream.
class DeadAddress {
 public:
  DeadAddress() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    address_ = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  }
  ~DeadAddress() { close(fd_); }
  DeadAddress(const DeadAddress&) = delete;
  DeadAddress& operator=(const DeadAddress&) = delete;
  const std::string& str() const { return address_; }

 private:
  int fd_;
  std::string address_;
};

// `bytes` of pseudo-random data (a snapshot to publish).
inline std::shared_ptr<const std::string> RandomBlob(size_t bytes, uint32_t seed) {
  auto b = std::make_shared<std::string>(bytes, '\0');
  std::mt19937 rng(seed);
  for (size_t i = 0; i + 4 <= bytes; i += 4) {
    const uint32_t x = rng();
    std::memcpy(b->data() + i, &x, 4);
  }
  return b;
}

}  // namespace atl::testing_wan
