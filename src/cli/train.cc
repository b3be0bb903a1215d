// atoll train: train a GPT on this machine (see train/trainer.h).
#include <arpa/inet.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "comm/mpi.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/status.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/trainer.h"
#include "world/codec.h"
#include "world/coordinator.h"
#include "world/exchange.h"
#include "world/security.h"
#include "world/wan.h"

namespace atl::cli {

namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string out;
  std::string resume;
  std::string init_from;
  bool quiet = false;
  bool mpi = false;
  // Several sites (world.sites > 1).
  int site = -1;
  std::string coordinator;
  std::string certs;
  bool insecure = false;
  std::string wan_listen = "127.0.0.1:0";
  std::string wan_advertise;  // the address the other sites dial (empty: wan_listen's)
  std::string checkpoint_dir;
  int64_t die_after_step = 0;
  double slowdown = 1;
  int die_rank = 0;
  bool rejoin = false;
  std::vector<std::string> inject;  // fault specs added to [faults] inject
};

// What a site's leader holds to take part in a world: the WAN endpoint and its communicator
// among the sites' leaders, and the coordinator client (heartbeats run while it lives).
struct WorldLink {
  WorldSecurity security;
  std::vector<std::string> addresses;  // the WAN address each site's link was made with
  std::unique_ptr<WanEndpoint> endpoint;
  std::string advertised;  // the endpoint's address as the other sites dial it
  std::unique_ptr<CoordinatorClient> coordinator;
  std::unique_ptr<Communicator> wan;
  std::unique_ptr<SiteExchange> exchange;  // diloco, streaming
};

// The hash sites compare at registration: the model and training sections of the config and how
// the sites agree (every site must train the same model on the same schedule, the same way).
uint64_t WorldConfigHash(const RunConfig& cfg) {
  nlohmann::json j = RunConfigToJson(cfg);
  nlohmann::json agree;
  for (const char* k : {"sites", "strategy", "codec", "diloco.inner_steps", "diloco.outer_lr",
                        "diloco.outer_momentum", "streaming.fragments", "streaming.overlap_steps",
                        "streaming.alpha", "async.max_staleness", "balance"})
    agree[k] = j["world"][k];
  const std::string text = j["model"].dump() + j["train"].dump() + agree.dump();
  return Hash64(text.data(), text.size());
}

// HOST:PORT split at its last colon (the host may be [v6]); false when there is no port.
// An IPv6 host must be in brackets ([fe80::1]:7100): a bare one is refused.
bool SplitHostPort(const std::string& a, std::string* host, std::string* port) {
  const size_t colon = a.rfind(':');
  if (colon == std::string::npos || colon + 1 == a.size()) return false;
  *host = a.substr(0, colon);
  *port = a.substr(colon + 1);
  if (host->find(':') != std::string::npos && !(host->front() == '[' && host->back() == ']'))
    return false;
  return port->find_first_not_of("0123456789") == std::string::npos;
}

// Every interface: an empty host, *, 0, or an unspecified IPv4/IPv6 address ([::], [::0], ...).
bool IsWildcardHost(std::string host) {
  if (host.empty() || host == "*" || host == "0") return true;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  unsigned char addr[16] = {};
  if (::inet_pton(AF_INET, host.c_str(), addr) == 1 ||
      ::inet_pton(AF_INET6, host.c_str(), addr) == 1)
    return std::all_of(std::begin(addr), std::end(addr), [](unsigned char b) { return b == 0; });
  return false;
}

