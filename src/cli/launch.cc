// atoll launch: a whole world on this machine — the coordinator and every site's mpirun as child
// processes, one live view of their progress, and one exit status.
//
// Processes (docs: DESIGN.md "Processes"):
//   <self> coordinator --listen 127.0.0.1:0 --sites S --state DIR --heartbeat-s H
//   (--certs|--insecure)
//     prints its bound host:port as its first stdout line; its stderr goes to
//     DIR/coordinator.stderr.
//   mpirun -n K <self> train --config DIR/config.toml --site s --coordinator ADDR ... --out
//   DIR/site-s
//     one per site, stdout and stderr to DIR/site-s/train.log.
// Every child runs in its own process group (a terminal's Ctrl-C reaches launch alone, which stops
// the children in order) and gets SIGTERM if launch dies (PR_SET_PDEATHSIG).
//
// Exit status: 0 when every site exits 0 (the final checkpoint's path is printed on stdout); 1 when
// a site or the coordinator fails (the others are stopped; the failed one's log tail goes to
// stderr); 2 for a bad config or arguments; 130 on SIGINT (143 on SIGTERM).
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "core/file.h"
#include "core/log.h"
#include "core/status.h"
#include "train/config.h"
#include "train/metrics.h"
#include "world/certs.h"

extern char** environ;

namespace atl::cli {

namespace {

struct LaunchArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string out;
  std::string certs;
  bool insecure = false;
  bool quiet = false;
  std::vector<std::string> fail_sites;  // "SITE@STEP": fault injection
  bool rejoin = false;                  // a lost site's process is started again (--rejoin)
};

// The signal that asked launch to stop (SIGINT, SIGTERM, SIGHUP), 0 while none did.
volatile sig_atomic_t g_stop_signal = 0;

void OnStopSignal(int sig) { g_stop_signal = sig; }

void InstallStopHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a signal wakes poll() / nanosleep()
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
}

std::string ErrnoText(int err) { return std::strerror(err); }

// A child process: the coordinator or one site's mpirun.
struct Child {
  std::string name;  // "coordinator", "site 1"
  std::string log;   // where its output goes (shown when it fails)
  pid_t pid = -1;
  bool running = false;
  int wait_status = 0;  // waitpid's status once it has exited

  bool exited_ok() const {
    return !running && WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0;
  }
  std::string how_it_ended() const {
    if (WIFEXITED(wait_status)) return fmt::format("exit status {}", WEXITSTATUS(wait_status));
    if (WIFSIGNALED(wait_status)) {
      const char* name = strsignal(WTERMSIG(wait_status));
      return fmt::format("killed by signal {} ({})", WTERMSIG(wait_status), name ? name : "?");
    }
    return "ended";
  }
};

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

