// atoll launch: a whole world on this machine — the coordinator and every site's mpirun as child
// processes, one live view of their progress, and one exit status.
//
//   cli/launch/plan.h        what is started (checked before anything runs), command lines
//   cli/launch/processes.h   spawning, reaping and stopping the children, stop signals
//   cli/launch/live_view.h   the sites' progress, redrawn in place or a line now and then
//   this file                the run: the coordinator, the sites, watching them, the end
//
// Exit status: 0 when every site exits 0 (the final checkpoint's path is printed on stdout); 1 when
// a site or the coordinator fails (the others are stopped; the failed one's log tail goes to
// stderr); 2 for a bad config or arguments; 130 on SIGINT (143 on SIGTERM).
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/launch/chaos.h"
#include "cli/launch/live_view.h"
#include "cli/launch/plan.h"
#include "cli/launch/processes.h"
#include "cli/launch/slurm.h"
#include "core/file.h"
#include "core/log.h"
#include "core/status.h"
#include "train/report.h"

namespace atl::cli {

namespace {

// The run report (train/report.h), its path on stderr (stdout stays the checkpoint's). A report
// that cannot be written (no Chart.js) is a warning, not a failed run.
void ReportOnStderr(const std::string& dir) {
  try {
    auto report = WriteReport({dir, "", ""});
    if (report.ok())
      std::fprintf(stderr, "launch: report: %s\n", report->c_str());
    else
      std::fprintf(stderr, "launch: no report: %s\n", report.status().ToString().c_str());
  } catch (const std::exception& e) {  // the run's outcome stands whatever its files hold
    std::fprintf(stderr, "launch: no report: %s\n", e.what());
  }
}

// Times launch starts a coordinator again that died while the sites ran (each try counts; with
// --chaos, also once per kill).
constexpr int kCoordinatorRestarts = 5;

// Reads the coordinator's first stdout line (its address) within `timeout_s`.
StatusOr<std::string> ReadAddress(int fd, Child& coordinator, const std::string& stderr_path,
                                  double timeout_s, std::string* rest) {
  std::string buf;
  const double deadline = NowSeconds() + timeout_s;
  auto died = [&](const std::string& what) {
    return Status::Unavailable(fmt::format("launch: the coordinator {}; its stderr ({}):\n{}", what,
                                           stderr_path, TailLines(stderr_path, 20)));
  };
  while (true) {
    const size_t nl = buf.find('\n');
    if (nl != std::string::npos) {
      std::string addr = buf.substr(0, nl);
      *rest = buf.substr(nl + 1);
      while (!addr.empty() && (addr.back() == '\r' || addr.back() == ' ')) addr.pop_back();
      if (addr.find(':') == std::string::npos)
        return died(fmt::format("printed '{}' instead of its host:port", addr));
      return addr;
    }
    if (StopSignal() != 0) return Status::Internal("launch: interrupted");
    const double left = deadline - NowSeconds();
    if (left <= 0) return died(fmt::format("printed no address within {:.0f} s", timeout_s));
    struct pollfd p {
      fd, POLLIN, 0
    };
    const int r = ::poll(&p, 1, int(std::min(left, 0.5) * 1000) + 1);
    if (r < 0 && errno != EINTR) return Status::Internal("launch: poll: " + ErrnoText(errno));
    if (r > 0) {
      char tmp[4096];
      const ssize_t n = ::read(fd, tmp, sizeof(tmp));
      if (n > 0) {
        buf.append(tmp, size_t(n));
        continue;
      }
      if (n == 0) {  // EOF: it closed stdout or exited
        for (int i = 0; i < 40 && Poll(coordinator); ++i) ::usleep(50 * 1000);
        return died(coordinator.running ? "closed its stdout before printing its address"
                                        : "exited (" + coordinator.how_it_ended() +
                                              ") before printing its address");
      }
    }
    if (!Poll(coordinator))
      return died("exited (" + coordinator.how_it_ended() + ") before printing its address");
  }
}

// The world's run. Returns the process exit code; errors before any child runs are a Status.
StatusOr<int> Launch(const LaunchArgs& a) {
  ATOLL_ASSIGN_OR_RETURN(const LaunchPlan plan, PlanLaunch(a));
  if (a.emit == "slurm") {
    ATOLL_ASSIGN_OR_RETURN(const std::string submit, EmitSlurm(plan));
    std::printf("%s\n", submit.c_str());
    if (!a.quiet)
      std::fprintf(stderr,
                   "launch: wrote %s/slurm/: coordinator.sbatch and site-0..%d.sbatch (%s); "
                   "submit them all with %s\n",
                   plan.dir.c_str(), plan.sites - 1,
                   a.insecure ? "insecure" : ("certificates in " + plan.certs).c_str(),
                   submit.c_str());
    return 0;
  }
  const RunConfig& cfg = plan.cfg;
  const int sites = plan.sites, ranks = plan.ranks;
  const std::string& dir = plan.dir;

  // Each site's mpirun gets its own OpenMPI session directory: several mpiruns starting at once
  // share /tmp/ompi.HOST.UID and, rarely, one fails to make its part of it ("orte_session_dir
  // failed", seen once in ~20 launches). Removed when launch returns.
  struct TempDir {
    std::string path;
    ~TempDir() {
      std::error_code ec;
      if (!path.empty()) std::filesystem::remove_all(path, ec);
    }
  } mpi_tmp;
  {
    // Under the user's own Open MPI session base when there is one we can write, else TMPDIR.
    auto env = [](const char* name) -> std::string {
      const char* v = std::getenv(name);
      return v != nullptr ? v : "";
    };
    std::vector<std::string> bases;
    if (!env("OMPI_MCA_orte_tmpdir_base").empty())
      bases.push_back(env("OMPI_MCA_orte_tmpdir_base"));
    bases.push_back(env("TMPDIR").empty() ? "/tmp" : env("TMPDIR"));
    std::string tmpl;
    for (const std::string& base : bases) {
      tmpl = base + "/atoll-mpi-XXXXXX";
      if (::mkdtemp(tmpl.data()) != nullptr) {
        mpi_tmp.path = tmpl;
        break;
      }
    }
    if (mpi_tmp.path.empty())
      return Status::IoError(fmt::format("launch: cannot make a temporary directory {}: {}", tmpl,
                                         std::strerror(errno)));
  }

  InstallStopHandlers();
  LiveView view(dir, cfg, a.quiet);

  // The coordinator, and again (at the same address, from its state in DIR) when it dies while
  // the sites run.
  Child coordinator{.name = "the coordinator", .log = dir + "/coordinator.stderr"};
  int coord_out = -1;
  std::string coord_rest;
  // wait: until it prints its address (the first start); a restart does not wait (the watch
  // loop goes on: its stdout is drained there, and a start that failed is seen as its end).
  auto start_coordinator = [&](const std::string& listen, bool wait) -> StatusOr<std::string> {
    const std::vector<std::string> argv = plan.CoordinatorArgv(listen);
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0)
      return Status::IoError("launch: pipe: " + ErrnoText(errno));
    auto err_fd = OpenLog(coordinator.log);
    if (!err_fd.ok()) {
      ::close(pipe_fds[0]);
      ::close(pipe_fds[1]);
      return err_fd.status();
    }
    auto pid = Spawn(argv, plan.env, pipe_fds[1], *err_fd);
    ::close(pipe_fds[1]);
    ::close(*err_fd);
    if (!pid.ok()) {
      ::close(pipe_fds[0]);
      return pid.status();
    }
    coordinator.pid = *pid;
    coordinator.running = true;
    if (coord_out >= 0) ::close(coord_out);
    coord_out = pipe_fds[0];
    coord_rest.clear();
    if (!wait) return listen;
    return ReadAddress(coord_out, coordinator, coordinator.log, 30.0, &coord_rest);
  };
  auto address = start_coordinator("127.0.0.1:0", true);
  if (!address.ok()) {
    std::vector<Child*> all = {&coordinator};
    StopAll(all, 5.0);
    if (coord_out >= 0) ::close(coord_out);
    if (StopSignal() != 0) return StopSignal() == SIGINT ? 130 : 128 + StopSignal();
    return address.status();
  }
  // Anything else the coordinator prints on stdout joins its stderr file.
  const int coord_extra = ::open(coordinator.log.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  auto drain_coordinator = [&](int timeout_ms) {
    if (coord_out < 0) {
      if (timeout_ms > 0) ::usleep(useconds_t(timeout_ms) * 1000);
      return;
    }
    struct pollfd p {
      coord_out, POLLIN, 0
    };
    if (::poll(&p, 1, timeout_ms) <= 0) return;
    char tmp[4096];
    const ssize_t n = ::read(coord_out, tmp, sizeof(tmp));
    if (n > 0 && coord_extra >= 0) {
      [[maybe_unused]] ssize_t w = ::write(coord_extra, tmp, size_t(n));
    } else if (n == 0) {
      ::close(coord_out);
      coord_out = -1;
    }
  };
  if (!coord_rest.empty() && coord_extra >= 0) {
    [[maybe_unused]] ssize_t w = ::write(coord_extra, coord_rest.data(), coord_rest.size());
  }
  if (!a.quiet) {
    std::fprintf(
        stderr, "launch: coordinator at %s (%s); %d sites x %d rank%s under %s; logs in %s\n",
        address->c_str(), a.insecure ? "insecure" : ("certificates in " + plan.certs).c_str(),
        sites, ranks, ranks == 1 ? "" : "s", plan.mpirun.c_str(), dir.c_str());
  }

  // Chaos: what it kills, when.
  std::unique_ptr<ChaosMonkey> monkey;
  if (a.chaos >= 0)
    monkey = std::make_unique<ChaosMonkey>(plan.chaos, dir, plan.config_path, sites);

  // The sites.
  std::deque<Child> site_children;
  std::vector<Child*> all = {&coordinator};
  auto fail_start = [&](const Status& s) -> StatusOr<int> {
    StopAll(all, 5.0);
    if (coord_out >= 0) ::close(coord_out);
    return s;
  };
  std::vector<int> restarts(size_t(sites), 0);  // new processes started for each site
  // Site s's mpirun; with rejoin, a new process that takes over the lost site (`train
  // --rejoin`, its output in site-N/rejoin.log), without the fault injection.
  auto start_site = [&](int s, bool rejoin) -> Status {
    const std::string site_dir = fmt::format("{}/site-{}", dir, s);
    Child& c = site_children[size_t(s)];
    c = Child{};
    c.name = fmt::format("site {}", s);
    // The first new process's output in rejoin.log, a later one's in rejoin-N.log (N = 2, ...).
    const int again = rejoin ? restarts[size_t(s)] : 0;
    c.log = site_dir + (!rejoin      ? "/train.log"
                        : again <= 1 ? "/rejoin.log"
                                     : fmt::format("/rejoin-{}.log", again));
    const std::vector<std::string> argv = plan.SiteArgv(s, *address, rejoin);
    ATOLL_ASSIGN_OR_RETURN(const int fd, OpenLog(c.log));
    // Each mpirun its own session directory, always: mpiruns starting and ending side by side in
    // one directory race on it ("ompi.HOST.UID: File exists"), and a site dies before it starts.
    const std::string site_tmp = fmt::format("{}/site-{}-{}", mpi_tmp.path, s, again);
    if (::mkdir(site_tmp.c_str(), 0700) != 0 && errno != EEXIST)
      return Status::IoError(fmt::format("launch: cannot make {}: {}", site_tmp, ErrnoText(errno)));
    std::vector<std::string> site_env = plan.env;
    std::erase_if(site_env,
                  [](const std::string& e) { return e.starts_with("OMPI_MCA_orte_tmpdir_base="); });
    site_env.push_back("OMPI_MCA_orte_tmpdir_base=" + site_tmp);
    auto pid = Spawn(argv, site_env, fd, fd);
    ::close(fd);
    ATOLL_RETURN_IF_ERROR(pid.status());
    c.pid = *pid;
    c.running = true;
    return Status::Ok();
  };
  for (int s = 0; s < sites; ++s) {
    site_children.emplace_back();
    if (Status st = start_site(s, false); !st.ok()) return fail_start(st);
    all.push_back(&site_children.back());
  }

  // Watch: every 0.5 s reap the children and redraw. A site may end badly and the others go on,
  // any site (the lowest live one validates and writes the checkpoints; with sync the live ones
  // take over its micro-batches), which --rejoin can start again.
  const Child* failed = nullptr;
  const bool sync = cfg.world.strategy == "sync";
  std::vector<int> lost;
  const bool rejoin = a.rejoin || a.chaos >= 0;
  const int max_restarts = a.chaos >= 0 ? a.chaos_kills : 1;
  int coordinator_restarts = 0;
  while (true) {
    drain_coordinator(100);
    if (StopSignal() != 0) break;
    bool sites_done = true;
    for (int s = 0; s < sites; ++s) {
      Child& c = site_children[size_t(s)];
      const bool was_running = c.running;
      Poll(c);
      if (was_running && !c.running && !c.exited_ok()) {
        // sync takes back a site that crashed (a signal, or the fault injection's exit 3; under
        // mpirun, 128 + the signal that ended one of its ranks), not one that stopped with an
        // error (a fault it found, the world's own error on every site).
        // Never one refused with exit 2 (bad input; a rejoin once the run is over).
        const int code = WIFEXITED(c.wait_status) ? WEXITSTATUS(c.wait_status) : -1;
        const bool crashed = code != 2 && (!sync || code == -1 || code == 3 || code > 128);
        const bool restart = rejoin && crashed && restarts[size_t(s)] < max_restarts;
        if (!SiteRegistered(dir + "/coordinator.log", s)) {
          // It never joined the world: the others would wait for it until their timeouts.
          if (failed == nullptr) failed = &c;
        } else if (int(lost.size()) + 1 < sites) {
          lost.push_back(s);
          view.MarkLost(s);
          view.Interrupt();
          std::fprintf(stderr, "launch: site %d ended (%s); the world goes on without it%s\n", s,
                       c.how_it_ended().c_str(),
                       restart ? "; starting a new process to take it over (--rejoin)" : "");
          if (restart) {
            ++restarts[size_t(s)];
            if (Status st = start_site(s, true); !st.ok()) {
              std::fprintf(stderr, "launch: site %d cannot be started again: %s\n", s,
                           st.ToString().c_str());
            } else {
              std::erase(lost, s);
              view.MarkBack(s);
            }
          }
        } else if (failed == nullptr) {
          failed = &c;
        }
      }
      sites_done &= !c.running;
    }
    if (failed == nullptr && !Poll(coordinator) && !sites_done) {
      // The sites keep retrying it (up to their timeouts): start it again where it was, from its
      // durable state (membership, rounds, the parameter server's log and snapshot).
      // A start that fails (its port taken meanwhile, say) is tried again at the next tick.
      if (coordinator_restarts++ < kCoordinatorRestarts + (a.chaos >= 0 ? a.chaos_kills : 0)) {
        std::fprintf(stderr, "launch: the coordinator ended (%s); starting it again at %s\n",
                     coordinator.how_it_ended().c_str(), address->c_str());
        if (auto again = start_coordinator(*address, false); !again.ok()) {
          std::fprintf(stderr,
                       "launch: the coordinator cannot be started again (%s); trying again\n",
                       again.status().ToString().c_str());
          std::vector<Child*> c = {&coordinator};
          StopAll(c, 1.0);
        } else if (!coord_rest.empty() && coord_extra >= 0) {
          [[maybe_unused]] ssize_t w = ::write(coord_extra, coord_rest.data(), coord_rest.size());
        }
      } else {
        failed = &coordinator;
      }
    }
    if (failed != nullptr || sites_done) break;
    if (monkey) {
      std::vector<pid_t> pids;
      std::vector<int64_t> steps;
      for (int s = 0; s < sites; ++s) {
        const Child& c = site_children[size_t(s)];
        pids.push_back(c.running ? c.pid : -1);
        const SiteRow row = ReadSiteRow(fmt::format("{}/site-{}/metrics.jsonl", dir, s));
        steps.push_back(row.has ? row.step : -1);
      }
      monkey->Tick(pids, coordinator.running ? coordinator.pid : -1, steps);
    }
    view.Update(false);
  }
  if (monkey) {
    view.Interrupt();
    std::fprintf(stderr, "%s", monkey->Finish().c_str());
  }

  if (StopSignal() != 0) {
    view.Finish();
    std::fprintf(stderr, "launch: %s; stopping the sites and the coordinator\n",
                 StopSignal() == SIGINT ? "interrupted" : strsignal(StopSignal()));
    StopAll(all, 5.0);
    if (coord_out >= 0) ::close(coord_out);
    return StopSignal() == SIGINT ? 130 : 128 + StopSignal();
  }
  if (failed != nullptr) {
    view.Finish();
    // Stop the rest first: they would wait for the failed one until their timeouts.
    StopAll(all, 5.0);
    if (coord_out >= 0) ::close(coord_out);
    std::fprintf(stderr, "launch: %s failed (%s); the others were stopped. Last lines of %s:\n%s",
                 failed->name.c_str(), failed->how_it_ended().c_str(), failed->log.c_str(),
                 TailLines(failed->log, 20).c_str());
    ReportOnStderr(dir);
    return 1;
  }
  // Every site is done: stop the coordinator.
  view.Finish();
  StopAll(all, 5.0);
  if (coord_out >= 0) ::close(coord_out);
  if (coord_extra >= 0) ::close(coord_extra);
  const std::string checkpoint = dir + "/checkpoint";
  const bool checkpointed = cfg.train.checkpoint_every >= 0;  // -1: none asked for
  if (checkpointed && !FileExists(checkpoint)) {
    std::fprintf(stderr, "launch: the sites finished but %s was not written; site 0's log:\n%s",
                 checkpoint.c_str(), TailLines(site_children.front().log, 20).c_str());
    return 1;
  }
  if (!lost.empty()) {
    std::string names;
    for (int s : lost) names += fmt::format("{}{}", names.empty() ? "" : ", ", s);
    std::fprintf(stderr, "launch: finished without site%s %s (lost during the run)\n",
                 lost.size() == 1 ? "" : "s", names.c_str());
  }
  ReportOnStderr(dir);
  if (checkpointed) {
    std::printf("%s\n", checkpoint.c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

void AddLaunchCommand(CLI::App& app) {
  auto args = std::make_shared<LaunchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "launch", "Run a whole world on this machine: the coordinator and every site's mpirun");
  cmd->footer(
      "Starts `atoll coordinator` and, per site, `mpirun -n world.ranks_per_site atoll train\n"
      "--site N`, with the WAN links of [world.link] emulated inside the transport, and shows one\n"
      "live view (redrawn in place on a terminal, a line every 5 s otherwise). tokens/s is each\n"
      "site's share of the global batch; wan ms the leader's WAN all-reduce time in the last "
      "step.\n"
      "Exit status: 0 when every site finishes (the final checkpoint's path is printed on "
      "stdout),\n"
      "1 when a site or the coordinator fails (the others are stopped and the failed one's log\n"
      "tail is shown), 2 for a bad config, 130 on Ctrl-C (the children are stopped first).\n"
      "The world goes on when a site is lost (the view marks it; the exit status is 0 if the\n"
      "rest finish), any site: the lowest live one validates and writes the checkpoints; with\n"
      "sync the live ones take over its micro-batches, so the batch does not change (fewer\n"
      "live sites than world.quorum stop the run). With --rejoin a new process takes it over and "
      "the world is whole again (sync:\n"
      "from a live site's state at a step boundary, bitwise with parallel.reproducible).\n"
      "Their view also shows what sync would have sent for the same progress.\n"
      "Output layout (DIR = --out):\n"
      "  DIR/config.toml              the effective config every site trains with\n"
      "  DIR/certs/                   CA, party certificates and token (unless "
      "--certs/--insecure)\n"
      "  DIR/coordinator.log          the coordinator's durable log (membership, rounds)\n"
      "  DIR/ops.jsonl                async: the parameter server's operation log (atoll replay)\n"
      "  DIR/coordinator.stderr       its console output\n"
      "  DIR/site-N/metrics.jsonl     site N's steps (with \"site\", \"wan_ms\", "
      "\"wan_bytes_sent\")\n"
      "  DIR/site-N/train.log         site N's mpirun output\n"
      "  DIR/checkpoint               the final checkpoint (the lowest live site's; none\n"
      "                               with train.checkpoint_every = -1)\n"
      "Environment: mpirun from PATH (or ATOLL_MPIRUN); OMP_NUM_THREADS defaults to\n"
      "cores / (sites * ranks_per_site); OpenMPI runs as root, oversubscribed, over shared "
      "memory.\n"
      "Example:\n"
      "  atoll launch --config configs/world-demo.toml --out runs/world\n"
      "  atoll launch --config configs/world-demo.toml --set world.link.latency_ms=10 \\\n"
      "      --out runs/world-near --insecure\n"
      "  atoll launch --config configs/world-demo.toml --out /shared/runs/w --emit slurm\n"
      "      (then /shared/runs/w/slurm/submit.sh on the cluster: DIR must be on a filesystem\n"
      "      every node sees)");
  cmd->add_option("--config", args->config, "TOML config file with world.sites >= 2")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", args->sets, "Override a config key: section.key=value (repeatable)");
  cmd->add_option("--out", args->out, "Run directory (DIR)")->required();
  auto* certs = cmd->add_option("--certs", args->certs,
                                "Certificates from `atoll certs` (default: make DIR/certs)")
                    ->check(CLI::ExistingDirectory);
  auto* insecure =
      cmd->add_flag("--insecure", args->insecure, "No TLS and no token (a trusted machine only)");
  certs->excludes(insecure);
  cmd->add_flag("--quiet,-q", args->quiet, "No live view (errors and the checkpoint path only)");
  cmd->add_option("--fail-site", args->fail_sites,
                  "Fault injection: SITE@STEP makes that site's leader (SITE.RANK@STEP: that "
                  "rank of it) die abruptly after the step (repeatable); the site's job ends and "
                  "the world goes on without it");
  cmd->add_option("--slow-site", args->slow_sites,
                  "SITE:FACTOR: that site's passes take FACTOR times as long (it sleeps for the "
                  "difference): a slower datacenter, for world.balance (repeatable)");
  cmd->add_flag("--rejoin", args->rejoin,
                "when a site is lost (a crash, or --fail-site), start a new process that takes it "
                "over, once per site (`atoll train --rejoin`; output in DIR/site-N/rejoin.log)");
  cmd->add_option("--chaos", args->chaos,
                  "Chaos: kill (SIGKILL) --chaos-kills processes drawn from SEED (site leaders, "
                  "other ranks, the coordinator) at steps drawn from it, one at a time after the "
                  "world recovered from the last; implies --rejoin (up to that many per site). "
                  "Writes DIR/chaos.jsonl and a table of what each cost");
  cmd->add_option("--chaos-kills", args->chaos_kills, "Kills with --chaos (default 3)");
  cmd->add_option("--emit", args->emit,
                  "slurm: write DIR/slurm/ (a batch script for the coordinator and one per site, "
                  "and submit.sh) instead of running the world here; the scripts are bash and "
                  "also run outside Slurm")
      ->check(CLI::IsMember({"slurm"}));
  cmd->add_option("--resume", args->resume,
                  "Every site resumes from this checkpoint (`atoll train --resume`; sync)");
  cmd->callback([args] {
    auto rc = Launch(*args);
    ExitIfError(rc.status());
    std::fflush(stdout);
    std::fflush(stderr);
    if (*rc != 0) std::exit(*rc);
  });
}

}  // namespace atl::cli