// --wan-listen / --wan-advertise: a wildcard listen address is no address to dial, so it needs
// the advertised one (kInvalidArgument otherwise).
Status CheckWanAddresses(const TrainArgs& a) {
  std::string host, port;
  if (!SplitHostPort(a.wan_listen, &host, &port))
    return Status::InvalidArgument(
        fmt::format("train: --wan-listen {} is not HOST:PORT", a.wan_listen));
  if (!a.wan_advertise.empty()) {
    std::string ahost, aport;
    if (!SplitHostPort(a.wan_advertise, &ahost, &aport) || IsWildcardHost(ahost))
      return Status::InvalidArgument(fmt::format(
          "train: --wan-advertise {} must be HOST:PORT with a host the other sites can dial",
          a.wan_advertise));
  } else if (IsWildcardHost(host)) {
    return Status::InvalidArgument(fmt::format(
        "train: --wan-listen {} listens on every interface, which is no address for the other "
        "sites to dial: pass --wan-advertise HOST:PORT (this machine's address they reach, e.g. "
        "10.0.0.5:{})",
        a.wan_listen, port));
  }
  return Status::Ok();
}

// What the other sites dial: --wan-advertise (port 0: the port bound), or the bound address.
std::string AdvertisedAddress(const TrainArgs& a, const std::string& bound) {
  if (a.wan_advertise.empty()) return bound;
  std::string host, port, bhost, bport;
  SplitHostPort(a.wan_advertise, &host, &port);
  if (port == "0" && SplitHostPort(bound, &bhost, &bport)) return host + ":" + bport;
  return a.wan_advertise;
}

// The leader's side of joining the world: listen for WAN peers, register with the coordinator,
// connect the ring.
StatusOr<WorldLink> JoinWorld(const RunConfig& cfg, const TrainArgs& a) {
  WorldSecurity security;
  if (a.insecure) {
    security.insecure = true;
  } else {
    ATOLL_ASSIGN_OR_RETURN(security, LoadSecurity(a.certs, fmt::format("site-{}", a.site)));
  }
  WorldLink link;
  link.security = security;
  // A peer silent for dead_s is dead for the coordinator, which then fails what waits for it
  // (on_membership below). The WAN's own keepalive is the backstop for a peer the coordinator
  // still hears (a partition between two sites): more lenient, since a link it breaks stays
  // broken, and a busy machine must never lose one to a late ping answer.
  const double dead_s = cfg.world.heartbeat_s * double(cfg.world.dead_after_beats);
  const double keepalive_s = std::max(20.0, 2 * dead_s);
  ATOLL_ASSIGN_OR_RETURN(link.endpoint, WanEndpoint::Listen(a.wan_listen, security, keepalive_s));
  link.advertised = AdvertisedAddress(a, link.endpoint->address());
  CoordinatorClientOptions co;
  co.address = a.coordinator;
  co.site = a.site;
  co.config_hash = WorldConfigHash(cfg);
  co.heartbeat_s = cfg.world.heartbeat_s;
  co.security = security;
  // A site the coordinator declared dead (a hung process, power loss, a partition: nothing
  // closed) fails the WAN operations waiting for it at once, not after their timeout. A site that
  // left has done its part of everything (it finished training): nothing waiting fails for it.
  WanEndpoint* ep = link.endpoint.get();
  const int me = a.site;
  co.on_membership = [ep, me](const Membership& m) {
    for (const SiteInfo& s : m.Dead(me))
      ep->PeerLost(s.site, s.wan_address,
                   fmt::format("the coordinator declared it dead (epoch {})", m.epoch));
    // A process registered since (perhaps where a dead one listened: a fixed --wan-listen).
    for (const SiteInfo& s : m.sites)
      if (s.alive && s.site != me && !s.wan_address.empty())
        ep->PeerAlive(s.site, s.wan_address, s.epoch);
  };
  ATOLL_ASSIGN_OR_RETURN(link.coordinator, CoordinatorClient::Connect(co));
  WanOptions wo;
  wo.site = a.site;
  wo.keepalive_s = keepalive_s;
  // What a peer may have waiting here: far above the protocol's (a ring step ahead, or a whole
  // buffer of int64 gradient sums, for the largest models too).
  wo.max_queued_bytes =
      std::max<uint64_t>(wo.max_queued_bytes, 4 * 8 * uint64_t(NumParameters(cfg.model)));
  Membership members;
  if (a.rejoin) {
    // Taking over a lost site: no links yet. They are made at the first exchange this process
    // joins (SiteExchange reconnects to every live site; they reconnect to it), after it has
    // fetched the state and registered for that exchange (Train, TrainOptions::rejoin).
    ATOLL_ASSIGN_OR_RETURN(members, link.coordinator->Peek());
    for (const SiteInfo& s : members.sites)
      wo.peers.push_back({s.site, s.site == a.site ? link.advertised : std::string(),
                          s.site == a.site ? 0 : s.epoch});
  } else {
    ATOLL_ASSIGN_OR_RETURN(members, link.coordinator->Register(link.advertised));
    for (const SiteInfo& s : members.sites) wo.peers.push_back({s.site, s.wan_address, s.epoch});
  }
  for (const WanPeer& p : wo.peers)
    link.addresses.push_back(p.site == a.site ? std::string() : p.address);
  wo.link = [world = cfg.world](int from, int to) { return world.Link(from, to); };
  wo.seed = uint64_t(cfg.train.seed);
  ATOLL_ASSIGN_OR_RETURN(link.wan, link.endpoint->Connect(wo));
  std::string ring;
  for (int s : link.endpoint->ring()) ring += fmt::format("{}{}", ring.empty() ? "" : " -> ", s);
  if (a.rejoin)
    LogInfo("site {}: taking over the site in a world of {} sites (epoch {})", a.site,
            members.sites.size(), members.epoch);
  else
    LogInfo("site {}: joined a world of {} sites (epoch {}), WAN ring {}", a.site,
            members.sites.size(), members.epoch, ring);
  return link;
}

