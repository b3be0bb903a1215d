// `atoll launch --chaos` (cli/launch/chaos.h).
#include "cli/launch/chaos.h"

#include <dirent.h>
#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>

#include "core/log.h"

namespace atl::cli {

namespace {

// The NUL-separated strings of /proc/PID/<what>.
std::vector<std::string> ProcStrings(pid_t pid, const char* what) {
  std::ifstream in(fmt::format("/proc/{}/{}", pid, what), std::ios::binary);
  std::vector<std::string> out;
  std::string s;
  while (std::getline(in, s, '\0')) out.push_back(s);
  return out;
}

// The parent of pid (0: unknown).
pid_t ParentOf(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("PPid:", 0) == 0) return pid_t(std::atoi(line.c_str() + 5));
  return 0;
}

// Whether `ancestor` is pid's parent, grandparent, ... (a few levels: mpirun's children).
bool DescendsFrom(pid_t pid, pid_t ancestor) {
  for (int level = 0; level < 4 && pid > 1; ++level) {
    pid = ParentOf(pid);
    if (pid == ancestor) return true;
  }
  return false;
}

}  // namespace

StatusOr<std::vector<ChaosKill>> PlanChaos(uint64_t seed, int kills, int sites, int ranks,
                                           int64_t steps) {
  if (kills < 1) return Status::InvalidArgument(fmt::format("--chaos-kills {}: at least 1", kills));
  const int64_t lo = 2, hi = steps - 4;
  if (hi - lo < 3 * int64_t(kills))
    return Status::InvalidArgument(
        fmt::format("--chaos: {} kills need train.steps >= {} (3 steps apart, none in the first 2 "
                    "or the last 4); this run has {}",
                    kills, lo + 4 + 3 * kills, steps));
  std::mt19937_64 rng(seed);
  std::vector<ChaosKill> plan;
  const int64_t span = (hi - lo) / kills;  // one kill in each stretch of `span` steps
  for (int i = 0; i < kills; ++i) {
    ChaosKill k;
    k.step = lo + i * span + int64_t(rng() % uint64_t(std::max<int64_t>(span - 2, 1)));
    const int kinds = ranks > 1 ? 3 : 2;
    const int kind = int(rng() % uint64_t(kinds));
    k.kind = kind == 0   ? ChaosKill::Kind::kLeader
             : kind == 1 ? ChaosKill::Kind::kCoordinator
                         : ChaosKill::Kind::kRank;
    if (k.kind != ChaosKill::Kind::kCoordinator) k.site = int(rng() % uint64_t(sites));
    if (k.kind == ChaosKill::Kind::kRank) k.rank = 1 + int(rng() % uint64_t(ranks - 1));
    plan.push_back(k);
  }
  return plan;
}

std::string Describe(const ChaosKill& k) {
  switch (k.kind) {
    case ChaosKill::Kind::kLeader:
      return fmt::format("site {}'s leader", k.site);
    case ChaosKill::Kind::kRank:
      return fmt::format("rank {} of site {}", k.rank, k.site);
    case ChaosKill::Kind::kCoordinator:
      return "the coordinator";
  }
  return "?";
}

std::optional<pid_t> FindRankPid(const std::string& config_path, int site, int rank, pid_t mpirun) {
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return std::nullopt;
  std::optional<pid_t> found;
  const std::string site_arg = std::to_string(site);
  const std::string rank_env = fmt::format("OMPI_COMM_WORLD_RANK={}", rank);
  while (dirent* e = ::readdir(d)) {
    const pid_t pid = pid_t(std::atoi(e->d_name));
    if (pid <= 0) continue;
    const std::vector<std::string> argv = ProcStrings(pid, "cmdline");
    bool train = false, config = false, this_site = false;
    for (size_t i = 0; i < argv.size(); ++i) {
      train |= argv[i] == "train";
      config |= argv[i] == config_path;
      this_site |= argv[i] == "--site" && i + 1 < argv.size() && argv[i + 1] == site_arg;
    }
    if (!train || !config || !this_site) continue;
    const std::vector<std::string> env = ProcStrings(pid, "environ");
    if (std::find(env.begin(), env.end(), rank_env) != env.end() && DescendsFrom(pid, mpirun)) {
      found = pid;
      break;
    }
  }
  ::closedir(d);
  return found;
}

