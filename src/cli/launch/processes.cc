// `atoll launch`'s children (cli/launch/processes.h).
#include "cli/launch/processes.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/file.h"
#include "core/log.h"

extern char** environ;

namespace atl::cli {

namespace {

// The signal that asked launch to stop (SIGINT, SIGTERM, SIGHUP), 0 while none did.
volatile sig_atomic_t g_stop_signal = 0;

void OnStopSignal(int sig) { g_stop_signal = sig; }

// Sends `sig` to each running child's process group (mpirun and its ranks, unless they moved).
void SignalAll(std::vector<Child*>& children, int sig) {
  for (Child* c : children) {
    if (c->running && ::kill(-c->pid, sig) != 0) ::kill(c->pid, sig);
  }
}

}  // namespace

int StopSignal() { return g_stop_signal; }

void InstallStopHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a signal wakes poll() / nanosleep()
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
}

std::string ErrnoText(int err) { return std::strerror(err); }

bool Child::exited_ok() const {
  return !running && WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0;
}

std::string Child::how_it_ended() const {
  if (WIFEXITED(wait_status)) return fmt::format("exit status {}", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const char* name = strsignal(WTERMSIG(wait_status));
    return fmt::format("killed by signal {} ({})", WTERMSIG(wait_status), name ? name : "?");
  }
  return "ended";
}

// The absolute path of an executable named `name` on PATH (or `name` itself if it has a slash).
std::optional<std::string> FindOnPath(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (::access(name.c_str(), X_OK) == 0) return name;
    return std::nullopt;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + name;
    struct stat st;
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    start = end + 1;
  }
  return std::nullopt;
}

// The environment of the children: ours, with `defaults` added where not already set.
std::vector<std::string> ChildEnvironment(
    const std::vector<std::pair<std::string, std::string>>& defaults) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
  for (const auto& [key, value] : defaults) {
    if (std::getenv(key.c_str()) == nullptr) env.push_back(key + "=" + value);
  }
  return env;
}

// Starts `argv` (argv[0] an absolute path) in its own process group with stdin from /dev/null and
// stdout / stderr on the given descriptors; it gets SIGTERM if launch dies.
StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                      int stdout_fd, int stderr_fd) {
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull < 0) return Status::IoError("launch: cannot open /dev/null: " + ErrnoText(errno));
  int err_pipe[2];  // the child writes exec's errno here; closed on a successful exec
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(devnull);
    return Status::IoError("launch: pipe: " + ErrnoText(errno));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(devnull);
    ::close(err_pipe[0]);
    ::close(err_pipe[1]);
    return Status::Internal("launch: fork: " + ErrnoText(err));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);  // launch died before prctl
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(devnull, 0);
    ::dup2(stdout_fd, 1);
    ::dup2(stderr_fd, 2);
    ::execve(cargv[0], cargv.data(), cenv.data());
    const int err = errno;
    [[maybe_unused]] ssize_t n = ::write(err_pipe[1], &err, sizeof(err));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so that kill(-pid) works whichever runs first
  ::close(devnull);
  ::close(err_pipe[1]);
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(err_pipe[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  ::close(err_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof(child_errno))) {
    ::waitpid(pid, nullptr, 0);
    return Status::Internal(
        fmt::format("launch: cannot run {}: {}", argv[0], ErrnoText(child_errno)));
  }
  return pid;
}

// Opens `path` for a child's output (truncated).
StatusOr<int> OpenLog(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return Status::IoError(fmt::format("launch: cannot create {}: {}", path, ErrnoText(errno)));
  return fd;
}

// Reaps `c` if it has exited. Returns true when it is (still) running.
bool Poll(Child& c) {
  if (!c.running) return false;
  int st = 0;
  const pid_t r = ::waitpid(c.pid, &st, WNOHANG);
  if (r == c.pid) {
    c.running = false;
    c.wait_status = st;
  } else if (r < 0 && errno == ECHILD) {
    c.running = false;
  }
  return c.running;
}

// SIGTERM to every running child, then SIGKILL to those still running after `grace_s` seconds.
void StopAll(std::vector<Child*> children, double grace_s) {
  SignalAll(children, SIGTERM);
  const double deadline = NowSeconds() + grace_s;
  while (true) {
    bool any = false;
    for (Child* c : children) any |= Poll(*c);
    if (!any) return;
    if (NowSeconds() >= deadline) break;
    ::usleep(50 * 1000);
  }
  SignalAll(children, SIGKILL);
  for (Child* c : children) {
    if (!c->running) continue;
    int st = 0;
    while (::waitpid(c->pid, &st, 0) < 0 && errno == EINTR) {
    }
    c->running = false;
    c->wait_status = st;
  }
}

// The last `n` lines of a file.
std::string TailLines(const std::string& path, int n) {
  auto text = ReadFile(path);
  if (!text.ok()) return "  (" + text.status().ToString() + ")\n";
  const std::string& s = *text;
  size_t end = s.size();
  if (end > 0 && s[end - 1] == '\n') --end;
  size_t begin = end;
  int lines = 0;
  while (begin > 0) {
    if (s[begin - 1] == '\n' && ++lines == n) break;
    --begin;
  }
  std::string out;
  size_t pos = begin;
  while (pos < end) {
    size_t nl = s.find('\n', pos);
    if (nl == std::string::npos || nl > end) nl = end;
    out += "  | " + s.substr(pos, nl - pos) + "\n";
    pos = nl + 1;
  }
  if (out.empty()) out = "  (empty)\n";
  return out;
}

}  // namespace atl::cli