// Rejoins (WorldHooks): every live site serves its state (publish); with --rejoin this process
// fetches a live site's (fetch) and learns how far the world is (current_round: the latest unit of
// `rounds_per_unit` coordinator rounds a live site has begun: an exchange, or a sync step).
void SetRejoinHooks(const TrainArgs& a, const WorldLink& link, int64_t rounds_per_unit,
                    WorldHooks* w) {
  WanEndpoint* ep = link.endpoint.get();
  CoordinatorClient* client = link.coordinator.get();
  w->publish = [ep](uint64_t index, std::shared_ptr<const std::string> state) {
    ep->Publish(index, std::move(state));
  };
  if (!a.rejoin) return;
  const int me = a.site;
  const WorldSecurity security = link.security;
  w->fetch = [client, me,
              security](uint64_t min_index) -> StatusOr<std::pair<uint64_t, std::string>> {
    ATOLL_ASSIGN_OR_RETURN(Membership m, client->Peek());
    Status last = Status::Unavailable(
        "no live site to fetch the state from (the run is over, or the world is gone)");
    bool waiting = false;  // a live site has no state for min_index yet: poll again
    for (const SiteInfo& s : m.sites) {
      if (!s.alive || s.site == me || s.wan_address.empty()) continue;
      auto got = FetchSnapshot(s.wan_address, security, me, min_index, 120, s.site);
      if (got.ok()) return got;
      if (got.status().code() == StatusCode::kNotFound) {
        waiting = true;
        last = got.status();
        continue;
      }
      LogWarning("site {}: rejoin: fetching the state from site {} ({}): {}", me, s.site,
                 s.wan_address, got.status().ToString());
      if (!waiting) last = got.status();
    }
    return last;
  };
  w->current_round = [client, me, rounds_per_unit]() -> StatusOr<int64_t> {
    ATOLL_ASSIGN_OR_RETURN(Membership m, client->Peek());
    int64_t last = -1;  // the latest coordinator round a live site has reached
    for (const SiteInfo& s : m.sites)
      if (s.alive && s.site != me) last = std::max(last, s.last_round);
    return last < 0 ? int64_t(-1) : last / rounds_per_unit;
  };
}

