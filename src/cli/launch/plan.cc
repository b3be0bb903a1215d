// The plan of `atoll launch` (cli/launch/plan.h).
#include "cli/launch/plan.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "cli/launch/processes.h"
#include "core/file.h"
#include "train/strategies/world_strategy.h"
#include "world/certs.h"

namespace atl::cli {

namespace {

// Mutual TLS with the run's certificates, or none.
void AddSecurity(const LaunchPlan& p, std::vector<std::string>* argv) {
  if (p.certs.empty()) {
    argv->push_back("--insecure");
  } else {
    argv->insert(argv->end(), {"--certs", p.certs});
  }
}

}  // namespace

StatusOr<LaunchPlan> PlanLaunch(const LaunchArgs& a) {
  LaunchPlan p;
  ATOLL_ASSIGN_OR_RETURN(p.cfg, LoadRunConfig(a.config, a.sets));
  const RunConfig& cfg = p.cfg;
  if (cfg.world.sites < 2)
    return Status::InvalidArgument(fmt::format(
        "launch: world.sites = {}: launch starts a world of several sites (set world.sites >= 2, "
        "e.g. --set world.sites=2); for one site use `atoll train` (or `mpirun -n K atoll train`)",
        cfg.world.sites));
  const int sites = p.sites = int(cfg.world.sites);
  const int ranks = p.ranks = int(cfg.world.ranks_per_site);
  for (const std::string& f : a.fail_sites) {
    const size_t at = f.find('@');
    const size_t dot = f.substr(0, at == std::string::npos ? 0 : at).find('.');
    LaunchPlan::SiteFault fault;
    try {
      if (at == std::string::npos) throw std::invalid_argument(f);
      const size_t site_end = dot == std::string::npos ? at : dot;
      size_t used = 0;
      fault.site = std::stoi(f.substr(0, site_end), &used);
      if (used != site_end) throw std::invalid_argument(f);
      if (dot != std::string::npos) {
        fault.rank = std::stoi(f.substr(dot + 1, at - dot - 1), &used);
        if (used != at - dot - 1) throw std::invalid_argument(f);
      }
      fault.step = std::stoll(f.substr(at + 1), &used);
      if (used != f.size() - at - 1) throw std::invalid_argument(f);
    } catch (const std::exception&) {
      return Status::InvalidArgument(fmt::format(
          "launch: --fail-site {}: expected SITE@STEP or SITE.RANK@STEP, e.g. 2@30 or 1.1@30", f));
    }
    if (fault.site < 0 || fault.site >= sites || fault.rank < 0 || fault.rank >= ranks ||
        fault.step < 1 || fault.step > cfg.train.steps)
      return Status::InvalidArgument(fmt::format(
          "launch: --fail-site {}: the site must be in [0, {}), the rank in [0, {}) and the step "
          "in [1, {}]",
          f, sites, ranks, cfg.train.steps));
    p.faults.push_back(fault);
  }
  for (const std::string& f : a.slow_sites) {
    const size_t colon = f.find(':');
    int site = -1;
    double factor = 0;
    try {
      size_t used = 0;
      if (colon == std::string::npos) throw std::invalid_argument(f);
      site = std::stoi(f.substr(0, colon), &used);
      if (used != colon) throw std::invalid_argument(f);
      factor = std::stod(f.substr(colon + 1), &used);
      if (used != f.size() - colon - 1) throw std::invalid_argument(f);
    } catch (const std::exception&) {
      site = -1;
    }
    if (site < 0 || site >= sites || !(factor >= 1 && factor <= 100))
      return Status::InvalidArgument(fmt::format(
          "launch: --slow-site {}: expected SITE:FACTOR with the site in [0, {}) and the factor "
          "in [1, 100], e.g. 2:2",
          f, sites));
    p.slowdown[site] = factor;
  }
  if (a.chaos >= 0) {
    ATOLL_ASSIGN_OR_RETURN(
        p.chaos, PlanChaos(uint64_t(a.chaos), a.chaos_kills, sites, ranks, cfg.train.steps));
  } else if (a.chaos != -1) {
    return Status::InvalidArgument(fmt::format("launch: --chaos {}: a seed >= 0", a.chaos));
  }
  if (!a.resume.empty()) {
    if (!FileExists(a.resume + "/manifest.json"))
      return Status::InvalidArgument(
          fmt::format("launch: --resume {}: not a checkpoint (no manifest.json)", a.resume));
    p.resume = std::filesystem::absolute(a.resume).string();
    const std::string& strategy = cfg.world.strategy;
    if (strategy == "diloco" || strategy == "streaming" || strategy == "async") {
      for (int s = 0; s < sites; ++s)
        if (const std::string state = SiteStatePath(p.resume, s); !FileExists(state))
          return Status::InvalidArgument(fmt::format(
              "launch: --resume {}: world.strategy = \"{}\" needs every site's state beside the "
              "checkpoint, and {} is missing ({})",
              a.resume, strategy, state,
              strategy == "async"
                  ? "written at checkpoints on push steps, by the sites that met there"
                  : "written at each checkpoint with no exchange in flight"));
    }
  }
  std::string& dir = p.dir = a.out;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  // Batch scripts run elsewhere, from another directory: every path they name is absolute.
  if (!a.emit.empty()) dir = std::filesystem::absolute(dir).lexically_normal().string();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();

  if (!a.emit.empty()) {
    if (a.emit != "slurm")
      return Status::InvalidArgument(
          fmt::format("launch: --emit {}: the only format is slurm", a.emit));
    if (!a.fail_sites.empty() || !a.slow_sites.empty() || a.rejoin || a.chaos >= 0)
      return Status::InvalidArgument(
          "launch: --emit slurm writes the run's scripts; --fail-site, --slow-site, --rejoin and "
          "--chaos are for worlds launch runs itself");
  }
  const char* mpirun_name = std::getenv("ATOLL_MPIRUN");
  const std::string mpirun_want = mpirun_name != nullptr && *mpirun_name ? mpirun_name : "mpirun";
  const auto mpirun = FindOnPath(mpirun_want);
  if (!mpirun && a.emit.empty())  // the scripts run mpirun on the cluster's nodes
    return Status::Unavailable(fmt::format(
        "launch: {} not found{}: every site runs under mpirun (install OpenMPI: apt-get install "
        "openmpi-bin, or name it with ATOLL_MPIRUN=/path/to/mpirun)",
        mpirun_want, mpirun_want.find('/') == std::string::npos ? " on PATH" : ""));
  char self_buf[4096];
  const ssize_t self_n = ::readlink("/proc/self/exe", self_buf, sizeof(self_buf) - 1);
  if (self_n <= 0)
    return Status::Internal("launch: cannot read /proc/self/exe: " + ErrnoText(errno));
  p.self.assign(self_buf, size_t(self_n));
  p.mpirun = mpirun ? *mpirun : mpirun_want;

  // The run directory: the effective config, certificates, one folder per site.
  ATOLL_RETURN_IF_ERROR(MakeDirs(dir));
  p.config_path = dir + "/config.toml";
  ATOLL_RETURN_IF_ERROR(WriteFileAtomic(p.config_path, RunConfigToToml(cfg)));
  if (!a.insecure) {
    std::string& certs = p.certs = a.certs;
    if (!a.emit.empty() && !certs.empty()) certs = std::filesystem::absolute(certs).string();
    if (certs.empty()) {
      // The sites read DIR/certs; the CA's key is kept apart, in DIR/ca.
      certs = dir + "/certs";
      ATOLL_RETURN_IF_ERROR(
          MakeCerts(certs, sites, /*force=*/true, dir + "/ca").WithContext("launch: " + certs));
    }
  }
  // A fresh run: an old coordinator log would be replayed (and an old parameter server's state
  // recovered), old metrics shown.
  for (const char* old :
       {"coordinator.log", "ops.jsonl", "ps_params.bin", "chaos.jsonl", "resumed_from"})
    ::unlink((dir + "/" + old).c_str());
  // Where the run went on from: `atoll replay` of an async run starts there too.
  if (!p.resume.empty())
    ATOLL_RETURN_IF_ERROR(WriteFileAtomic(dir + "/resumed_from", p.resume + "\n"));
  for (int s = 0; s < sites; ++s) {
    ATOLL_RETURN_IF_ERROR(MakeDirs(fmt::format("{}/site-{}", dir, s)));
    ::unlink(fmt::format("{}/site-{}/metrics.jsonl", dir, s).c_str());
  }
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  p.env = ChildEnvironment({
      {"OMPI_ALLOW_RUN_AS_ROOT", "1"},
      {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
      {"OMPI_MCA_rmaps_base_oversubscribe", "1"},
      {"OMPI_MCA_btl", "self,vader"},
      {"OMPI_MCA_mpi_yield_when_idle", "1"},
      // Every site's mpirun would pin its rank 0 to core 0: let the kernel place them.
      {"OMPI_MCA_hwloc_base_binding_policy", "none"},
      {"OMP_NUM_THREADS", std::to_string(std::max(1u, cores / unsigned(sites * ranks)))},
      // Every site's ranks share this machine: the step-time prediction counts them.
      {"ATOLL_LOCAL_PROCS", std::to_string(sites * ranks)},
  });

  return p;
}

std::vector<std::string> LaunchPlan::CoordinatorArgv(const std::string& listen) const {
  std::vector<std::string> argv = {self,
                                   "coordinator",
                                   "--listen",
                                   listen,
                                   "--sites",
                                   std::to_string(sites),
                                   "--state",
                                   dir,
                                   "--heartbeat-s",
                                   fmt::format("{}", cfg.world.heartbeat_s),
                                   "--dead-after-beats",
                                   std::to_string(cfg.world.dead_after_beats)};
  AddSecurity(*this, &argv);
  return argv;
}

std::vector<std::string> LaunchPlan::SiteArgv(int site, const std::string& coordinator,
                                              bool rejoin) const {
  std::vector<std::string> argv = {mpirun,
                                   "-n",
                                   std::to_string(ranks),
                                   self,
                                   "train",
                                   "--config",
                                   config_path,
                                   "--site",
                                   std::to_string(site),
                                   "--coordinator",
                                   coordinator};
  AddSecurity(*this, &argv);
  argv.insert(argv.end(),
              {"--out", fmt::format("{}/site-{}", dir, site), "--checkpoint-dir", dir, "-q"});
  if (auto slow = slowdown.find(site); slow != slowdown.end())
    argv.insert(argv.end(), {"--slowdown", fmt::format("{}", slow->second)});
  if (rejoin) {
    argv.push_back("--rejoin");
    // async: the parameter server of a resumed run holds the checkpoint's parameters, and a site
    // that has not pushed since goes on from its state beside it.
    if (!resume.empty() && cfg.world.strategy == "async")
      argv.insert(argv.end(), {"--resume", resume});
  } else {
    if (!resume.empty()) argv.insert(argv.end(), {"--resume", resume});
    for (const SiteFault& f : faults)
      if (f.site == site)
        argv.insert(argv.end(), {"--die-after-step", std::to_string(f.step), "--die-rank",
                                 std::to_string(f.rank)});
  }
  return argv;
}

}  // namespace atl::cli
