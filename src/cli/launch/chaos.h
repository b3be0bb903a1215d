// `atoll launch --chaos SEED`: kills (SIGKILL) processes of the world at steps drawn from the
// seed: a site's leader, another rank of a site (ranks_per_site > 1), or the coordinator. One at a
// time: a kill is due once the furthest site has logged its step AND the world recovered from the
// kill before (every site's mpirun runs and every site logged a step after that kill). Launch
// restarts what died (--rejoin for sites, the coordinator at its address), so what each kill
// costs is what the run's failure handling costs; ChaosMonkey records it (DIR/chaos.jsonl, one
// line per kill, and a table at the end):
//   detect_s    the kill until launch saw the process (the site's mpirun, the coordinator) end
//   recover_s   the kill until every site logged a step after it (the world whole again)
//   back_at     the first step the killed site logged after it (-1: not back)
//
// Thread-safety: one thread (launch's) uses a ChaosMonkey.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace atl::cli {

struct ChaosKill {
  enum class Kind { kLeader, kRank, kCoordinator };
  Kind kind = Kind::kLeader;
  int site = -1, rank = 0;  // kLeader: rank 0; kCoordinator: site -1
  int64_t step = 0;         // due once the furthest site logged this step
};

// `kills` kills at steps spread over [2, steps - 4] (at least 3 apart), targets drawn from the
// seed. kInvalidArgument when the run is too short for them.
StatusOr<std::vector<ChaosKill>> PlanChaos(uint64_t seed, int kills, int sites, int ranks,
                                           int64_t steps);
// "site 1's leader", "rank 1 of site 2", "the coordinator".
std::string Describe(const ChaosKill& k);

// The pid of rank `rank` of site `site` of the world whose config is `config_path` (its
// `atoll train` process, found in /proc by its arguments and OMPI_COMM_WORLD_RANK, a descendant
// of the site's mpirun `mpirun`).
std::optional<pid_t> FindRankPid(const std::string& config_path, int site, int rank, pid_t mpirun);

class ChaosMonkey {
 public:
  ChaosMonkey(std::vector<ChaosKill> plan, std::string dir, std::string config_path, int sites);

  // From launch's watch loop: every site's mpirun pid (-1: not running), the coordinator's pid,
  // and every site's latest logged step (-1: none). Kills what is due; notes what recovered.
  void Tick(const std::vector<pid_t>& site_pids, pid_t coordinator_pid,
            const std::vector<int64_t>& steps);
  // At the end of the run: writes a kill the world did not recover from (recover_s -1); the
  // table of kills.
  std::string Finish();

 private:
  struct Event {
    ChaosKill kill;
    double t_kill = 0, detect_s = -1, recover_s = -1;
    pid_t watched = -1;          // the site's mpirun or the coordinator when killed
    std::vector<int64_t> steps;  // every site's step when killed
    int64_t back_at = -1;        // the killed site's first step after it
    bool done = false;           // recovered and written
  };
  void Write(const Event& e) const;

  std::vector<ChaosKill> plan_;
  std::string dir_, config_path_;
  int sites_;
  size_t next_ = 0;
  std::vector<Event> events_;
};

}  // namespace atl::cli
