#include "train/local_world.h"

#include <fmt/format.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "comm/inprocess.h"
#include "core/log.h"
#include "train/trainer.h"
#include "world/coordinator.h"
#include "world/wan.h"

namespace atl {

namespace {

// One site's ranks: threads when it has more than one.
Status TrainSite(const RunConfig& cfg, const TrainOptions& base) {
  const int ranks = int(cfg.parallel.dp * cfg.parallel.tp * cfg.parallel.pp);
  auto train = [&](Communicator* comm) {
    TrainOptions o = base;
    o.comm = comm;
    if (comm != nullptr && comm->rank() != 0) {  // the leader alone reaches the other sites
      o.world = WorldHooks();
      o.world.site = base.world.site;
    }
    return Train(cfg, o).status();
  };
  if (ranks == 1) return train(nullptr);
  for (const Status& st :
       RunInProcessRanks(ranks, [&](Communicator& comm) { return train(&comm); }))
    if (!st.ok()) return st;
  return Status::Ok();
}

}  // namespace

std::string LocalSiteDir(const RunConfig& cfg, const std::string& dir, int site) {
  return cfg.world.sites > 1 ? fmt::format("{}/site-{}", dir, site) : dir;
}

Status TrainLocalWorld(const RunConfig& cfg, const std::string& dir,
                       const LocalWorldOptions& options) {
  std::filesystem::remove_all(dir);
  TrainOptions base;
  base.out_dir = dir;
  base.progress = false;
  const int sites = int(cfg.world.sites);
  if (sites == 1) return TrainSite(cfg, base);
  if (cfg.world.strategy != "sync")
    return Status::InvalidArgument(fmt::format(
        "world.strategy = \"{}\" needs a coordinator: use `atoll launch` (a world in one "
        "process runs sync only)",
        cfg.world.strategy));
  if (!options.lose.empty() && !options.coordinator)
    return Status::InvalidArgument("a local world loses sites only with a coordinator");
  WorldSecurity insecure;
  insecure.insecure = true;
  std::unique_ptr<Coordinator> coordinator;
  if (options.coordinator) {
    CoordinatorOptions co;
    co.sites = sites;
    co.heartbeat_s = cfg.world.heartbeat_s;
    co.dead_after_beats = int(cfg.world.dead_after_beats);
    co.state_dir = dir + "/coordinator";
    co.security = insecure;
    ATOLL_ASSIGN_OR_RETURN(coordinator, Coordinator::Start(co));
  }
  std::vector<std::unique_ptr<CoordinatorClient>> clients(static_cast<size_t>(sites));
  std::vector<std::unique_ptr<WanEndpoint>> eps;
  std::vector<WanPeer> peers;
  for (int s = 0; s < sites; ++s) {
    ATOLL_ASSIGN_OR_RETURN(auto ep, WanEndpoint::Listen("127.0.0.1:0", insecure));
    peers.push_back({s, ep->address()});
    eps.push_back(std::move(ep));
  }
  std::vector<std::unique_ptr<Communicator>> wans(static_cast<size_t>(sites));
  std::vector<Status> st(static_cast<size_t>(sites));
  std::vector<std::atomic<int>> left(static_cast<size_t>(sites));  // sites that left the world
  std::vector<std::thread> threads;
  for (int s = 0; s < sites; ++s)
    threads.emplace_back([&, s] {
      WanEndpoint* ep = eps[size_t(s)].get();
      TrainOptions o = base;
      if (coordinator != nullptr) {
        CoordinatorClientOptions cc;
        cc.address = coordinator->address();
        cc.site = s;
        cc.heartbeat_s = cfg.world.heartbeat_s;
        cc.timeout_s = 60;
        cc.security = insecure;
        cc.on_membership = [ep, s](const Membership& m) {
          for (const SiteInfo& d : m.Dead(s)) ep->PeerLost(d.site, d.wan_address, "dead");
        };
        auto client = CoordinatorClient::Connect(cc);
        if (client.ok()) clients[size_t(s)] = std::move(*client);
        const Status registered =
            client.ok() ? clients[size_t(s)]->Register(ep->address()).status() : client.status();
        if (!registered.ok()) {
          st[size_t(s)] = registered;
          return;
        }
        CoordinatorClient* c = clients[size_t(s)].get();
        o.world.commit = [c](int64_t r, std::optional<RoundVote> v) { return c->Round(r, v); };
        o.world.leave = [c, &left, s] {
          left[size_t(s)] = 1;
          return c->Leave();
        };
        for (const auto& [site, step] : options.lose)
          if (site == s) o.die_after_step = step, o.die_returns = true;
      }
      WanOptions wo;
      wo.site = s;
      wo.peers = peers;
      wo.timeout_s = 60;
      auto wan = eps[size_t(s)]->Connect(wo);
      if (!wan.ok()) {
        st[size_t(s)] = wan.status();
        return;
      }
      wans[size_t(s)] = std::move(*wan);
      o.out_dir = LocalSiteDir(cfg, dir, s);
      o.checkpoint_dir = dir;
      o.world.site = s;
      o.world.wan = wans[size_t(s)].get();
      o.world.payload_fault = [ep](WanPayloadFault f) { ep->SetPayloadFault(std::move(f)); };
      st[size_t(s)] = TrainSite(cfg, o);
      if (!st[size_t(s)].ok()) {  // its peers see it vanish and fail at once, not on a timeout
        if (left[size_t(s)]) {    // it left the world (sdc.on_faulty = exclude)
          LogWarning("site {}: {}", s, st[size_t(s)].ToString());
          st[size_t(s)] = Status::Ok();
        } else if (o.die_returns) {
          st[size_t(s)] = Status::Ok();  // lost on purpose
        } else {
          LogWarning("site {} failed: {}", s, st[size_t(s)].ToString());
        }
        clients[size_t(s)].reset();  // no Leave: its heartbeats stop, as a crashed site's
        wans[size_t(s)].reset();
        eps[size_t(s)].reset();
        return;
      }
      if (clients[size_t(s)] != nullptr) (void)clients[size_t(s)]->Leave();
    });
  for (auto& t : threads) t.join();
  clients.clear();  // their membership callbacks reach the endpoints
  wans.clear();
  eps.clear();
  for (const Status& s : st)
    if (!s.ok()) return s;
  return Status::Ok();
}

}  // namespace atl