// Started by mpirun / srun (OpenMPI or PMIx set these), or asked for with --mpi.
bool UnderMpi(bool flag) {
  return flag || std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr || std::getenv("PMI_RANK") != nullptr;
}

Status RunRanks(const RunConfig& cfg, const TrainArgs& a, const Checkpoint* ck,
                MpiCommunicator* world);

Status RunTrain(const TrainArgs& a) {
  std::unique_ptr<Checkpoint> ck;
  RunConfig cfg;
  if (!a.init_from.empty() && !a.resume.empty())
    return Status::InvalidArgument(
        "train: --init-from and --resume: a resumed run goes on from its checkpoint's weights");
  if (!a.resume.empty()) {
    auto loaded = LoadCheckpoint(a.resume, /*with_optimizer=*/true);
    if (!loaded.ok()) return loaded.status().WithContext("--resume");
    ck = std::make_unique<Checkpoint>(std::move(loaded).value());
  }
  if (!a.config.empty()) {
    ATOLL_ASSIGN_OR_RETURN(cfg, LoadRunConfig(a.config, a.sets));
  } else if (ck != nullptr) {
    // The checkpoint's own config, with the overrides on top (e.g. --set train.steps=2000).
    cfg = ck->config;
    for (const auto& o : a.sets) ATOLL_RETURN_IF_ERROR(ApplyConfigOverride(&cfg, o));
    ATOLL_RETURN_IF_ERROR(ValidateRunConfig(cfg));
  } else {
    return Status::InvalidArgument("train: --config FILE is required (or --resume CHECKPOINT)");
  }
  if (!a.init_from.empty()) cfg.train.init_from = a.init_from;
  if (ck != nullptr) {
    // A resumed run goes on from its checkpoint's weights: init_from is only its record (a
    // --config without it takes the checkpoint's); another one named is refused.
    if (cfg.train.init_from.empty()) cfg.train.init_from = ck->config.train.init_from;
    if (cfg.train.init_from != ck->config.train.init_from)
      return Status::InvalidArgument(fmt::format(
          "--resume {}: train.init_from = '{}', the checkpoint's run had '{}': a resumed run "
          "goes on from its checkpoint's weights (leave train.init_from as it was)",
          a.resume, cfg.train.init_from, ck->config.train.init_from));
  }
  if (!a.inject.empty()) {
    for (const std::string& spec : a.inject)
      cfg.faults.inject += (cfg.faults.inject.empty() ? "" : ";") + spec;
    ATOLL_RETURN_IF_ERROR(ValidateRunConfig(cfg).WithContext("--inject"));
  }
  // MPI only under mpirun: a single process never initializes it.
  std::unique_ptr<MpiCommunicator> world;
  if (UnderMpi(a.mpi)) {
    ATOLL_ASSIGN_OR_RETURN(world, MpiCommunicator::CreateWorld(nullptr, nullptr));
  }
  Status s = RunRanks(cfg, a, ck.get(), world.get());
  if (!s.ok() && world != nullptr && world->size() > 1) {
    // The other ranks may be waiting in a collective this rank will never join: end the job.
    std::fprintf(stderr, "atoll: error (rank %d): %s\n", world->rank(), s.ToString().c_str());
    MpiCommunicator::AbortJob(s.ExitCode());
  }
  return s;
}