ChaosMonkey::ChaosMonkey(std::vector<ChaosKill> plan, std::string dir, std::string config_path,
                         int sites)
    : plan_(std::move(plan)),
      dir_(std::move(dir)),
      config_path_(std::move(config_path)),
      sites_(sites) {}

void ChaosMonkey::Tick(const std::vector<pid_t>& site_pids, pid_t coordinator_pid,
                       const std::vector<int64_t>& steps) {
  const double now = NowSeconds();
  // The last kill: ended? recovered?
  if (!events_.empty() && !events_.back().done) {
    Event& e = events_.back();
    const bool coordinator = e.kill.kind == ChaosKill::Kind::kCoordinator;
    const pid_t current = coordinator ? coordinator_pid : site_pids[size_t(e.kill.site)];
    if (e.detect_s < 0 && current != e.watched) e.detect_s = now - e.t_kill;
    bool whole = e.detect_s >= 0;
    for (int s = 0; s < sites_; ++s)
      whole &= site_pids[size_t(s)] > 0 && steps[size_t(s)] > e.steps[size_t(s)];
    if (!coordinator && e.back_at < 0 && steps[size_t(e.kill.site)] > e.steps[size_t(e.kill.site)])
      e.back_at = steps[size_t(e.kill.site)];
    if (whole) {
      e.recover_s = now - e.t_kill;
      e.done = true;
      Write(e);
    }
    return;  // one at a time
  }
  if (next_ >= plan_.size()) return;
  const ChaosKill& k = plan_[next_];
  if (*std::max_element(steps.begin(), steps.end()) < k.step) return;
  for (pid_t p : site_pids)
    if (p <= 0) return;  // a site is still out (not from a kill of ours): wait
  Event e;
  e.kill = k;
  e.steps = steps;
  pid_t victim = -1;
  if (k.kind == ChaosKill::Kind::kCoordinator) {
    e.watched = victim = coordinator_pid;
  } else {
    e.watched = site_pids[size_t(k.site)];
    const std::optional<pid_t> p = FindRankPid(config_path_, k.site, k.rank, e.watched);
    if (!p) return;  // not started yet: try again at the next tick
    victim = *p;
  }
  ++next_;
  e.t_kill = now;
  if (victim <= 0 || ::kill(victim, SIGKILL) != 0) {
    LogWarning("launch --chaos: could not kill {} (pid {})", Describe(k), victim);
    return;
  }
  std::fprintf(stderr, "launch --chaos: killed %s (pid %d) at step %lld\n", Describe(k).c_str(),
               int(victim), static_cast<long long>(*std::max_element(steps.begin(), steps.end())));
  events_.push_back(std::move(e));
}

void ChaosMonkey::Write(const Event& e) const {
  std::ofstream out(dir_ + "/chaos.jsonl", std::ios::app);
  std::string steps;
  for (int64_t s : e.steps) steps += fmt::format("{}{}", steps.empty() ? "" : ",", s);
  out << fmt::format(
      "{{\"kill\":\"{}\",\"site\":{},\"rank\":{},\"at_steps\":[{}],\"detect_s\":{:.3f},"
      "\"recover_s\":{:.3f},\"back_at\":{}}}\n",
      Describe(e.kill), e.kill.site, e.kill.rank, steps, e.detect_s, e.recover_s, e.back_at);
}

std::string ChaosMonkey::Finish() {
  for (Event& e : events_)
    if (!e.done) {
      e.done = true;
      e.recover_s = -1;
      Write(e);
    }
  std::ostringstream out;
  out << "launch --chaos: " << events_.size() << " of " << plan_.size() << " kills done\n";
  out << fmt::format("  {:<22} {:>8} {:>9} {:>10} {:>8}\n", "killed", "at step", "detect s",
                     "recover s", "back at");
  for (const Event& e : events_) {
    const int64_t at = *std::max_element(e.steps.begin(), e.steps.end());
    out << fmt::format("  {:<22} {:>8} {:>9} {:>10} {:>8}\n", Describe(e.kill), at,
                       e.detect_s < 0 ? "-" : fmt::format("{:.2f}", e.detect_s),
                       e.recover_s >= 0 ? fmt::format("{:.2f}", e.recover_s) : "never",
                       e.back_at < 0 ? "-" : std::to_string(e.back_at));
  }
  return out.str();
}

}  // namespace atl::cli
