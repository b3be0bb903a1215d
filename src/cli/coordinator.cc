// atoll coordinator: membership, heartbeats and round barriers for a world of sites
// (world/coordinator.h).
#include "world/coordinator.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/log.h"
#include "core/status.h"
#include "world/security.h"

namespace atl::cli {

namespace {

struct CoordinatorArgs {
  std::string listen;
  int sites = 0;
  std::string state;
  std::string certs;
  bool insecure = false;
  double heartbeat_s = 1.0;
  int dead_after_beats = 3;
};

Status RunCoordinator(const CoordinatorArgs& a) {
  if (a.certs.empty() == !a.insecure)
    return Status::InvalidArgument(
        "coordinator: pass --certs DIR (made by `atoll certs`: mutual TLS + token) or "
        "--insecure (no TLS, no token: tests and trusted networks only)");
  CoordinatorOptions o;
  o.listen = a.listen;
  o.sites = a.sites;
  o.state_dir = a.state;
  o.heartbeat_s = a.heartbeat_s;
  o.dead_after_beats = a.dead_after_beats;
  if (a.insecure) {
    o.security.insecure = true;
  } else {
    ATOLL_ASSIGN_OR_RETURN(o.security, LoadSecurity(a.certs, "coordinator"));
  }
  // SIGINT / SIGTERM are blocked in every thread (gRPC's start after this) and taken here;
  // SIGUSR1 is how the coordinator says it stopped (its log cannot be written).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  o.on_failure = [] { ::kill(::getpid(), SIGUSR1); };
  ATOLL_ASSIGN_OR_RETURN(std::unique_ptr<Coordinator> c, Coordinator::Start(o));
  std::printf("%s\n", c->address().c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&signals, &sig);
  if (sig == SIGUSR1) {
    const Status why = c->failure();
    c->Shutdown();
    return Status::Internal(fmt::format(
        "coordinator: stopped because its log cannot be written: {}; the log in {} is intact: "
        "fix the disk and start the coordinator again on the same --state to resume",
        why.message(), a.state));
  }
  LogInfo("coordinator: {}; shutting down", strsignal(sig));
  c->Shutdown();
  const Membership m = c->membership();
  LogInfo("coordinator: stopped at epoch {} with {} of {} sites live; the log stays in {}", m.epoch,
          m.live(), a.sites, a.state);
  return Status::Ok();
}

}  // namespace

void AddCoordinatorCommand(CLI::App& app) {
  auto args = std::make_shared<CoordinatorArgs>();
  CLI::App* cmd = app.add_subcommand(
      "coordinator", "Run the coordinator of a world of sites (membership, heartbeats, rounds)");
  cmd->footer(
      "Prints the address it listens on (HOST:PORT, the bound port when PORT is 0) on stdout and\n"
      "runs until SIGINT or SIGTERM. Sites register with `atoll train --site S --coordinator\n"
      "HOST:PORT` and beat twice per --heartbeat-s; a site silent for --dead-after-beats\n"
      "intervals is declared dead. Every membership change and completed round is appended to\n"
      "STATE/coordinator.log (fsynced before any reply depends on it); restarted on the same\n"
      "--state, the coordinator resumes the world and sites reconnect. If the log cannot be\n"
      "written (disk full), it cuts the partial record off and exits 1 naming the error.\n"
      "Examples:\n"
      "  atoll certs --out certs --sites 2\n"
      "  atoll coordinator --listen 0.0.0.0:7070 --sites 2 --state runs/coord --certs certs\n"
      "  atoll coordinator --listen 127.0.0.1:0 --sites 2 --state /tmp/coord --insecure");
  cmd->add_option("--listen", args->listen, "HOST:PORT to listen on (PORT 0: any free port)")
      ->required();
  cmd->add_option("--sites", args->sites, "Number of sites in the world")
      ->required()
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--state", args->state,
                  "Directory for coordinator.log (created; reuse it to resume after a restart)")
      ->required();
  auto* certs = cmd->add_option("--certs", args->certs,
                                "Certificates directory (`atoll certs`): uses ca.pem, "
                                "coordinator.pem, coordinator.key and token")
                    ->check(CLI::ExistingDirectory);
  cmd->add_flag("--insecure", args->insecure,
                "No TLS and no token (tests and trusted networks only)")
      ->excludes(certs);
  cmd->add_option("--heartbeat-s", args->heartbeat_s,
                  "Heartbeat interval in seconds (sites beat twice per interval)")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 3600.0));
  cmd->add_option("--dead-after-beats", args->dead_after_beats,
                  "A site silent for this many intervals is declared dead (world.dead_after_beats)")
      ->capture_default_str()
      ->check(CLI::Range(2, 1000));
  cmd->callback([args] { ExitIfError(RunCoordinator(*args)); });
}

}  // namespace atl::cli