// The rest of `atoll train` on one rank (of `world`, or alone when it is null).
Status RunRanks(const RunConfig& cfg, const TrainArgs& a, const Checkpoint* ck,
                MpiCommunicator* world) {
  TrainOptions options;
  const bool leader = world == nullptr || world->rank() == 0;
  WorldLink link;
  if (cfg.world.sites > 1) {
    if (a.site < 0 || a.site >= cfg.world.sites)
      return Status::InvalidArgument(
          fmt::format("train: world.sites = {} needs --site in [0, {}) (got {})", cfg.world.sites,
                      cfg.world.sites, a.site));
    if (a.coordinator.empty())
      return Status::InvalidArgument(
          "train: world.sites > 1 needs --coordinator HOST:PORT (start one with `atoll "
          "coordinator`, or run the whole world with `atoll launch`)");
    if (a.certs.empty() == !a.insecure)
      return Status::InvalidArgument(
          "train: world.sites > 1 needs exactly one of --certs DIR (mutual TLS + token) or "
          "--insecure");
    ATOLL_RETURN_IF_ERROR(CheckWanAddresses(a));
    options.world.site = a.site;
    if (leader) {
      ATOLL_ASSIGN_OR_RETURN(link, JoinWorld(cfg, a));
      options.world.wan = link.wan.get();
      CoordinatorClient* client = link.coordinator.get();
      const int64_t sites = cfg.world.sites;
      options.world.commit = [client](int64_t r, std::optional<RoundVote> v) {
        return client->Round(r, v);
      };
      options.world.leave = [client] { return client->Leave(); };
      WanEndpoint* ep = link.endpoint.get();
      options.world.wan_bytes = [ep] { return ep->stats().bytes_sent; };
      options.world.payload_fault = [ep](WanPayloadFault f) { ep->SetPayloadFault(std::move(f)); };
      const std::string& strategy = cfg.world.strategy;
      if (strategy == "diloco" || strategy == "streaming") {
        ExchangeOptions eo;
        eo.site = a.site;
        eo.sites = int(sites);
        ATOLL_ASSIGN_OR_RETURN(eo.codec, ParseCodec(cfg.world.codec));
        eo.quorum = cfg.world.quorum > 0 ? int(cfg.world.quorum) : int(sites / 2 + 1);
        eo.round = [client](int64_t r, std::optional<RoundVote> v) { return client->Round(r, v); };
        eo.addresses = link.addresses;
        eo.reconnect = [ep](int s, const std::string& address) {
          return ep->Reconnect(s, address);
        };
        link.exchange = std::make_unique<SiteExchange>(link.wan.get(), eo);
        SiteExchange* ex = link.exchange.get();
        options.world.average = [ex](int64_t round, std::span<float> data,
                                     std::span<float> residual, const SiteExchange::Digest& digest,
                                     double pace) {
          return ex->Average(round, data, residual, digest, pace);
        };
        // Rejoins: every quiet point's state is served to a lost site's new process.
        SetRejoinHooks(a, link, kRoundsPerExchange, &options.world);
      } else if (strategy == "async") {
        options.world.ps = client->ps();
        const int64_t end_round = AsyncEndRound(cfg.train.steps);
        options.world.finish_barrier = [client, end_round]() -> Status {
          return client->Round(end_round).status().WithContext("the barrier at the end");
        };
      }
      if (strategy == "sync") {
        // A lost site's new process: the live sites serve the state of the step it registered
        // for, and make new links with it when it is back.
        SetRejoinHooks(a, link, kSyncRoundsPerStep, &options.world);
        options.world.addresses = link.addresses;
        options.world.reconnect = [ep](int s, const std::string& address) {
          return ep->Reconnect(s, address);
        };
      }
      if (a.rejoin && strategy == "async") {
        // The latest coordinator round any process reached, this site's lost one's too
        // (AsyncStrategy's Join picks a checkpoint cut past it).
        options.world.current_round = [client]() -> StatusOr<int64_t> {
          ATOLL_ASSIGN_OR_RETURN(Membership m, client->Peek());
          int64_t last = -1;
          for (const SiteInfo& s : m.sites) last = std::max(last, s.last_round);
          return last;
        };
      }
      if (a.rejoin) {
        options.world.rejoin = true;
        options.world.join = [client, ep = link.endpoint.get(), me = a.site,
                              address = link.advertised](int64_t round,
                                                         int64_t early_by) -> Status {
          ATOLL_ASSIGN_OR_RETURN(const Membership m, client->Rejoin(address, round, early_by));
          // The chunks this process sends from now on carry the epoch it registered at.
          for (const SiteInfo& s : m.sites)
            if (s.site == me) ep->SetEpoch(s.epoch);
          return Status::Ok();
        };
      }
    }
  } else if (a.rejoin) {
    return Status::InvalidArgument("train: --rejoin needs world.sites > 1");
  } else if (a.site >= 0 || !a.coordinator.empty()) {
    return Status::InvalidArgument("train: --site and --coordinator need world.sites > 1");
  }
  options.checkpoint_dir = a.checkpoint_dir;
  options.die_after_step = a.die_after_step;
  options.slowdown = a.slowdown;
  options.die_rank = a.die_rank;
  options.out_dir = a.out;
  options.resume = ck;
  options.resume_path = a.resume;
  options.progress = !a.quiet && (world == nullptr || world->rank() == 0);
  options.comm = world;
  ATOLL_ASSIGN_OR_RETURN(std::string path, Train(cfg, options));
  if (link.coordinator != nullptr) {
    // Training is done and saved: a coordinator gone at the very end is worth a warning only.
    if (Status left = link.coordinator->Leave(); !left.ok())
      LogWarning("site {}: leaving the world: {}", options.world.site, left.ToString());
  }
  if (leader && !path.empty()) {  // every site's leader: the world's checkpoint (the lowest live
                                  // site wrote it; none with train.checkpoint_every = -1)
    std::printf("%s\n", path.c_str());
    std::fflush(stdout);
  }
  return Status::Ok();
}

}  // namespace

