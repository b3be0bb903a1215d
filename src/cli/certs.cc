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
  std::string issue, ca;  // one more party's certificate, signed by the CA in `ca`
};

Status RunCerts(const CertsArgs& a) {
  if (!a.issue.empty() || !a.ca.empty()) {
    if (a.issue.empty() || a.ca.empty() || a.sites != 0)
      return Status::InvalidArgument(
          "certs: --issue PARTY needs --ca DIR (and no --sites): e.g. atoll certs --ca certs-ca "
          "--issue site-3 --out site3-certs");
    ATOLL_RETURN_IF_ERROR(IssueCert(a.ca, a.issue, a.out, a.force));
    LogInfo("certs: wrote {}/{}.pem/.key, ca.pem and token (signed by {}; its key stays there)",
            a.out, a.issue, a.ca);
    std::printf("%s\n", a.out.c_str());
    std::fflush(stdout);
    return Status::Ok();
  }
  if (a.sites < 1)
    return Status::InvalidArgument("certs: --sites N is needed (or --issue PARTY --ca DIR)");
  ATOLL_RETURN_IF_ERROR(MakeCerts(a.out, a.sites, a.force));
  LogInfo(
      "certs: wrote {}/ca.pem, coordinator.pem/.key, site-0..{}.pem/.key and token; give "
      "each party ca.pem, token and its own NAME.pem/NAME.key ({}, with the CA's key, stays "
      "here)",
      a.out, a.sites - 1, DefaultCaDir(a.out));
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
      "Writes OUT/ca.pem, OUT/token, OUT/coordinator.pem/.key and OUT/site-N.pem/.key for N in\n"
      "[0, SITES), and the authority beside it in OUT-ca (ca.pem, ca.key, token): EC P-256 keys,\n"
      "each certificate naming its party (CN and DNS \"coordinator\" or \"site-N\": a client\n"
      "checks the server's, a server the caller's), valid 10 years; keys and token readable by\n"
      "the owner only. Refuses a non-empty OUT unless --force. Give each party ca.pem, token and\n"
      "its own NAME.pem/.key; OUT-ca stays on this machine.\n"
      "--issue PARTY --ca OUT-ca --out DIR signs one more party's certificate (a site on\n"
      "another host, a replacement) into DIR, without the CA's key.\n"
      "Example:\n"
      "  atoll certs --out certs --sites 2\n"
      "  atoll coordinator --listen 0.0.0.0:7070 --sites 2 --state runs/coord --certs certs\n"
      "  atoll certs --ca certs-ca --issue site-2 --out site2-certs");
  cmd->add_option("--out", args->out, "Directory to create (or an empty one)")->required();
  cmd->add_option("--sites", args->sites, "Number of sites")->check(CLI::Range(1, 100000));
  cmd->add_option("--issue", args->issue, "One party's certificate: coordinator or site-N");
  cmd->add_option("--ca", args->ca, "With --issue: the CA directory (OUT-ca of `atoll certs`)");
  cmd->add_flag("--force", args->force, "Replace the certificates in a non-empty directory");
  cmd->callback([args] { ExitIfError(RunCerts(*args)); });
}

}  // namespace atl::cli
