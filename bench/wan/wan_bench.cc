// WAN transport goodput (world/wan.h), printed as markdown tables:
//   (a) emulated links: all-reduce among 3 sites and a plain send between 2, large messages, over
//       links of a configured bandwidth and latency; goodput achieved / configured (goal >= 0.90).
//       All-reduce goodput is the bus bandwidth, 2 (n - 1) / n * bytes / time: what each link
//       carries per second.
//   (b) unthrottled loopback: a send of 256 MiB through the transport vs the same bytes over a raw
//       TCP socket between two threads (goal >= 0.70).
// Sites are threads of this process, each with its own endpoint (gRPC server and client streams)
// on 127.0.0.1; they start each timed operation together (a thread barrier), and the time is
// from that start to the last site's completion.
//
//   wan_bench [--part a|b|all] [--repeat R] [--repeat-b R] [--loopback-mib M]
//             [--chunk-kib K,K..] [--quick] [--no-raw-tcp]
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/log.h"
#include "world/wan.h"

namespace atl {
namespace {

struct Sites {
  std::vector<std::unique_ptr<WanEndpoint>> eps;
  std::vector<std::unique_ptr<Communicator>> comms;
  ~Sites() {
    comms.clear();
    eps.clear();
  }
};

std::unique_ptr<Sites> Connect(int n, LinkProfile link, size_t chunk_bytes, bool stage = true) {
  auto w = std::make_unique<Sites>();
  WorldSecurity sec;
  sec.insecure = true;
  std::vector<WanPeer> peers;
  for (int s = 0; s < n; ++s) {
    auto ep = WanEndpoint::Listen("127.0.0.1:0", sec);
    ExitIfError(ep.status());
    peers.push_back({s, (*ep)->address()});
    w->eps.push_back(std::move(*ep));
  }
  w->comms.resize(n);
  std::vector<std::thread> ts;
  for (int s = 0; s < n; ++s) {
    ts.emplace_back([&, s] {
      WanOptions o;
      o.site = s;
      o.peers = peers;
      o.chunk_bytes = chunk_bytes;
      o.stage_receives = stage;
      o.timeout_s = 120;
      o.link = [link](int, int) { return link; };
      auto c = w->eps[s]->Connect(o);
      ExitIfError(c.status());
      w->comms[s] = std::move(*c);
    });
  }
  for (auto& t : ts) t.join();
  return w;
}

// Runs fn(site) on every site, started together; seconds from the start to the last finish.
double Timed(Sites& w, const std::function<Status(Communicator&, int)>& fn) {
  const int n = static_cast<int>(w.comms.size());
  std::barrier sync(n);
  std::vector<double> start(n), end(n);
  std::vector<std::thread> ts;
  for (int s = 0; s < n; ++s) {
    ts.emplace_back([&, s] {
      sync.arrive_and_wait();
      start[s] = NowSeconds();
      ExitIfError(fn(*w.comms[s], s));
      end[s] = NowSeconds();
    });
  }
  for (auto& t : ts) t.join();
  return *std::max_element(end.begin(), end.end()) - *std::min_element(start.begin(), start.end());
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct Emulated {
  double mbps, latency_ms;
  size_t mib;
};

void PartA(int repeat, bool quick) {
  std::vector<Emulated> cases = {{50, 40, 16}, {100, 30, 32}, {400, 20, 64}};
  if (quick) cases = {{100, 30, 8}, {400, 20, 16}};
  fmt::print("### (a) Emulated links: goodput vs configured bandwidth\n\n");
  fmt::print(
      "Chunks of 1 MiB; every directed link emulated with the same profile; median of {} runs.\n"
      "all-reduce: 3 sites, goodput = bus bandwidth 2(n-1)/n x bytes / time; send: site 0 -> "
      "site 1.\n\n",
      repeat);
  fmt::print(
      "| operation | link | message | time (s) | goodput (Mbit/s) | achieved / configured |\n");
  fmt::print("|---|---|---|---:|---:|---:|\n");
  for (const Emulated& c : cases) {
    const LinkProfile link{c.latency_ms, c.mbps, 0};
    const size_t bytes = c.mib << 20;
    for (int n : {3, 2}) {
      auto w = Connect(n, link, 1 << 20);
      std::vector<std::vector<float>> bufs(n, std::vector<float>(bytes / 4, 1.0f));
      std::vector<double> times;
      for (int r = 0; r < repeat; ++r) {
        times.push_back(Timed(*w, [&](Communicator& comm, int s) -> Status {
          if (n == 3) return comm.AllReduce(std::span<float>(bufs[s]));
          if (s == 0) return comm.Send(std::span<const float>(bufs[0]), 1);
          return comm.Recv(std::span<float>(bufs[1]), 0);
        }));
      }
      const double t = Median(times);
      const double on_link = n == 3 ? 2.0 * (n - 1) / n * double(bytes) : double(bytes);
      const double goodput = on_link * 8 / t / 1e6;
      fmt::print("| {} | {} | {} MiB | {:.2f} | {:.1f} | {:.3f} |\n",
                 n == 3 ? "all-reduce, 3 sites" : "send, 2 sites", DescribeLink(link), c.mib, t,
                 goodput, goodput / c.mbps);
      std::fflush(stdout);
    }
  }
  fmt::print("\n");
}

// ---- Raw TCP on loopback: one socket, a writer thread and a reader thread. ----

double RawTcp(const std::vector<char>& src, std::vector<char>& dst, size_t write_size) {
  const size_t bytes = src.size();
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(ls, 1) != 0) {
    std::perror("raw tcp: bind/listen");
    std::exit(1);
  }
  socklen_t len = sizeof(a);
  getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len);
  int cs = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(cs, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    std::perror("raw tcp: connect");
    std::exit(1);
  }
  int rs = accept(ls, nullptr, nullptr);
  close(ls);
  std::barrier sync(2);
  double start = 0, end = 0;
  std::thread writer([&] {
    sync.arrive_and_wait();
    start = NowSeconds();
    size_t off = 0;
    while (off < bytes) {
      ssize_t k = ::send(cs, src.data() + off, std::min(write_size, bytes - off), 0);
      if (k <= 0) {
        std::perror("raw tcp: send");
        std::exit(1);
      }
      off += size_t(k);
    }
  });
  std::thread reader([&] {
    sync.arrive_and_wait();
    size_t off = 0;
    while (off < bytes) {
      ssize_t k = ::recv(rs, dst.data() + off, bytes - off, 0);
      if (k <= 0) {
        std::perror("raw tcp: recv");
        std::exit(1);
      }
      off += size_t(k);
    }
    end = NowSeconds();
  });
  writer.join();
  reader.join();
  close(cs);
  close(rs);
  if (std::memcmp(dst.data(), src.data(), bytes) != 0) std::exit(1);
  return end - start;
}

void PartB(int repeat, size_t mib, bool raw_tcp, const std::vector<size_t>& chunks) {
  const size_t bytes = mib << 20;
  fmt::print("### (b) Unthrottled loopback: transport vs raw TCP\n\n");
  fmt::print(
      "A send of {} MiB from site 0 to site 1 (2 sites, no emulation, received into the caller's "
      "buffer) vs the same bytes written to one loopback TCP socket in 1 MiB writes and read by "
      "another thread. After a warm-up, the paths run in turn, {} times; best and median.\n\n",
      mib, repeat);
  std::vector<char> src(bytes, 'x'), dst(bytes, 0);  // sent as bytes (uint8_t)
  // Receives staged (the default: the caller's buffer is written once every chunk is verified),
  // and for comparison one with verified chunks written straight into the caller's buffer.
  struct Config {
    size_t chunk;
    bool stage;
  };
  std::vector<Config> configs;
  for (size_t chunk : chunks) configs.push_back({chunk, true});
  configs.push_back({chunks[0], false});
  std::vector<std::unique_ptr<Sites>> worlds;
  for (const Config& c : configs) worlds.push_back(Connect(2, LinkProfile{}, c.chunk, c.stage));
  auto send = [&](Sites& w, size_t b) {
    return Timed(w, [&](Communicator& comm, int s) -> Status {
      if (s == 0)
        return comm.Send(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(src.data()), b),
                         1);
      return comm.Recv(std::span<uint8_t>(reinterpret_cast<uint8_t*>(dst.data()), b), 0);
    });
  };
  std::vector<double> raw;
  std::vector<std::vector<double>> wan(configs.size());
  if (raw_tcp) (void)RawTcp(src, dst, 1 << 20);
  for (auto& w : worlds) (void)send(*w, bytes);
  for (int r = 0; r < repeat; ++r) {
    if (raw_tcp) raw.push_back(RawTcp(src, dst, 1 << 20));
    for (size_t i = 0; i < worlds.size(); ++i) {
      std::fill(dst.begin(), dst.end(), 0);
      wan[i].push_back(send(*worlds[i], bytes));
      if (std::memcmp(dst.data(), src.data(), bytes) != 0) {
        fmt::print(stderr, "wan_bench: the received bytes differ\n");
        std::exit(1);
      }
    }
  }
  fmt::print("| path | chunk | best (s) | best GB/s | median GB/s | vs raw TCP: best | median |\n");
  fmt::print("|---|---|---:|---:|---:|---:|---:|\n");
  const double raw_best = raw_tcp ? *std::min_element(raw.begin(), raw.end()) : 0;
  const double raw_med = raw_tcp ? Median(raw) : 0;
  if (raw_tcp)
    fmt::print("| raw TCP socket | 1 MiB writes | {:.3f} | {:.2f} | {:.2f} | 1.000 | 1.000 |\n",
               raw_best, bytes / raw_best / 1e9, bytes / raw_med / 1e9);
  for (size_t i = 0; i < configs.size(); ++i) {
    const double best = *std::min_element(wan[i].begin(), wan[i].end()), med = Median(wan[i]);
    fmt::print("| WAN transport send, {} | {} KiB | {:.3f} | {:.2f} | {:.2f} | {:.3f} | {:.3f} |\n",
               configs[i].stage ? "staged receive" : "stage_receives=false", configs[i].chunk >> 10,
               best, bytes / best / 1e9, bytes / med / 1e9, raw_best / best, raw_med / med);
  }
  fmt::print("\n");
}

}  // namespace
}  // namespace atl