void AddTrainCommand(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "Train a GPT on this machine");
  cmd->footer(
      "Writes OUT/metrics.jsonl (one JSON object per step), OUT/config.toml (the effective\n"
      "config), OUT/checkpoint (the final checkpoint; its path is printed on stdout; none with\n"
      "train.checkpoint_every = -1) and, with train.checkpoint_every > 0,\n"
      "OUT/checkpoint-<step>. A progress bar goes to stderr.\n"
      "Silent-data-corruption findings ([sdc]) are also appended to OUT/events.jsonl, one line\n"
      "each, and the injected flips ([faults], --inject) to OUT/faults.jsonl.\n"
      "Config keys (section.key, all optional; see configs/*.toml):\n"
      "  [model] n_layer n_head n_embd seq_len vocab_size\n"
      "  [train] steps seed batch_size micro_batch_size lr min_lr warmup_steps weight_decay\n"
      "          beta1 beta2 eps grad_clip eval_every eval_batches checkpoint_every threads\n"
      "          init_from (weights to start from; see --init-from)\n"
      "  [data]  dir\n"
      "  [parallel] dp tp pp schedule zero reproducible bucket_mb overlap   (dp * tp * pp = "
      "ranks)\n"
      "  [world] sites ranks_per_site strategy (sync|diloco|streaming|async) heartbeat_s quorum\n"
      "          codec (none|bf16|int8|int4) diloco.inner_steps diloco.outer_lr\n"
      "          diloco.outer_momentum streaming.fragments streaming.overlap_steps\n"
      "          streaming.alpha async.max_staleness link.latency_ms link.bandwidth_mbps\n"
      "          link.jitter_ms   (several sites: see `atoll launch --help`)\n"
      "  [faults] inject seed   (bit flips on purpose; see --inject)\n"
      "  [sdc]   guard fingerprints memory checksums moments_every guard_threshold guard_window\n"
      "          on_alarm (warn|stop|redo) audit_every on_faulty (stop|exclude)\n"
      "Examples:\n"
      "  atoll train --config configs/small.toml --out runs/s1 --set train.steps=200\n"
      "  atoll train --resume runs/s1/checkpoint-100 --out runs/s1\n"
      "  atoll train --config configs/gpt2-124m.toml --init-from ~/gpt2 --out runs/ft\n"
      "  mpirun -n 2 atoll train --config configs/small.toml --set parallel.dp=2 --out runs/dp2\n"
      "  mpirun -n 8 atoll train --config configs/small.toml --set parallel.dp=2 \\\n"
      "      --set parallel.tp=2 --set parallel.pp=2 --out runs/mesh");
  cmd->add_option("--config", args->config, "TOML config file (e.g. configs/small.toml)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", args->sets, "Override a config key: section.key=value (repeatable)");
  cmd->add_option("--out", args->out, "Run directory")->required();
  cmd->add_option("--resume", args->resume,
                  "Continue from a checkpoint directory (its config unless --config is given); "
                  "bitwise the same as not stopping")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--init-from", args->init_from,
                  "Start from these weights (train.init_from): an atoll checkpoint or a Hugging "
                  "Face GPT-2 directory (config.json + model.safetensors) of [model]'s shape; "
                  "the optimizer starts afresh at step 0")
      ->check(CLI::ExistingDirectory);
  cmd->add_flag("--quiet,-q", args->quiet, "No progress output");
  cmd->add_flag("--mpi", args->mpi,
                "Initialize MPI (automatic under mpirun/srun: OMPI_COMM_WORLD_SIZE, PMIX_RANK)");
  cmd->add_option("--site", args->site, "This site's index (world.sites > 1)");
  cmd->add_option("--coordinator", args->coordinator,
                  "The coordinator's HOST:PORT (world.sites > 1; see `atoll coordinator`)");
  cmd->add_option("--certs", args->certs,
                  "Certificates directory (`atoll certs`): mutual TLS + token between sites");
  cmd->add_flag("--insecure", args->insecure,
                "No TLS and no token between sites (tests, trusted networks only)");
  cmd->add_option("--wan-listen", args->wan_listen,
                  "HOST:PORT the site leader listens on for WAN peers (default 127.0.0.1:0)");
  cmd->add_option("--wan-advertise", args->wan_advertise,
                  "HOST:PORT the other sites dial to reach this one (needed with a wildcard "
                  "--wan-listen such as 0.0.0.0:7100; port 0: the port bound)");
  cmd->add_option("--checkpoint-dir", args->checkpoint_dir,
                  "Where checkpoints go (default: --out); several sites: site 0 writes them");
  cmd->add_flag(
      "--rejoin", args->rejoin,
      "Take over a site whose process was lost: sync: fetch a live site's state and join at a "
      "step (tp = pp = 1, no ZeRO); diloco, streaming: fetch the state from a live site and "
      "join at an exchange; async: go on after the site's last push");
  cmd->add_option("--slowdown", args->slowdown,
                  "Emulate a slower site (benchmarks of world.balance): each step's passes take "
                  "this many times as long (the ranks sleep for the difference)")
      ->check(CLI::Range(1.0, 100.0));
  cmd->add_option("--die-after-step", args->die_after_step,
                  "Fault injection for tests: the site's leader exits abruptly (exit code 3, no "
                  "goodbye to the coordinator) after this step");
  cmd->add_option("--die-rank", args->die_rank,
                  "With --die-after-step: this rank of the site exits instead of the leader (its "
                  "MPI job then ends)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option(
      "--inject", args->inject,
      "Flip a bit on purpose (silent-data-corruption experiments; repeatable; added to [faults] "
      "inject): KIND:KEY=VALUE,... with KIND gemm_fwd, gemm_bwd, activation, grad, param, moment, "
      "bad_core or wan and keys step, site, rank, layer, gemm, micro, elem, bit, moment, p, "
      "stuck, chunk; unset "
      "layer/gemm/elem/bit are drawn from faults.seed. E.g. --inject param:step=5,bit=30 "
      "--inject gemm_fwd:step=9,layer=1,gemm=2. Each flip is logged to DIR/faults.jsonl");
  cmd->callback([args] { ExitIfError(RunTrain(*args)); });
}

}  // namespace atl::cli