// Sends `sig` to each running child's process group (mpirun and its ranks, unless they moved).
void SignalAll(std::vector<Child*>& children, int sig) {
  for (Child* c : children) {
    if (c->running && ::kill(-c->pid, sig) != 0) ::kill(c->pid, sig);
  }
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

// The last complete line of a file (metrics.jsonl is appended a line at a time), or "".
std::string LastLine(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string buf;
  const off_t size = ::lseek(fd, 0, SEEK_END);
  if (size > 0) {
    const off_t want = std::min<off_t>(size, 8192);
    buf.resize(static_cast<size_t>(want));
    const ssize_t n = ::pread(fd, buf.data(), buf.size(), size - want);
    buf.resize(n > 0 ? static_cast<size_t>(n) : 0);
  }
  ::close(fd);
  const size_t end = buf.rfind('\n');
  if (end == std::string::npos) return "";
  const size_t begin = buf.rfind('\n', end == 0 ? 0 : end - 1);
  if (end == 0) return "";
  return begin == std::string::npos ? buf.substr(0, end) : buf.substr(begin + 1, end - begin - 1);
}

// One site's latest step, from its metrics.jsonl.
struct SiteRow {
  bool has = false;
  int64_t step = 0;
  double loss = 0, tokens_per_s = 0, step_ms = 0, wan_ms = 0;
  uint64_t wan_bytes = 0, sync_bytes = 0;
};

SiteRow ReadSiteRow(const std::string& metrics_path) {
  SiteRow r;
  const std::string line = LastLine(metrics_path);
  if (line.empty()) return r;
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return r;
  auto num = [&](const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
  };
  r.has = true;
  r.step = static_cast<int64_t>(num("step"));
  r.loss = num("loss");
  r.tokens_per_s = num("tokens_per_s");
  r.step_ms = num("step_ms");
  r.wan_ms = num("wan_ms");
  r.wan_bytes = static_cast<uint64_t>(num("wan_bytes_sent"));
  r.sync_bytes = static_cast<uint64_t>(num("sync_bytes_sent"));
  return r;
}

// The live view: one table of the sites (redrawn in place on a terminal) or a compact line now
// and then (a log file).
class LiveView {
 public:
  LiveView(const std::string& dir, const RunConfig& cfg, bool quiet)
      : dir_(dir),
        sites_(int(cfg.world.sites)),
        ranks_(int(cfg.world.ranks_per_site)),
        steps_(cfg.train.steps),
        quiet_(quiet),
        tty_(::isatty(::fileno(stderr)) != 0),
        start_s_(NowSeconds()) {}

  // Reads every site's latest metrics and draws (rate-limited; `force` draws now).
  void Update(bool force) {
    if (quiet_) return;
    const double now = NowSeconds();
    if (tty_) {
      if (!force && now - last_draw_s_ < 0.5) return;
      Draw(now);
    } else {
      if (!force && now - last_draw_s_ < 5.0) return;
      Line(now);
    }
    last_draw_s_ = now;
  }

  // Ends the in-place table (what follows goes below it).
  void Finish() {
    if (quiet_) return;
    Update(true);
    drawn_lines_ = 0;
  }

  // Before printing something else: nothing to do (the table is redrawn below it next time).
  void Interrupt() { drawn_lines_ = 0; }

 private:
  std::vector<SiteRow> Rows() const {
    std::vector<SiteRow> rows;
    for (int s = 0; s < sites_; ++s)
      rows.push_back(ReadSiteRow(fmt::format("{}/site-{}/metrics.jsonl", dir_, s)));
    return rows;
  }

  struct Totals {
    int64_t min_step = 0;
    double loss = 0, tokens_per_s = 0, wan_ms = 0, step_ms = 0;
    uint64_t wan_bytes = 0, sync_bytes = 0;
    bool any = false;
  };
  Totals Sum(const std::vector<SiteRow>& rows) const {
    Totals t;
    t.min_step = steps_;
    for (int s = 0; s < sites_; ++s) {
      const SiteRow& r = rows[size_t(s)];
      if (!Lost(s)) t.min_step = std::min(t.min_step, r.has ? r.step : 0);
      if (!r.has) continue;
      if (!t.any) t.loss = r.loss;  // the loss is the world's: the same on every site
      t.any = true;
      t.tokens_per_s += r.tokens_per_s / sites_;  // each site's share of the global batch
      t.wan_ms = std::max(t.wan_ms, r.wan_ms);
      t.step_ms = std::max(t.step_ms, r.step_ms);
      t.wan_bytes += r.wan_bytes;
      t.sync_bytes += r.sync_bytes;
    }
    return t;
  }

  std::string Header(double now, const Totals& t) const {
    std::string eta;
    if (t.any && t.min_step > 0 && t.min_step < steps_) {
      const double per_step = (now - start_s_) / double(t.min_step);
      eta = ", ETA " + FormatDuration(per_step * double(steps_ - t.min_step));
    }
    return fmt::format("atoll launch: {} sites x {} rank{}, {} elapsed{}", sites_, ranks_,
                       ranks_ == 1 ? "" : "s", FormatDuration(now - start_s_), eta);
  }

  static std::string MB(uint64_t bytes) { return fmt::format("{:.1f}", double(bytes) / 1e6); }

  // The low-communication strategies: what sync would have sent for the same progress.
  static std::string VersusSync(const Totals& t) {
    if (t.sync_bytes == 0) return "";
    return fmt::format("sync would have sent {} MB by now ({:.0f}x more)", MB(t.sync_bytes),
                       double(t.sync_bytes) / double(std::max<uint64_t>(t.wan_bytes, 1)));
  }

 public:
  void MarkLost(int site) { lost_.push_back(site); }
  void MarkBack(int site) { std::erase(lost_, site); }

 private:
  bool Lost(int site) const { return std::find(lost_.begin(), lost_.end(), site) != lost_.end(); }

  void Draw(double now) {
    const auto rows = Rows();
    const Totals t = Sum(rows);
    std::vector<std::string> lines;
    lines.push_back(Header(now, t));
    const int step_w = int(std::to_string(steps_).size()) * 2 + 1;
    lines.push_back(fmt::format("  {:<6} {:>{}} {:>9} {:>10} {:>9} {:>8} {:>12}", "site", "step",
                                step_w, "loss", "tokens/s", "step ms", "wan ms", "WAN MB sent"));
    for (int s = 0; s < sites_; ++s) {
      const SiteRow& r = rows[size_t(s)];
      if (!r.has) {
        lines.push_back(fmt::format("  {:<6} {:>{}} {:>9}", s, "starting", step_w, ""));
        continue;
      }
      if (Lost(s)) {
        lines.push_back(fmt::format("  {:<6} {:>{}} {:>9}  lost (the world goes on without it)", s,
                                    fmt::format("{}/{}", r.step, steps_), step_w, ""));
        continue;
      }
      lines.push_back(fmt::format("  {:<6} {:>{}} {:>9.4f} {:>10.0f} {:>9.0f} {:>8.0f} {:>12}", s,
                                  fmt::format("{}/{}", r.step, steps_), step_w, r.loss,
                                  r.tokens_per_s / sites_, r.step_ms, r.wan_ms, MB(r.wan_bytes)));
    }
    if (t.any) {
      lines.push_back(fmt::format("  {:<6} {:>{}} {:>9.4f} {:>10.0f} {:>9.0f} {:>8.0f} {:>12}",
                                  "total", fmt::format("{}/{}", t.min_step, steps_), step_w, t.loss,
                                  t.tokens_per_s, t.step_ms, t.wan_ms, MB(t.wan_bytes)));
      if (!VersusSync(t).empty()) lines.push_back("  " + VersusSync(t));
    } else {
      lines.push_back(fmt::format("  {:<6} waiting for the first step", "total"));
    }
    std::string out;
    if (drawn_lines_ > 0) out += fmt::format("\x1b[{}A", drawn_lines_);
    for (const auto& l : lines) out += "\x1b[2K" + l + "\n";
    std::fwrite(out.data(), 1, out.size(), stderr);
    std::fflush(stderr);
    drawn_lines_ = int(lines.size());
  }

  void Line(double now) {
    const auto rows = Rows();
    const Totals t = Sum(rows);
    std::string line = fmt::format("[{}] ", FormatDuration(now - start_s_));
    if (!t.any) {
      line += "waiting for the first step";
    } else {
      line += fmt::format("step {}/{}  loss {:.4f}  {:.0f} tokens/s  wan {:.0f} ms  WAN {} MB |",
                          t.min_step, steps_, t.loss, t.tokens_per_s, t.wan_ms, MB(t.wan_bytes));
      for (int s = 0; s < sites_; ++s) {
        const SiteRow& r = rows[size_t(s)];
        line += fmt::format(" site {}: {}{}", s, r.has ? std::to_string(r.step) : "-",
                            Lost(s) ? " (lost)" : "");
      }
      if (!VersusSync(t).empty()) line += " | " + VersusSync(t);
    }
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
  }

  std::string dir_;
  int sites_, ranks_;
  int64_t steps_;
  bool quiet_, tty_;
  double start_s_;
  double last_draw_s_ = -1e9;
  int drawn_lines_ = 0;
  std::vector<int> lost_;
};

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
    if (g_stop_signal != 0) return Status::Internal("launch: interrupted");
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
  ATOLL_ASSIGN_OR_RETURN(RunConfig cfg, LoadRunConfig(a.config, a.sets));
  if (cfg.world.sites < 2)
    return Status::InvalidArgument(fmt::format(
        "launch: world.sites = {}: launch starts a world of several sites (set world.sites >= 2, "
        "e.g. --set world.sites=2); for one site use `atoll train` (or `mpirun -n K atoll train`)",
        cfg.world.sites));
  const int sites = int(cfg.world.sites);
  const int ranks = int(cfg.world.ranks_per_site);
  std::vector<std::pair<int, int64_t>> faults;
  for (const std::string& f : a.fail_sites) {
    const size_t at = f.find('@');
    int site = -1;
    int64_t step = 0;
    try {
      if (at == std::string::npos) throw std::invalid_argument(f);
      size_t used = 0;
      site = std::stoi(f.substr(0, at), &used);
      if (used != at) throw std::invalid_argument(f);
      step = std::stoll(f.substr(at + 1), &used);
      if (used != f.size() - at - 1) throw std::invalid_argument(f);
    } catch (const std::exception&) {
      return Status::InvalidArgument(
          fmt::format("launch: --fail-site {}: expected SITE@STEP, e.g. 2@30", f));
    }
    if (site < 0 || site >= sites || step < 1 || step > cfg.train.steps)
      return Status::InvalidArgument(
          fmt::format("launch: --fail-site {}: the site must be in [0, {}) and the step in [1, {}]",
                      f, sites, cfg.train.steps));
    faults.emplace_back(site, step);
  }
  std::string dir = a.out;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();

  const char* mpirun_name = std::getenv("ATOLL_MPIRUN");
  const std::string mpirun_want = mpirun_name != nullptr && *mpirun_name ? mpirun_name : "mpirun";
  const auto mpirun = FindOnPath(mpirun_want);
  if (!mpirun)
    return Status::Unavailable(fmt::format(
        "launch: {} not found{}: every site runs under mpirun (install OpenMPI: apt-get install "
        "openmpi-bin, or name it with ATOLL_MPIRUN=/path/to/mpirun)",
        mpirun_want, mpirun_want.find('/') == std::string::npos ? " on PATH" : ""));
  char self_buf[4096];
  const ssize_t self_n = ::readlink("/proc/self/exe", self_buf, sizeof(self_buf) - 1);
  if (self_n <= 0)
    return Status::Internal("launch: cannot read /proc/self/exe: " + ErrnoText(errno));
  const std::string self(self_buf, size_t(self_n));

  // The run directory: the effective config, certificates, one folder per site.
  ATOLL_RETURN_IF_ERROR(MakeDirs(dir));
  const std::string config_path = dir + "/config.toml";
  ATOLL_RETURN_IF_ERROR(WriteFileAtomic(config_path, RunConfigToToml(cfg)));
  std::string certs;
  if (!a.insecure) {
    certs = a.certs;
    if (certs.empty()) {
      certs = dir + "/certs";
      ATOLL_RETURN_IF_ERROR(
          MakeCerts(certs, sites, /*force=*/true).WithContext("launch: " + certs));
    }
  }
  // A fresh run: an old coordinator log would be replayed, old metrics shown.
  ::unlink((dir + "/coordinator.log").c_str());
  for (int s = 0; s < sites; ++s) {
    ATOLL_RETURN_IF_ERROR(MakeDirs(fmt::format("{}/site-{}", dir, s)));
    ::unlink(fmt::format("{}/site-{}/metrics.jsonl", dir, s).c_str());
  }
  auto security_args = [&](std::vector<std::string>& argv) {
    if (a.insecure) {
      argv.push_back("--insecure");
    } else {
      argv.push_back("--certs");
      argv.push_back(certs);
    }
  };

  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::vector<std::string> env = ChildEnvironment({
      {"OMPI_ALLOW_RUN_AS_ROOT", "1"},
      {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
      {"OMPI_MCA_rmaps_base_oversubscribe", "1"},
      {"OMPI_MCA_btl", "self,vader"},
      {"OMPI_MCA_mpi_yield_when_idle", "1"},
      // Every site's mpirun would pin its rank 0 to core 0: let the kernel place them.
      {"OMPI_MCA_hwloc_base_binding_policy", "none"},
      {"OMP_NUM_THREADS", std::to_string(std::max(1u, cores / unsigned(sites * ranks)))},
  });

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
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t != nullptr && *t ? t : "/tmp") + "/atoll-mpi-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr)
      return Status::IoError(fmt::format("launch: cannot make a temporary directory {}: {}", tmpl,
                                         std::strerror(errno)));
    mpi_tmp.path = tmpl;
  }

  InstallStopHandlers();
  LiveView view(dir, cfg, a.quiet);

  // The coordinator.
  Child coordinator{.name = "the coordinator", .log = dir + "/coordinator.stderr"};
  int coord_out = -1;
  {
    std::vector<std::string> argv = {self,
                                     "coordinator",
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--sites",
                                     std::to_string(sites),
                                     "--state",
                                     dir,
                                     "--heartbeat-s",
                                     fmt::format("{}", cfg.world.heartbeat_s)};
    security_args(argv);
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0)
      return Status::IoError("launch: pipe: " + ErrnoText(errno));
    auto err_fd = OpenLog(coordinator.log);
    if (!err_fd.ok()) {
      ::close(pipe_fds[0]);
      ::close(pipe_fds[1]);
      return err_fd.status();
    }
    auto pid = Spawn(argv, env, pipe_fds[1], *err_fd);
    ::close(pipe_fds[1]);
    ::close(*err_fd);
    if (!pid.ok()) {
      ::close(pipe_fds[0]);
      return pid.status();
    }
    coordinator.pid = *pid;
    coordinator.running = true;
    coord_out = pipe_fds[0];
  }
  std::string coord_rest;
  auto address = ReadAddress(coord_out, coordinator, coordinator.log, 30.0, &coord_rest);
  if (!address.ok()) {
    std::vector<Child*> all = {&coordinator};
    StopAll(all, 5.0);
    ::close(coord_out);
    if (g_stop_signal != 0) return g_stop_signal == SIGINT ? 130 : 128 + g_stop_signal;
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
    std::fprintf(stderr,
                 "launch: coordinator at %s (%s); %d sites x %d rank%s under %s; logs in %s\n",
                 address->c_str(), a.insecure ? "insecure" : ("certificates in " + certs).c_str(),
                 sites, ranks, ranks == 1 ? "" : "s", mpirun->c_str(), dir.c_str());
  }

  // The sites.
  std::deque<Child> site_children;
  std::vector<Child*> all = {&coordinator};
  auto fail_start = [&](const Status& s) -> StatusOr<int> {
    StopAll(all, 5.0);
    if (coord_out >= 0) ::close(coord_out);
    return s;
  };
  // Site s's mpirun; with rejoin, a new process that takes over the lost site (`train
  // --rejoin`, its output in site-N/rejoin.log), without the fault injection.
  auto start_site = [&](int s, bool rejoin) -> Status {
    const std::string site_dir = fmt::format("{}/site-{}", dir, s);
    Child& c = site_children[size_t(s)];
    c = Child{};
    c.name = fmt::format("site {}", s);
    c.log = site_dir + (rejoin ? "/rejoin.log" : "/train.log");
    std::vector<std::string> argv = {*mpirun,
                                     "-n",
                                     std::to_string(ranks),
                                     self,
                                     "train",
                                     "--config",
                                     config_path,
                                     "--site",
                                     std::to_string(s),
                                     "--coordinator",
                                     *address};
    security_args(argv);
    argv.insert(argv.end(), {"--out", site_dir, "--checkpoint-dir", dir, "-q"});
    if (rejoin) {
      argv.push_back("--rejoin");
    } else {
      for (const auto& [site, step] : faults)
        if (site == s) argv.insert(argv.end(), {"--die-after-step", std::to_string(step)});
    }
    ATOLL_ASSIGN_OR_RETURN(const int fd, OpenLog(c.log));
    const std::string site_tmp =
        fmt::format("{}/site-{}{}", mpi_tmp.path, s, rejoin ? "-rejoin" : "");
    std::vector<std::string> site_env = env;
    if (::mkdir(site_tmp.c_str(), 0700) == 0 && std::getenv("OMPI_MCA_orte_tmpdir_base") == nullptr)
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

  // Watch: every 0.5 s reap the children and redraw. With the strategies that survive a site's
  // loss (diloco, streaming, async), a site other than 0 (which writes the checkpoint) may end
  // badly and the others go on.
  const Child* failed = nullptr;
  const bool survives_loss = cfg.world.strategy != "sync";
  std::vector<int> lost, rejoined;
  while (true) {
    drain_coordinator(100);
    if (g_stop_signal != 0) break;
    bool sites_done = true;
    for (int s = 0; s < sites; ++s) {
      Child& c = site_children[size_t(s)];
      const bool was_running = c.running;
      Poll(c);
      if (was_running && !c.running && !c.exited_ok()) {
        const bool again = a.rejoin && survives_loss &&
                           std::find(rejoined.begin(), rejoined.end(), s) == rejoined.end();
        if (survives_loss && s != 0 && int(lost.size()) + 1 < sites) {
          lost.push_back(s);
          view.MarkLost(s);
          view.Interrupt();
          std::fprintf(stderr, "launch: site %d ended (%s); the world goes on without it%s\n", s,
                       c.how_it_ended().c_str(),
                       again ? "; starting a new process to take it over (--rejoin)" : "");
          if (again) {
            rejoined.push_back(s);
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
    if (failed == nullptr && !Poll(coordinator) && !sites_done) failed = &coordinator;
    if (failed != nullptr || sites_done) break;
    view.Update(false);
  }

  if (g_stop_signal != 0) {
    view.Finish();
    std::fprintf(stderr, "launch: %s; stopping the sites and the coordinator\n",
                 g_stop_signal == SIGINT ? "interrupted" : strsignal(g_stop_signal));
    StopAll(all, 5.0);
    if (coord_out >= 0) ::close(coord_out);
    return g_stop_signal == SIGINT ? 130 : 128 + g_stop_signal;
  }
  if (failed != nullptr) {
    view.Finish();
    // Stop the rest first: they would wait for the failed one until their timeouts.
    StopAll(all, 5.0);
    if (coord_out >= 0) ::close(coord_out);
    std::fprintf(stderr, "launch: %s failed (%s); the others were stopped. Last lines of %s:\n%s",
                 failed->name.c_str(), failed->how_it_ended().c_str(), failed->log.c_str(),
                 TailLines(failed->log, 20).c_str());
    return 1;
  }
  // Every site is done: stop the coordinator.
  view.Finish();
  StopAll(all, 5.0);
  if (coord_out >= 0) ::close(coord_out);
  if (coord_extra >= 0) ::close(coord_extra);
  const std::string checkpoint = dir + "/checkpoint";
  if (!FileExists(checkpoint)) {
    std::fprintf(stderr, "launch: every site exited 0 but %s was not written; site 0's log:\n%s",
                 checkpoint.c_str(), TailLines(site_children.front().log, 20).c_str());
    return 1;
  }
  if (!lost.empty()) {
    std::string names;
    for (int s : lost) names += fmt::format("{}{}", names.empty() ? "" : ", ", s);
    std::fprintf(stderr, "launch: finished without site%s %s (lost during the run)\n",
                 lost.size() == 1 ? "" : "s", names.c_str());
  }
  std::printf("%s\n", checkpoint.c_str());
  std::fflush(stdout);
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
      "With world.strategy diloco, streaming or async the world goes on when a site other than\n"
      "0 is lost (the view marks it; the exit status is 0 if the rest finish); with --rejoin a\n"
      "new process takes the lost site over and the world is whole again. Their view also\n"
      "shows what sync would have sent for the same progress.\n"
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
      "  DIR/checkpoint               the final checkpoint (written by site 0)\n"
      "Environment: mpirun from PATH (or ATOLL_MPIRUN); OMP_NUM_THREADS defaults to\n"
      "cores / (sites * ranks_per_site); OpenMPI runs as root, oversubscribed, over shared "
      "memory.\n"
      "Example:\n"
      "  atoll launch --config configs/world-demo.toml --out runs/world\n"
      "  atoll launch --config configs/world-demo.toml --set world.link.latency_ms=10 \\\n"
      "      --out runs/world-near --insecure");
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
                  "Fault injection: SITE@STEP makes that site's leader die abruptly after the "
                  "step (repeatable); diloco, streaming and async go on without it");
  cmd->add_flag("--rejoin", args->rejoin,
                "diloco, streaming, async: when a site other than 0 is lost (a crash, or "
                "--fail-site), start a new process that takes it over, once per site (`atoll "
                "train --rejoin`; output in DIR/site-N/rejoin.log)");
  cmd->callback([args] {
    auto rc = Launch(*args);
    ExitIfError(rc.status());
    std::fflush(stdout);
    std::fflush(stderr);
    if (*rc != 0) std::exit(*rc);
  });
}

}  // namespace atl::cli
