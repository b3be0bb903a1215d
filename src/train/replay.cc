#include "train/replay.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "core/build_info.h"
#include "core/file.h"
#include "core/hash.h"
#include "core/log.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/trainer.h"
#include "world/codec.h"

namespace atl {

class ReplayServer::View : public ParameterServer {
 public:
  View(ReplayServer* server, int site) : server_(server), site_(site) {}
  StatusOr<int64_t> Init(std::span<const float> params, int64_t /*max_staleness*/) override {
    return server_->Init(site_, params);
  }
  StatusOr<int64_t> Pull(std::span<float> params) override { return server_->Pull(site_, params); }
  StatusOr<PsPushResult> Push(const PsUpdate& update) override {
    if (update.site != site_)
      return Status::InvalidArgument(
          fmt::format("replay: site {} pushed an update for site {}", site_, update.site));
    return server_->Push(update);
  }

 private:
  ReplayServer* server_;
  int site_;
};

namespace {

// The status a re-executed site ends with where the run's log ends for it (it died there).
constexpr std::string_view kSiteEnded = "replay: the run's log ends here for site";
// The status of a site's process where the log says a new process took the site over.
constexpr std::string_view kProcessEnded = "replay: a new process takes over site";
// The status of a site stopped because another one failed.
constexpr std::string_view kStopped = "replay: stopped because another site failed";

}  // namespace

ReplayServer::ReplayServer(OpLog log, int sites)
    : log_(std::move(log)),
      by_site_(size_t(sites)),
      pushed_(size_t(sites), 0),
      rejoins_(size_t(sites)),
      process_(size_t(sites), 0) {
  for (const OpLog::Rejoin& r : log_.rejoins)
    if (r.site >= 0 && r.site < sites) rejoins_[size_t(r.site)].push_back(r.step);
  for (size_t i = 0; i < log_.entries.size(); ++i) {
    const PsLogEntry& e = log_.entries[i];
    if (e.site >= 0 && e.site < sites) by_site_[size_t(e.site)].push_back(i);
    ++needed_[e.base_version];  // the pull before this push returns its base version
  }
  for (int s = 0; s < sites; ++s) views_.push_back(std::make_unique<View>(this, s));
}

ParameterServer* ReplayServer::ForSite(int site) { return views_[size_t(site)].get(); }

StatusOr<int64_t> ReplayServer::Init(int site, std::span<const float> params) {
  std::unique_lock lock(mu_);
  const uint64_t h = Hash64(params.data(), params.size_bytes());
  if (params.size() != log_.count || h != log_.init_checksum)
    return Status::Internal(fmt::format(
        "replay: site {}'s initial parameters ({} floats, xxh3 {:016x}) are not the logged ones "
        "({} floats, xxh3 {:016x}): another config, seed or build, or train.init_from's weights "
        "changed",
        site, params.size(), h, log_.count, log_.init_checksum));
  if (!initialized_) {
    params_.assign(params.begin(), params.end());
    initialized_ = true;
    if (needed_.count(0) > 0) snapshots_[0] = params_;
  }
  const size_t p = process_[size_t(site)];
  return p == 0 ? int64_t(0) : rejoins_[size_t(site)][p - 1];
}

void ReplayServer::Abort(const Status& why) {
  std::lock_guard lock(mu_);
  if (aborted_.ok()) aborted_ = why.ok() ? Status::Internal("replay aborted") : why;
  cv_.notify_all();
}

Status ReplayServer::CopyVersion(int64_t version, std::span<float> out,
                                 std::unique_lock<std::mutex>& lock) {
  cv_.wait(lock, [&] { return version_ >= version || !aborted_.ok(); });
  if (!aborted_.ok()) return Status::Unavailable(std::string(kStopped));
  const std::vector<float>* src = &params_;
  if (version != version_) {
    auto it = snapshots_.find(version);
    if (it == snapshots_.end())
      return Status::Internal(fmt::format("replay: version {} is no longer held", version));
    src = &it->second;
  }
  if (out.size() != src->size())
    return Status::InvalidArgument(
        fmt::format("replay: pull of {} floats, the server holds {}", out.size(), src->size()));
  std::copy(src->begin(), src->end(), out.begin());
  return Status::Ok();
}

StatusOr<int64_t> ReplayServer::Pull(int site, std::span<float> params) {
  std::unique_lock lock(mu_);
  if (!initialized_) return Status::Internal("replay: pull before init");
  const auto& mine = by_site_[size_t(site)];
  const size_t k = pushed_[size_t(site)];
  // The step of the site's last push served (its logged last_step: the push matched the log).
  const int64_t last_step = k > 0 ? log_.entries[mine[k - 1]].last_step : 0;
  const size_t p = process_[size_t(site)];
  if (p < rejoins_[size_t(site)].size() && k > 0 && last_step == rejoins_[size_t(site)][p]) {
    ++process_[size_t(site)];
    return Status::Unavailable(fmt::format("{} {} after step {}", kProcessEnded, site, last_step));
  }
  if (k < mine.size()) {
    const int64_t v = log_.entries[mine[k]].base_version;
    ATOLL_RETURN_IF_ERROR(CopyVersion(v, params, lock));
    if (--needed_[v] == 0) {
      needed_.erase(v);
      snapshots_.erase(v);
    }
    return v;
  }
  // After its last logged push: the final parameters.
  cv_.wait(lock, [&] { return next_id_ == int64_t(log_.entries.size()) || !aborted_.ok(); });
  if (!aborted_.ok()) return Status::Unavailable(std::string(kStopped));
  std::copy(params_.begin(), params_.end(), params.begin());
  return version_;
}

StatusOr<PsPushResult> ReplayServer::Push(const PsUpdate& u) {
  std::unique_lock lock(mu_);
  const auto& mine = by_site_[size_t(u.site)];
  const size_t k = pushed_[size_t(u.site)];
  if (k >= mine.size())
    return Status::Unavailable(fmt::format("{} {} (after its {} pushes)", kSiteEnded, u.site, k));
  const PsLogEntry& e = log_.entries[mine[k]];
  const uint64_t h = Hash64(u.encoded.data(), u.encoded.size());
  if (u.base_version != e.base_version || u.first_step != e.first_step ||
      u.last_step != e.last_step || u.weight != e.weight || h != e.checksum ||
      u.encoded.size() != e.bytes)
    return Status::Internal(fmt::format(
        "replay diverged at update {} (site {}'s push {}): logged base {} steps {}..{} xxh3 "
        "{:016x} ({} bytes), replayed base {} steps {}..{} xxh3 {:016x} ({} bytes)",
        e.update_id, u.site, k + 1, e.base_version, e.first_step, e.last_step, e.checksum, e.bytes,
        u.base_version, u.first_step, u.last_step, h, u.encoded.size()));
  cv_.wait(lock, [&] { return next_id_ == e.update_id || !aborted_.ok(); });
  if (!aborted_.ok()) return Status::Unavailable(std::string(kStopped));
  PsPushResult r;
  r.update_id = e.update_id;
  if (e.applied_version >= 0) {
    std::vector<float> decoded(params_.size());
    ATOLL_RETURN_IF_ERROR(Decode(u.encoded, decoded));
    ApplyUpdate(params_, decoded, u.weight);
    ++version_;
    if (version_ != e.applied_version)
      return Status::Internal(fmt::format("replay: update {} made version {}, logged {}",
                                          e.update_id, version_, e.applied_version));
    if (needed_.count(version_) > 0) snapshots_[version_] = params_;
    r.accepted = true;
  }
  r.applied_version = e.applied_version;
  r.current_version = version_;
  ++pushed_[size_t(u.site)];
  ++next_id_;
  cv_.notify_all();
  return r;
}

StatusOr<ReplayReport> Replay(const ReplayOptions& options) {
  const std::string& dir = options.run_dir;
  ATOLL_ASSIGN_OR_RETURN(RunConfig cfg, LoadRunConfig(dir + "/config.toml", {}));
  if (cfg.world.strategy != "async" || cfg.world.sites < 2)
    return Status::InvalidArgument(fmt::format(
        "replay: {} is a run of world.strategy = \"{}\" with {} site(s); replay re-executes "
        "asynchronous runs (world.strategy = \"async\", world.sites >= 2)",
        dir, cfg.world.strategy, cfg.world.sites));
  if (cfg.world.ranks_per_site != 1)
    return Status::InvalidArgument(fmt::format(
        "replay: the run had world.ranks_per_site = {}; replay re-executes sites of one rank "
        "each",
        cfg.world.ranks_per_site));
  ATOLL_ASSIGN_OR_RETURN(OpLog log, ReadOpLog(dir + "/ops.jsonl"));
  // A run resumed from a checkpoint (launch --resume wrote where from): it is re-executed from
  // there, each site from its state beside it.
  std::optional<Checkpoint> from;
  std::string from_path;
  if (const std::string marker = dir + "/resumed_from"; FileExists(marker)) {
    ATOLL_ASSIGN_OR_RETURN(from_path, ReadFile(marker));
    while (!from_path.empty() && std::isspace(static_cast<unsigned char>(from_path.back())))
      from_path.pop_back();
    auto loaded = LoadCheckpoint(from_path, /*with_optimizer=*/true);
    if (!loaded.ok())
      return loaded.status().WithContext(
          fmt::format("replay: the run was resumed from {} ({}/resumed_from)", from_path, dir));
    from = std::move(*loaded);
  }
  auto final_ck = LoadCheckpoint(dir + "/checkpoint", false);
  if (!final_ck.ok())
    return final_ck.status().WithContext(
        fmt::format("replay: {}/checkpoint, the final state a replay is compared with (a run with "
                    "train.checkpoint_every = -1 writes none)",
                    dir));
  Checkpoint ck = std::move(*final_ck);
  if (ck.params.size() != log.count)
    return Status::InvalidArgument(
        fmt::format("replay: {}/checkpoint holds {} parameters, the op log {}", dir,
                    ck.params.size(), log.count));
  // The run's data, as its checkpoint recorded it: other tokens would re-execute another run.
  {
    ATOLL_ASSIGN_OR_RETURN(TokenFile train, OpenTokenFile(cfg.data.dir, "train.bin"));
    ATOLL_ASSIGN_OR_RETURN(TokenFile val, OpenTokenFile(cfg.data.dir, "val.bin"));
    if (train.checksum() != ck.cursor.train_checksum || val.checksum() != ck.cursor.val_checksum)
      return Status::InvalidArgument(fmt::format(
          "replay: the data in {} is not the run's (train.bin/val.bin checksums {}/{} there, "
          "{}/{} in {}/checkpoint's manifest): point data.dir in {}/config.toml at the run's "
          "data",
          cfg.data.dir, HashToHex(train.checksum()), HashToHex(val.checksum()),
          HashToHex(ck.cursor.train_checksum), HashToHex(ck.cursor.val_checksum), dir, dir));
  }
  // Where the run's arithmetic came from: another build or CPU may round differently.
  const std::string here_build = BuildId(), here_cpu = CpuDescription();
  std::string elsewhere;
  if (!log.build.empty() && log.build != here_build)
    elsewhere += fmt::format("the run's build was {}, this one is {}", log.build, here_build);
  if (!log.cpu.empty() && log.cpu != here_cpu)
    elsewhere += fmt::format("{}the run's CPU was \"{}\", this one is \"{}\"",
                             elsewhere.empty() ? "" : "; ", log.cpu, here_cpu);
  std::set<std::pair<int, std::string>> named;  // a site's build may be logged again (restarts)
  for (const OpLog::SiteBuild& b : log.other_builds)
    if (named.insert({b.site, b.build + "|" + b.cpu}).second)
      elsewhere +=
          fmt::format("{}site {} ran build {} on \"{}\", unlike the site that started the run",
                      elsewhere.empty() ? "" : "; ", b.site, b.build, b.cpu);
  if (log.build.empty())
    LogWarning(
        "replay: {}/ops.jsonl does not name the run's build and CPU (an older atoll wrote it): "
        "bitwise identity needs the same build on the same kind of CPU",
        dir);
  if (!elsewhere.empty())
    LogWarning("replay: {}: a difference in the result may come from that, not from the log",
               elsewhere);
  const int sites = int(cfg.world.sites);
  for (const PsLogEntry& e : log.entries)
    if (e.site < 0 || e.site >= sites)
      return Status::Corruption(fmt::format("replay: {}/ops.jsonl: update {} names site {} of {}",
                                            dir, e.update_id, e.site, sites));

  // Re-execute: no validation, no checkpoints but site 0's final one in the scratch dir, one
  // thread per site (kernels give the same bits for any thread count).
  RunConfig rc = cfg;
  rc.train.eval_batches = 0;
  rc.train.checkpoint_every = 0;
  rc.train.threads = 1;
  const std::string work = options.work_dir.empty() ? dir + "/replay" : options.work_dir;
  ATOLL_RETURN_IF_ERROR(MakeDirs(work));
  ReplayServer server(std::move(log), sites);
  if (options.progress)
    LogInfo("replay: re-executing {} logged updates of {} sites ({} steps each) from {}",
            server.logged(), sites, rc.train.steps, dir);
  std::vector<Status> results(static_cast<size_t>(sites), Status::Ok());
  std::vector<std::thread> threads;
  for (int s = 0; s < sites; ++s) {
    threads.emplace_back([&, s] {
      TrainOptions o;
      o.out_dir = fmt::format("{}/site-{}", work, s);
      o.checkpoint_dir = work;
      o.progress = false;
      o.world.site = s;
      o.world.ps = server.ForSite(s);
      o.world.join = [](int64_t, int64_t) { return Status::Ok(); };
      if (from) {
        o.resume = &*from;
        o.resume_path = from_path;
      }
      auto r = Train(rc, o);
      // Where the run's log has a new process take the site over, re-execute that one too.
      while (!r.ok() && r.status().message().find(kProcessEnded) != std::string::npos) {
        o.world.rejoin = true;  // (of a resumed run: resumed too, as launch starts it)
        r = Train(rc, o);
      }
      results[size_t(s)] = r.status();
      // A failed or diverged site: the updates the others wait for never come.
      if (!r.ok() && r.status().message().find(kSiteEnded) == std::string::npos)
        server.Abort(r.status());
    });
  }
  for (auto& t : threads) t.join();
  // Report the site that failed, not those it stopped.
  const std::string why = elsewhere.empty() ? "" : fmt::format(" ({})", elsewhere);
  for (int s = 0; s < sites; ++s) {
    const Status& st = results[size_t(s)];
    if (st.ok() || st.message().find(kSiteEnded) != std::string::npos ||
        st.message().find(kStopped) != std::string::npos)
      continue;
    return st.WithContext(fmt::format("replay of site {}{}", s, why));
  }
  for (int s = 0; s < sites; ++s)
    if (!results[size_t(s)].ok() &&
        results[size_t(s)].message().find(kSiteEnded) == std::string::npos)
      return results[size_t(s)].WithContext(fmt::format("replay of site {}", s));
  if (server.served() != server.logged())
    return Status::Internal(fmt::format("replay: {} of {} logged updates were re-executed",
                                        server.served(), server.logged()));
  ReplayReport rep;
  rep.elsewhere = elsewhere;
  rep.updates = server.served();
  rep.sites = sites;
  const auto& p = server.params();
  rep.replayed_hash = Hash64(p.data(), p.size() * sizeof(float));
  rep.checkpoint_hash = Hash64(ck.params.data(), ck.params.size() * sizeof(float));
  rep.identical = p.size() == ck.params.size() &&
                  std::memcmp(p.data(), ck.params.data(), p.size() * sizeof(float)) == 0;
  if (!rep.identical)
    for (size_t i = 0; i < p.size(); ++i)
      if (std::memcmp(&p[i], &ck.params[i], sizeof(float)) != 0) {
        rep.first_difference = i;
        break;
      }
  return rep;
}

}  // namespace atl
