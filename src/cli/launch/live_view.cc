// The live view of `atoll launch` (cli/launch/live_view.h).
#include "cli/launch/live_view.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "train/metrics.h"

namespace atl::cli {

namespace {

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

}  // namespace

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

bool SiteRegistered(const std::string& coordinator_log, int site) {
  std::ifstream in(coordinator_log);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("\"register\"") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("t", "") == "register" && j.value("site", -1) == site) return true;
  }
  return false;
}

void ReadSiteEvents(const std::string& events_path, SiteRow* row) {
  const std::string last = LastLine(events_path);
  if (last.empty()) return;
  // Incidents are rare: counting the file's lines is cheap.
  std::FILE* f = std::fopen(events_path.c_str(), "r");
  if (f == nullptr) return;
  int64_t lines = 0;
  for (int c; (c = std::fgetc(f)) != EOF;) lines += c == '\n';
  std::fclose(f);
  row->sdc_events = lines;
  const nlohmann::json j = nlohmann::json::parse(last, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return;
  std::string what = j.value("what", "");
  if (j.contains("op")) what = j.value("op", "") + (what.empty() ? "" : " " + what);
  if (j.contains("verdict")) what = j.value("verdict", "") + (what.empty() ? "" : ": " + what);
  row->last_sdc = fmt::format("step {} rank {}: {} {}", j.value("step", int64_t(0)),
                              j.value("rank", -1), j.value("detector", ""), what);
}

namespace {

std::string MB(uint64_t bytes) { return fmt::format("{:.1f}", double(bytes) / 1e6); }

// The low-communication strategies: what sync would have sent for the same progress.
std::string VersusSync(uint64_t sync_bytes, uint64_t wan_bytes) {
  if (sync_bytes == 0) return "";
  return fmt::format("sync would have sent {} MB by now ({:.0f}x more)", MB(sync_bytes),
                     double(sync_bytes) / double(std::max<uint64_t>(wan_bytes, 1)));
}

}  // namespace

LiveView::LiveView(const std::string& dir, const RunConfig& cfg, bool quiet)
    : dir_(dir),
      sites_(int(cfg.world.sites)),
      ranks_(int(cfg.world.ranks_per_site)),
      steps_(cfg.train.steps),
      quiet_(quiet),
      tty_(::isatty(::fileno(stderr)) != 0),
      start_s_(NowSeconds()) {}

void LiveView::Update(bool force) {
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

void LiveView::Finish() {
  if (quiet_) return;
  Update(true);
  drawn_lines_ = 0;
}

std::vector<SiteRow> LiveView::Rows() const {
  std::vector<SiteRow> rows;
  for (int s = 0; s < sites_; ++s) {
    rows.push_back(ReadSiteRow(fmt::format("{}/site-{}/metrics.jsonl", dir_, s)));
    ReadSiteEvents(fmt::format("{}/site-{}/events.jsonl", dir_, s), &rows.back());
  }
  return rows;
}

LiveView::Totals LiveView::Sum(const std::vector<SiteRow>& rows) const {
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

std::string LiveView::Header(double now, const Totals& t) const {
  std::string eta;
  if (t.any && t.min_step > 0 && t.min_step < steps_) {
    const double per_step = (now - start_s_) / double(t.min_step);
    eta = ", ETA " + FormatDuration(per_step * double(steps_ - t.min_step));
  }
  return fmt::format("atoll launch: {} sites x {} rank{}, {} elapsed{}", sites_, ranks_,
                     ranks_ == 1 ? "" : "s", FormatDuration(now - start_s_), eta);
}

void LiveView::MarkLost(int site) { lost_.push_back(site); }

void LiveView::MarkBack(int site) { std::erase(lost_, site); }

bool LiveView::Lost(int site) const {
  return std::find(lost_.begin(), lost_.end(), site) != lost_.end();
}

void LiveView::Draw(double now) {
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
    if (!VersusSync(t.sync_bytes, t.wan_bytes).empty())
      lines.push_back("  " + VersusSync(t.sync_bytes, t.wan_bytes));
  } else {
    lines.push_back(fmt::format("  {:<6} waiting for the first step", "total"));
  }
  for (int s = 0; s < sites_; ++s) {
    const SiteRow& r = rows[size_t(s)];
    if (r.sdc_events > 0)
      lines.push_back(fmt::format("  site {}: {} silent-data-corruption event{}, last: {}", s,
                                  r.sdc_events, r.sdc_events == 1 ? "" : "s", r.last_sdc));
  }
  std::string out;
  if (drawn_lines_ > 0) out += fmt::format("\x1b[{}A", drawn_lines_);
  for (const auto& l : lines) out += "\x1b[2K" + l + "\n";
  std::fwrite(out.data(), 1, out.size(), stderr);
  std::fflush(stderr);
  drawn_lines_ = int(lines.size());
}

void LiveView::Line(double now) {
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
      line += fmt::format(
          " site {}: {}{}{}", s, r.has ? std::to_string(r.step) : "-", Lost(s) ? " (lost)" : "",
          r.sdc_events > 0 ? fmt::format(" ({} sdc events, last: {})", r.sdc_events, r.last_sdc)
                           : "");
    }
    if (!VersusSync(t.sync_bytes, t.wan_bytes).empty())
      line += " | " + VersusSync(t.sync_bytes, t.wan_bytes);
  }
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace atl::cli
