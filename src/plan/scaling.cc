#include "plan/scaling.h"

#include <cmath>
#include <functional>
#include <map>

#include "plan/table.h"
#include "plan/units.h"

namespace atl::plan {
namespace {

// Least-squares slope of log y on log x.
double LogSlope(const std::vector<double>& x, const std::vector<double>& y) {
  double n = static_cast<double>(x.size());
  if (n < 2) return 0;
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double lx = std::log(x[i]), ly = std::log(y[i]);
    sx += lx;
    sy += ly;
    sxx += lx * lx;
    sxy += lx * ly;
  }
  double den = n * sxx - sx * sx;
  return den > 0 ? (n * sxy - sx * sy) / den : 0;
}

Slope Fit(const ScalingSettings& s, const std::vector<ScalingRow>& rows,
          const std::function<double(const ScalingRow&)>& y) {
  std::map<int64_t, std::pair<std::vector<double>, std::vector<double>>> by_d;
  std::map<double, std::pair<std::vector<double>, std::vector<double>>> by_n;
  for (const auto& r : rows) {
    by_d[r.datacenters].first.push_back(r.params);
    by_d[r.datacenters].second.push_back(y(r));
    by_n[r.params].first.push_back(static_cast<double>(r.datacenters));
    by_n[r.params].second.push_back(y(r));
  }
  Slope sl;
  for (auto& [d, xy] : by_d) sl.vs_params += LogSlope(xy.first, xy.second) / by_d.size();
  for (auto& [n, xy] : by_n) sl.vs_datacenters += LogSlope(xy.first, xy.second) / by_n.size();
  return sl;
}

std::string Growth(double slope) {
  if (slope >= 0.9) return fmt::format("linearly (slope {:.2f})", slope);
  if (slope >= 0.15) return fmt::format("sub-linearly (slope {:.2f})", slope);
  return fmt::format("hardly at all (slope {:.2f})", slope);
}

}  // namespace

ScalingRow ScalingPoint(const ScalingSettings& s, double params, int64_t datacenters) {
  ScalingRow r;
  r.params = params;
  r.datacenters = datacenters;
  const double d = static_cast<double>(datacenters);
  const double p = d * static_cast<double>(s.replicas_per_dc);  // replicas in the flat ring
  const double payload = params * s.wan_bits / 8.0;
  const double bw = s.wan_bits_per_s / 8.0;
  const double h = static_cast<double>(s.inner_steps);
  r.ring_bytes = 2.0 * (p - 1) / p * payload;
  r.ring_s = r.ring_bytes / bw + 2.0 * (p - 1) * s.wan_latency_s;
  r.hier_bytes = 2.0 * (d - 1) / d * payload;
  r.hier_s = r.hier_bytes / bw + 2.0 * (d - 1) * s.wan_latency_s;
  r.diloco_bytes = r.hier_bytes / h;
  r.diloco_s = r.hier_s / h;
  return r;
}

ScalingResult RunScaling(const ScalingSettings& s) {
  ScalingResult r;
  for (double n : s.params) {
    for (int64_t d : s.datacenters) r.rows.push_back(ScalingPoint(s, n, d));
  }
  r.ring_bytes = Fit(s, r.rows, [](const ScalingRow& x) { return x.ring_bytes; });
  r.hier_bytes = Fit(s, r.rows, [](const ScalingRow& x) { return x.hier_bytes; });
  r.diloco_bytes = Fit(s, r.rows, [](const ScalingRow& x) { return x.diloco_bytes; });
  auto total = [](double bytes, const ScalingRow& x) { return bytes * x.datacenters; };
  r.ring_total = Fit(s, r.rows, [&](const ScalingRow& x) { return total(x.ring_bytes, x); });
  r.hier_total = Fit(s, r.rows, [&](const ScalingRow& x) { return total(x.hier_bytes, x); });
  r.diloco_total = Fit(s, r.rows, [&](const ScalingRow& x) { return total(x.diloco_bytes, x); });
  r.ring_time = Fit(s, r.rows, [](const ScalingRow& x) { return x.ring_s; });
  r.hier_time = Fit(s, r.rows, [](const ScalingRow& x) { return x.hier_s; });
  r.diloco_time = Fit(s, r.rows, [](const ScalingRow& x) { return x.diloco_s; });

  bool both_linear_total = r.hier_total.vs_params >= 0.9 && r.hier_total.vs_datacenters >= 0.9;
  r.answer = fmt::format(
      "Does communication grow linearly in both model size and datacenter count? {}\n"
      "- WAN bytes through each datacenter's uplink grow {} with model size and {} with the "
      "number of datacenters (hierarchical: 2(D-1)/D tends to 2; ring: 2(DR-1)/(DR) likewise).\n"
      "- WAN bytes summed over all datacenters grow {} with model size and {} with datacenters: "
      "D sites each send about 2 model copies.\n"
      "- Time per exchange (each site has its own uplink): hierarchical grows {} with model size "
      "and {} with datacenters; the flat ring grows {} with datacenters because its latency term "
      "2(DR-1) lambda counts every replica; DiLoCo divides the hierarchical cost by H = {}.",
      both_linear_total ? "Total traffic yes; time per site no." : "No.",
      Growth(r.hier_bytes.vs_params), Growth(r.hier_bytes.vs_datacenters),
      Growth(r.hier_total.vs_params), Growth(r.hier_total.vs_datacenters),
      Growth(r.hier_time.vs_params), Growth(r.hier_time.vs_datacenters),
      Growth(r.ring_time.vs_datacenters), s.inner_steps);
  return r;
}

