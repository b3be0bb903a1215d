// atoll certs: a CA, certificates for the coordinator and every site, and the shared token
// (world/certs.h).
#include "world/certs.h"

#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/log.h"
#include "core/status.h"

namespace atl::cli {

namespace {

struct CertsArgs {
  std::string out;
  int sites = 0;
  bool force = false;
};

Status RunCerts(const CertsArgs& a) {
  ATOLL_RETURN_IF_ERROR(MakeCerts(a.out, a.sites, a.force));
  LogInfo(
      "certs: wrote {}/ca.pem, coordinator.pem/.key, site-0..{}.pem/.key and token; give "
      "each party ca.pem, token and its own NAME.pem/NAME.key (ca.key stays here)",
      a.out, a.sites - 1);
  std::printf("%s\n", a.out.c_str());
  std::fflush(stdout);
  return Status::Ok();
}

}  // namespace

void AddCertsCommand(CLI::App& app) {
  auto args = std::make_shared<CertsArgs>();
  CLI::App* cmd = app.add_subcommand(
      "certs", "Make a CA, certificates for the coordinator and each site, and a shared token");
  cmd->footer(
      "Writes OUT/ca.pem (+ ca.key), OUT/coordinator.pem/.key, OUT/site-N.pem/.key for N in\n"
      "[0, SITES) and OUT/token (EC P-256 keys, certificates for the name \"atoll\", valid 10\n"
      "years; keys and token readable by the owner only). Refuses a non-empty OUT unless --force.\n"
      "Example:\n"
      "  atoll certs --out certs --sites 2\n"
      "  atoll coordinator --listen 0.0.0.0:7070 --sites 2 --state runs/coord --certs certs");
  cmd->add_option("--out", args->out, "Directory to create (or an empty one)")->required();
  cmd->add_option("--sites", args->sites, "Number of sites")
      ->required()
      ->check(CLI::Range(1, 100000));
  cmd->add_flag("--force", args->force, "Replace the certificates in a non-empty directory");
  cmd->callback([args] { ExitIfError(RunCerts(*args)); });
}

}  // namespace atl::cli
