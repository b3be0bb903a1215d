#include "train/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/file.h"
#include "core/log.h"
#include "data/tokenizer.h"
#include "train/config.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The template, embedded at build time (CMakeLists.txt: report_template.inc).
constexpr const char* kTemplate =
#include "train/report_template.inc"
    ;

// The JSON objects of a .jsonl file; malformed lines (a crash mid-write) are counted and skipped.
std::vector<json> ReadJsonLines(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  std::string line;
  int bad = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object())
      out.push_back(std::move(j));
    else
      ++bad;
  }
  if (bad > 0) LogWarning("report: {}: {} malformed line(s) skipped", path, bad);
  return out;
}

double Num(const json& j, const char* key, double fallback = 0) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

// A value for a chart: the number, or null (a gap) where it is missing or not finite.
json Value(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return nullptr;
  const double v = it->get<double>();
  return std::isfinite(v) ? json(v) : json(nullptr);
}

// Rows kept for the charts: all of them up to kMaxPoints, else every k-th and the last, so a
// long run's page stays small and quick (Chart.js draws every point it is given).
constexpr size_t kMaxPoints = 2000;
std::vector<size_t> Thinned(size_t n) {
  std::vector<size_t> keep;
  const size_t k = n <= kMaxPoints ? 1 : (n + kMaxPoints - 1) / kMaxPoints;
  for (size_t i = 0; i < n; i += k) keep.push_back(i);
  if (!keep.empty() && keep.back() != n - 1) keep.push_back(n - 1);
  return keep;
}

// One site's series from its metrics.jsonl.
json SiteSeries(const std::string& name, const std::vector<json>& all_rows) {
  json s = {{"name", name}};
  json step = json::array(), loss = json::array(), tokens = json::array(), tps = json::array();
  json step_ms = json::array(), wan_ms = json::array(), wan_bytes = json::array();
  json val = json::array(), exchanges = json::array();
  double step_total = 0, wan_total = 0, last_rounds = 0, sync_bytes = 0;
  std::vector<const json*> rows;  // the step rows
  std::vector<double> exchange_steps;
  for (const json& r : all_rows) {
    if (!r.contains("step") || !r.contains("loss")) continue;
    rows.push_back(&r);
    const double st = Num(r, "step");
    step_total += Num(r, "step_ms");
    wan_total += Num(r, "wan_ms");
    sync_bytes = std::max(sync_bytes, Num(r, "sync_bytes_sent"));
    if (r.contains("val_loss")) val.push_back({st, Value(r, "val_loss")});
    // An exchange: the outer round count went up (DiLoCo, streaming, async), or, without one,
    // a step that sent bytes over the WAN (sync).
    const double rounds = Num(r, "outer_rounds", -1);
    if (rounds > last_rounds)
      exchange_steps.push_back(st);
    else if (rounds < 0 && Num(r, "wan_ms") > 0)
      exchange_steps.push_back(st);
    if (rounds >= 0) last_rounds = rounds;
  }
  for (size_t i : Thinned(rows.size())) {
    const json& r = *rows[i];
    step.push_back(Num(r, "step"));
    loss.push_back(Value(r, "loss"));
    tokens.push_back(Value(r, "tokens"));
    tps.push_back(Value(r, "tokens_per_s"));
    step_ms.push_back(Value(r, "step_ms"));
    wan_ms.push_back(Value(r, "wan_ms"));
    wan_bytes.push_back(Value(r, "wan_bytes_sent"));
  }
  for (size_t i : Thinned(exchange_steps.size())) exchanges.push_back(exchange_steps[i]);
  s["step"] = step;
  s["loss"] = loss;
  s["tokens"] = tokens;
  s["tokens_per_s"] = tps;
  s["step_ms"] = step_ms;
  s["wan_ms"] = wan_ms;
  s["wan_bytes"] = wan_bytes;
  s["val"] = val;
  s["exchanges"] = exchanges;
  s["step_ms_total"] = step_total;
  s["wan_ms_total"] = wan_total;
  s["sync_bytes"] = sync_bytes;
  return s;
}

// A site's events (events.jsonl): corruption found, repairs, restarts.
void SiteEvents(const std::vector<json>& rows, const std::string& site, json* events) {
  for (const json& r : rows) {
    json detail = json::object();
    for (auto it = r.begin(); it != r.end(); ++it)
      if (it.key() != "step" && it.key() != "event" && it.key() != "site") detail[it.key()] = *it;
    std::string what = r.contains("event") && r["event"].is_string() ? r["event"].get<std::string>()
                                                                     : std::string("event");
    if (r.contains("detector") && r["detector"].is_string())
      what += " (" + r["detector"].get<std::string>() + ")";
    events->push_back(
        {{"when", r.contains("step") ? fmt::format("step {}", r["step"].dump()) : "-"},
         {"site", site},
         {"what", what},
         {"detail", detail.dump()}});
  }
}

// The coordinator's membership records: sites registering, lost, leaving, rejoining.
void CoordinatorEvents(const std::vector<json>& rows, json* events) {
  double start = -1;
  for (const json& r : rows) {
    const std::string t = r.contains("t") && r["t"].is_string() ? r["t"].get<std::string>() : "";
    const double time = Num(r, "time", -1);
    if (t == "start") start = time;
    if (t == "round" || t == "start") continue;
    const std::string when =
        start >= 0 && time >= 0 ? fmt::format("{:.1f} s", time - start) : std::string("-");
    json detail = json::object();
    for (auto it = r.begin(); it != r.end(); ++it)
      if (it.key() != "t" && it.key() != "time" && it.key() != "site") detail[it.key()] = *it;
    events->push_back({{"when", when},
                       {"site", r.contains("site") ? fmt::format("site-{}", r["site"].dump())
                                                   : std::string("coordinator")},
                       {"what", "coordinator: " + t},
                       {"detail", detail.dump()}});
  }
}