int main(int argc, char** argv) {
  std::string part = "all";
  int repeat = 3, repeat_b = 7;
  size_t mib = 256;
  bool quick = false, raw_tcp = true;
  std::vector<size_t> chunks = {size_t(1) << 20, size_t(4) << 20};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        fmt::print(stderr, "wan_bench: {} needs a value\n", a);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--part") {
      part = next();
    } else if (a == "--repeat") {  // part a (part b: --repeat-b)
      repeat = std::max(1, std::stoi(next()));
    } else if (a == "--repeat-b") {
      repeat_b = std::max(1, std::stoi(next()));
    } else if (a == "--loopback-mib") {
      mib = std::stoul(next());
    } else if (a == "--chunk-kib") {  // comma-separated chunk sizes for part b
      chunks.clear();
      std::string v = next();
      for (size_t p = 0; p <= v.size();) {
        size_t q = v.find(',', p);
        if (q == std::string::npos) q = v.size();
        chunks.push_back(std::stoul(v.substr(p, q - p)) << 10);
        p = q + 1;
      }
    } else if (a == "--no-raw-tcp") {  // profiling the transport alone
      raw_tcp = false;
    } else if (a == "--quick") {
      quick = true;
    } else {
      fmt::print(stderr,
                 "usage: wan_bench [--part a|b|all] [--repeat R] [--repeat-b R] [--loopback-mib M] "
                 "[--chunk-kib K,K..] [--quick] [--no-raw-tcp]\n");
      return 2;
    }
  }
  if (part == "a" || part == "all") atl::PartA(repeat, quick);
  if (part == "b" || part == "all") atl::PartB(repeat_b, mib, raw_tcp, chunks);
  return 0;
}
