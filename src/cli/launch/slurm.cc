// Slurm batch scripts for a launch plan (cli/launch/slurm.h).
#include "cli/launch/slurm.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/launch/processes.h"
#include "core/build_info.h"
#include "core/file.h"

namespace atl::cli {

namespace {

// Ports: any free one by default (the coordinator's is published in its address file, a site's
// advertised with the port it bound), so two runs on one node never collide; pinned with
// ATOLL_COORDINATOR_PORT / ATOLL_WAN_PORT where a firewall needs known ports.
constexpr int kDefaultPort = 0;
// The files of an earlier run in DIR that a fresh one must not read (as launch removes them).
constexpr const char* kStaleFiles =
    "coordinator.address coordinator.log coordinator.stdout ops.jsonl ps_params.bin";

// A bash word: single-quoted, with any ' closed, escaped and reopened.
std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string SecurityArgs(const LaunchPlan& p) {
  return p.certs.empty() ? "--insecure" : "--certs " + Quote(p.certs);
}

std::string Header(const LaunchPlan& p, const std::string& job, int tasks,
                   const std::string& what) {
  return fmt::format(
      "#!/bin/bash\n"
      "#SBATCH --job-name={job}\n"
      "#SBATCH --nodes=1\n"
      "#SBATCH --ntasks={tasks}\n"
      "#SBATCH --output={out}\n"
      "# {what}\n"
      "# Written by `atoll launch --emit slurm` (build {build}) for the run in {dir}.\n"
      "# Plain bash: it also runs outside Slurm. See cli/launch/slurm.h for the environment it "
      "reads.\n"
      "set -euo pipefail\n"
      "# Relative paths of the config (data.dir) are as where launch ran.\n"
      "cd {cwd}\n"
      "ATOLL=\"${{ATOLL:-{self}}}\"\n"
      "NODE=$(hostname -f 2>/dev/null || hostname)\n"
      "RUN={qdir}\n",
      fmt::arg("job", job), fmt::arg("tasks", tasks),
      fmt::arg("out", fmt::format("{}/slurm/{}.out", p.dir, job)), fmt::arg("what", what),
      fmt::arg("build", BuildId().substr(0, 16)), fmt::arg("dir", p.dir),
      fmt::arg("self", Quote(p.self)), fmt::arg("qdir", Quote(p.dir)),
      fmt::arg("cwd", Quote(std::filesystem::current_path().string())));
}

std::string CoordinatorScript(const LaunchPlan& p) {
  return Header(p, "atoll-coordinator", 1,
                "The coordinator: submit it first (DIR/slurm/submit.sh does); the sites wait for "
                "its address.") +
         fmt::format(
             "HOST=\"${{ATOLL_COORDINATOR_HOST:-$NODE}}\"\n"
             "PORT=\"${{ATOLL_COORDINATOR_PORT:-{port}}}\"\n"
             "SITES={sites}\n"
             "# A site that ended before this job started (it gave up waiting) counts as ended:\n"
             "# submit.sh clears the sites' exit_status files, this script does not.\n"
             "rm -f \"$RUN/coordinator.address\"\n"
             "# Its first stdout line is the address it listens on (the bound port for port 0).\n"
             ": >\"$RUN/coordinator.stdout\"\n"
             "\"$ATOLL\" coordinator --listen \"$HOST:$PORT\" --sites \"$SITES\" --state \"$RUN\" "
             "\\\n"
             "    --heartbeat-s {hb} --dead-after-beats {beats} {security} \\\n"
             "    >\"$RUN/coordinator.stdout\" 2>>\"$RUN/coordinator.stderr\" &\n"
             "COORD=$!\n"
             "trap 'kill $COORD 2>/dev/null || true; rm -f \"$RUN/coordinator.address\"' EXIT\n"
             "for ((i = 0; i < 60; i++)); do\n"
             "  [[ $(wc -l <\"$RUN/coordinator.stdout\") -ge 1 ]] && break\n"
             "  kill -0 $COORD 2>/dev/null || break\n"
             "  sleep 1\n"
             "done\n"
             "ADDR=$(head -n 1 \"$RUN/coordinator.stdout\")\n"
             "[[ -n \"$ADDR\" ]] || {{ echo \"coordinator: no address (see "
             "$RUN/coordinator.stderr)\" >&2; exit 1; }}\n"
             "echo \"$ADDR\" >\"$RUN/coordinator.address.tmp\"\n"
             "mv \"$RUN/coordinator.address.tmp\" \"$RUN/coordinator.address\"\n"
             "echo \"coordinator: listening on $ADDR\"\n"
             "# Runs until every site has ended (its script writes site-N/exit_status).\n"
             "while kill -0 $COORD 2>/dev/null; do\n"
             "  done_sites=0\n"
             "  for ((s = 0; s < SITES; s++)); do\n"
             "    [[ -f \"$RUN/site-$s/exit_status\" ]] && done_sites=$((done_sites + 1))\n"
             "  done\n"
             "  ((done_sites == SITES)) && break\n"
             "  sleep 1\n"
             "done\n"
             "kill -0 $COORD 2>/dev/null || {{ echo \"coordinator: exited early (see "
             "$RUN/coordinator.stderr)\" >&2; exit 1; }}\n"
             "echo \"coordinator: every site has ended\"\n",
             fmt::arg("port", kDefaultPort), fmt::arg("sites", p.sites),
             fmt::arg("hb", p.cfg.world.heartbeat_s),
             fmt::arg("beats", p.cfg.world.dead_after_beats),
             fmt::arg("security", SecurityArgs(p)));
}

std::string SiteScript(const LaunchPlan& p, int site) {
  std::string resume;
  if (!p.resume.empty()) resume = " --resume " + Quote(p.resume);
  return Header(p, fmt::format("atoll-site-{}", site), p.ranks,
                fmt::format("Site {} of {}: {} rank(s).", site, p.sites, p.ranks)) +
         fmt::format(
             "SITE={site}\n"
             "mkdir -p \"$RUN/site-$SITE\"\n"
             "# Whatever ends this script, the coordinator's job learns that this site has ended.\n"
             "trap 'echo $? >\"$RUN/site-$SITE/exit_status\"' EXIT\n"
             "TASKS=\"${{SLURM_NTASKS:-{ranks}}}\"\n"
             "WAN_HOST=\"${{ATOLL_WAN_HOST:-$NODE}}\"\n"
             "WAN_PORT=\"${{ATOLL_WAN_PORT:-{wan_port}}}\"\n"
             "# The coordinator's address, once its job has started.\n"
             "for ((i = 0; i < ${{ATOLL_WAIT_S:-3600}}; i++)); do\n"
             "  [[ -s \"$RUN/coordinator.address\" ]] && break\n"
             "  sleep 1\n"
             "done\n"
             "[[ -s \"$RUN/coordinator.address\" ]] || {{ echo \"site $SITE: no "
             "$RUN/coordinator.address (is the coordinator's job running?)\" >&2; exit 1; }}\n"
             "COORDINATOR=$(cat \"$RUN/coordinator.address\")\n"
             "echo \"site $SITE: coordinator at $COORDINATOR, $TASKS rank(s), WAN "
             "$WAN_HOST:$WAN_PORT\"\n"
             "\"${{ATOLL_MPIRUN:-mpirun}}\" -n \"$TASKS\" \"$ATOLL\" train --config "
             "\"$RUN/config.toml\" --site \"$SITE\" \\\n"
             "    --coordinator \"$COORDINATOR\" --wan-listen \"0.0.0.0:$WAN_PORT\" "
             "--wan-advertise \"$WAN_HOST:$WAN_PORT\" \\\n"
             "    {security} --out \"$RUN/site-$SITE\" --checkpoint-dir \"$RUN\" -q{resume}\n",
             fmt::arg("site", site), fmt::arg("ranks", p.ranks), fmt::arg("wan_port", kDefaultPort),
             fmt::arg("security", SecurityArgs(p)), fmt::arg("resume", resume));
}

Status WriteScript(const std::string& path, const std::string& text) {
  ATOLL_RETURN_IF_ERROR(WriteFileAtomic(path, text));
  if (::chmod(path.c_str(), 0755) != 0)
    return Status::IoError(fmt::format("{}: chmod: {}", path, ErrnoText(errno)));
  return Status::Ok();
}

}  // namespace

StatusOr<std::string> EmitSlurm(const LaunchPlan& p) {
  const std::string dir = p.dir + "/slurm";
  ATOLL_RETURN_IF_ERROR(MakeDirs(dir));
  // Paths go into #SBATCH lines and comments unquoted: refuse what would break them.
  for (const std::string& path : {p.dir, p.self, p.certs, p.resume})
    if (path.find_first_of("\n\r%") != std::string::npos)
      return Status::InvalidArgument(fmt::format(
          "launch --emit slurm: the path '{}' holds a newline or a '%' (a Slurm pattern): choose "
          "another",
          path));
  for (const char* f : {"coordinator.address", "coordinator.stdout"})
    ::unlink((p.dir + "/" + f).c_str());  // of an earlier run
  for (int s = 0; s < p.sites; ++s)
    ::unlink(fmt::format("{}/site-{}/exit_status", p.dir, s).c_str());
  ATOLL_RETURN_IF_ERROR(WriteScript(dir + "/coordinator.sbatch", CoordinatorScript(p)));
  std::string submit = fmt::format(
      "#!/bin/bash\n"
      "# Submits the world in {}: the coordinator, then every site (they wait for its address).\n"
      "set -euo pipefail\n"
      "cd {}\n"
      "# An earlier run's files: its address (the sites would dial it), its logs (replayed).\n"
      "(cd .. && rm -f {} site-*/exit_status)\n"
      "sbatch coordinator.sbatch\n",
      p.dir, Quote(dir), kStaleFiles);
  for (int s = 0; s < p.sites; ++s) {
    ATOLL_RETURN_IF_ERROR(WriteScript(fmt::format("{}/site-{}.sbatch", dir, s), SiteScript(p, s)));
    submit += fmt::format("sbatch site-{}.sbatch\n", s);
  }
  const std::string path = dir + "/submit.sh";
  ATOLL_RETURN_IF_ERROR(WriteScript(path, submit));
  return path;
}

}  // namespace atl::cli