std::string ReplaceOnce(std::string s, const std::string& what, const std::string& with) {
  const size_t at = s.find(what);
  if (at != std::string::npos) s.replace(at, what.size(), with);
  return s;
}

}  // namespace

std::string DefaultChartJs() {
  return CacheDir() + "/npm/node_modules/chart.js/dist/chart.umd.min.js";
}

StatusOr<std::string> WriteReport(const ReportOptions& o) {
  const std::string dir = o.run_dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return Status::InvalidArgument(fmt::format("{}: not a run directory", dir));
  // The sites: a single site's metrics.jsonl, or a world's site-N/.
  std::vector<std::pair<std::string, std::string>> sites;  // (name, directory)
  // A world's site-N directories, in N order, with or without metrics yet (a site lost before
  // its first step still has its events and its line in the summary).
  if (FileExists(dir + "/metrics.jsonl")) {
    sites.push_back({"site-0", dir});
  } else {
    std::vector<std::pair<int, std::string>> found;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      int n = -1;
      if (name.rfind("site-", 0) == 0 && e.is_directory() &&
          std::sscanf(name.c_str() + 5, "%d", &n) == 1 && n >= 0 &&
          name == fmt::format("site-{}", n))
        found.push_back({n, e.path().string()});
    }
    std::sort(found.begin(), found.end());
    bool any_metrics = false;
    for (const auto& [n, d] : found) {
      sites.push_back({fmt::format("site-{}", n), d});
      any_metrics |= FileExists(d + "/metrics.jsonl");
    }
    if (!any_metrics) sites.clear();
  }
  if (sites.empty())
    return Status::InvalidArgument(fmt::format(
        "{}: no metrics.jsonl and no site-N/metrics.jsonl: not the output of atoll train or "
        "atoll launch",
        dir));
  const std::string chartjs_path = o.chartjs.empty() ? DefaultChartJs() : o.chartjs;
  auto chartjs = ReadFile(chartjs_path);
  if (!chartjs.ok())
    return Status::InvalidArgument(fmt::format(
        "{}: Chart.js not found (scripts/setup.sh installs it from npm)", chartjs_path));

  json data = {{"run_dir", fs::absolute(dir).lexically_normal().string()}};
  json site_series = json::array(), events = json::array();
  double sync_bytes = 0;
  for (const auto& [name, d] : sites) {
    site_series.push_back(SiteSeries(name, ReadJsonLines(d + "/metrics.jsonl")));
    sync_bytes = std::max(sync_bytes, site_series.back()["sync_bytes"].get<double>());
    SiteEvents(ReadJsonLines(d + "/events.jsonl"), name, &events);
  }
  CoordinatorEvents(ReadJsonLines(dir + "/coordinator.log"), &events);
  data["sites"] = site_series;
  data["events"] = events;
  data["sync_bytes"] = sync_bytes;
  auto config = ReadFile(dir + "/config.toml");
  data["config"] = config.ok() ? *config : std::string("(no config.toml)");
  // The strategy as the config reader reads it (a world's), else a single site.
  auto cfg =
      config.ok() ? LoadRunConfig(dir + "/config.toml", {}) : StatusOr<RunConfig>(config.status());
  data["strategy"] = cfg.ok() && cfg->world.sites > 1 ? cfg->world.strategy : "single site";
  // The lead site's prediction against what it measured (a single site's, or site-0's).
  auto plan = ReadFile(dir + "/plan.json");
  if (!plan.ok() && sites.size() > 1) plan = ReadFile(sites.front().second + "/plan.json");
  data["plan"] = nullptr;
  if (plan.ok()) {
    json p = json::parse(*plan, nullptr, false);
    if (p.is_array()) data["plan"] = p;
  }
  const std::time_t now = std::time(nullptr);
  char written[32];
  std::strftime(written, sizeof written, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  data["written"] = written;

  // Inside a <script> element no "<" may appear in the inlined data ("</script", "<!--"): in JSON
  // it can only be inside strings, where \u003c means the same. Invalid UTF-8 (a path, a log
  // line) becomes U+FFFD instead of failing the report.
  std::string blob = data.dump(-1, ' ', false, json::error_handler_t::replace);
  for (size_t at = 0; (at = blob.find('<', at)) != std::string::npos; at += 6)
    blob.replace(at, 1, "\\u003c");
  std::string lib = *chartjs;
  for (size_t at = 0; (at = lib.find("</script", at)) != std::string::npos; at += 9)
    lib.replace(at, 8, "<\\/script");
  std::string page = ReplaceOnce(kTemplate, "/*ATOLL_CHARTJS*/", lib);
  page = ReplaceOnce(page, "/*ATOLL_DATA*/", blob);
  const std::string out = o.out.empty() ? dir + "/report.html" : o.out;
  ATOLL_RETURN_IF_ERROR(WriteFileAtomic(out, page).WithContext("writing the report"));
  return out;
}

}  // namespace atl