std::string ScalingReport(const ScalingResult& r, const ScalingSettings& s) {
  std::string out = fmt::format(
      "WAN {} per datacenter each way, {} latency, {}-bit gradients, {} replicas per datacenter "
      "in the flat ring, DiLoCo H = {}\n\n",
      FormatBitsPerSecond(s.wan_bits_per_s), FormatSeconds(s.wan_latency_s), s.wan_bits,
      s.replicas_per_dc, s.inner_steps);
  TextTable t;
  for (const char* h : {"params", "DCs", "ring B/site", "hier B/site", "DiLoCo B/site",
                        "hier B total", "ring time", "hier time", "DiLoCo time"}) {
    t.AddColumn(h);
  }
  for (const auto& row : r.rows) {
    t.AddRow({FormatCount(row.params), std::to_string(row.datacenters), FormatBytes(row.ring_bytes),
              FormatBytes(row.hier_bytes), FormatBytes(row.diloco_bytes),
              FormatBytes(row.hier_bytes * static_cast<double>(row.datacenters)),
              FormatSeconds(row.ring_s), FormatSeconds(row.hier_s), FormatSeconds(row.diloco_s)});
  }
  out += t.Render();
  out +=
      "\nColumns (per training step; M = N bits/8 bytes, BW = uplink bytes/s, R replicas per "
      "DC, H inner steps):\n"
      "  ring B/site   = 2 (DR-1)/(DR) M               ring time   = ring B/site / BW + "
      "2 (DR-1) lambda\n"
      "  hier B/site   = 2 (D-1)/D M                   hier time   = hier B/site / BW + "
      "2 (D-1) lambda\n"
      "  DiLoCo B/site = hier B/site / H               DiLoCo time = hier time / H\n"
      "  hier B total  = D x hier B/site\n\n";
  TextTable f;
  f.AddColumn("log-log slope", TextTable::Align::kLeft);
  f.AddColumn("vs params");
  f.AddColumn("vs DCs");
  auto add = [&](const char* what, const Slope& sl) {
    f.AddRow({what, fmt::format("{:.2f}", sl.vs_params), fmt::format("{:.2f}", sl.vs_datacenters)});
  };
  add("ring bytes per site", r.ring_bytes);
  add("hierarchical bytes per site", r.hier_bytes);
  add("DiLoCo bytes per site", r.diloco_bytes);
  add("ring bytes, all sites", r.ring_total);
  add("hierarchical bytes, all sites", r.hier_total);
  add("DiLoCo bytes, all sites", r.diloco_total);
  add("ring time", r.ring_time);
  add("hierarchical time", r.hier_time);
  add("DiLoCo time", r.diloco_time);
  out += f.Render();
  out += "\n" + r.answer + "\n";
  return out;
}

nlohmann::json ScalingJson(const ScalingResult& r, const ScalingSettings& s) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& x : r.rows) {
    rows.push_back({{"params", x.params},
                    {"datacenters", x.datacenters},
                    {"ring_bytes_per_dc", x.ring_bytes},
                    {"hier_bytes_per_dc", x.hier_bytes},
                    {"diloco_bytes_per_dc", x.diloco_bytes},
                    {"hier_bytes_total", x.hier_bytes * static_cast<double>(x.datacenters)},
                    {"ring_s", x.ring_s},
                    {"hier_s", x.hier_s},
                    {"diloco_s", x.diloco_s}});
  }
  auto slope = [](const Slope& sl) {
    return nlohmann::json{{"vs_params", sl.vs_params}, {"vs_datacenters", sl.vs_datacenters}};
  };
  return {{"wan_bits_per_s", s.wan_bits_per_s},
          {"wan_latency_s", s.wan_latency_s},
          {"wan_bits", s.wan_bits},
          {"inner_steps", s.inner_steps},
          {"replicas_per_dc", s.replicas_per_dc},
          {"rows", rows},
          {"slopes",
           {{"ring_bytes_per_dc", slope(r.ring_bytes)},
            {"hier_bytes_per_dc", slope(r.hier_bytes)},
            {"diloco_bytes_per_dc", slope(r.diloco_bytes)},
            {"ring_bytes_total", slope(r.ring_total)},
            {"hier_bytes_total", slope(r.hier_total)},
            {"diloco_bytes_total", slope(r.diloco_total)},
            {"ring_s", slope(r.ring_time)},
            {"hier_s", slope(r.hier_time)},
            {"diloco_s", slope(r.diloco_time)}}},
          {"answer", r.answer}};
}

}  // namespace atl::plan
