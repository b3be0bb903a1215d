// `atoll launch`'s children: starting a program in its own process group with its output in a
// file, reaping it, stopping a set of them (SIGTERM, then SIGKILL after a grace period), and
// the signals that ask launch itself to stop.
//
// Every child runs in its own process group (a terminal's Ctrl-C reaches launch alone, which
// stops the children in order) and gets SIGTERM if launch dies (PR_SET_PDEATHSIG).
//
// Thread-safety: one thread (launch's) uses these.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace atl::cli {

// SIGINT, SIGTERM and SIGHUP are taken (not fatal) from now on; StopSignal() says which came.
void InstallStopHandlers();
int StopSignal();  // 0 while none did

std::string ErrnoText(int err);

// A child process: the coordinator or one site's mpirun.
struct Child {
  std::string name;  // "the coordinator", "site 1"
  std::string log;   // where its output goes (shown when it fails)
  pid_t pid = -1;
  bool running = false;
  int wait_status = 0;  // waitpid's status once it has exited

  bool exited_ok() const;
  std::string how_it_ended() const;  // "exit status 3", "killed by signal 9 (Killed)"
};

// The absolute path of an executable named `name` on PATH (or `name` itself if it has a slash).
std::optional<std::string> FindOnPath(const std::string& name);

// The environment of the children: ours, with `defaults` added where not already set.
std::vector<std::string> ChildEnvironment(
    const std::vector<std::pair<std::string, std::string>>& defaults);

// Starts `argv` (argv[0] an absolute path) in its own process group with stdin from /dev/null and
// stdout / stderr on the given descriptors; it gets SIGTERM if launch dies.
StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                      int stdout_fd, int stderr_fd);

// Opens `path` for a child's output (truncated).
StatusOr<int> OpenLog(const std::string& path);

// Reaps `c` if it has exited. Returns true when it is (still) running.
bool Poll(Child& c);

// SIGTERM to every running child's process group, then SIGKILL to those still running after
// `grace_s` seconds; returns when all are reaped.
void StopAll(std::vector<Child*> children, double grace_s);

// The last `n` lines of a file, each indented with "  | " (for showing a failed child's log).
std::string TailLines(const std::string& path, int n);

}  // namespace atl::cli
