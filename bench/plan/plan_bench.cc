// plan_bench: wall time of the full frontier sweep (1e24 to 1e34 FLOP) for each catalogue
// setting, with what each sweep concluded. The reference Python notebook (Erdil &
// Schneider-Joseph, optimal_parallelism.ipynb) takes about 10 s per setting; the goal here is
// under 2 s per setting on this machine.
//
//   plan_bench [--repeat N]     (median of N sweeps per setting, default 3)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/log.h"
#include "plan/frontier.h"
#include "plan/table.h"
#include "plan/units.h"

using namespace atl::plan;

namespace {

struct Setting {
  std::string name;
  FrontierSettings settings;
};

Setting Make(const char* gpu, const char* network, BatchRule batch = BatchRule::kDefault,
             bool sparse = false, bool zero_bubble = false) {
  Setting s;
  s.settings.hardware = *MakeHardware(gpu, network);
  s.settings.rules.batch = batch;
  s.settings.rules.sparse = sparse;
  s.settings.search.zero_bubble = zero_bubble;
  // As `atoll plan frontier` sweeps by default: the notebook's combination, DP not overlapped,
  // both pipeline schedules (zero bubble alone when asked for).
  s.settings.search.eval.combine = Combine::kReference;
  s.settings.search.both_schedules = !zero_bubble;
  s.settings.search.eval.overlap_dp = false;
  s.name = std::string(gpu) + " " + network + ", batch " + BatchRuleName(batch) +
           (sparse ? ", sparse" : "") + (zero_bubble ? ", zero-bubble" : "");
  return s;
}

std::string Flop(const std::optional<double>& v) { return v ? FormatSci(*v) : "-"; }
std::string Flop(double v) { return std::isfinite(v) ? FormatSci(v) : "-"; }

}  // namespace

int main(int argc, char** argv) {
  int repeat = 3;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) {
      repeat = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: plan_bench [--repeat N]\n");
      return 2;
    }
  }
  std::vector<Setting> settings;
  for (const char* gpu : {"V100", "A100", "H100", "H200", "B200"}) {
    settings.push_back(Make(gpu, "default"));
  }
  for (const char* net : {"low-latency", "zero-latency", "global-nvlink", "infinite", "superpod"}) {
    settings.push_back(Make("H100", net));
  }
  settings.push_back(Make("H100", "default", BatchRule::kFixed));
  settings.push_back(Make("H100", "default", BatchRule::kDeepSeek));
  settings.push_back(Make("H100", "default", BatchRule::kDefault, /*sparse=*/true));
  settings.push_back(Make("H100", "default", BatchRule::kDefault, false, /*zero_bubble=*/true));

  TextTable t;
  t.AddColumn("setting (3 months)", TextTable::Align::kLeft);
  for (const char* h : {"sweep s", "budgets", "crossover", "largest feasible", "latency wall",
                        "critical compute"}) {
    t.AddColumn(h);
  }
  double total = 0, worst = 0;
  for (const Setting& s : settings) {
    std::vector<double> times;
    FrontierResult r;
    for (int k = 0; k < repeat; ++k) {
      double t0 = atl::NowSeconds();
      r = RunFrontier(s.settings);
      times.push_back(atl::NowSeconds() - t0);
    }
    std::sort(times.begin(), times.end());
    double median = times[times.size() / 2];
    total += median;
    worst = std::max(worst, median);
    t.AddRow({s.name, fmt::format("{:.3f}", median), std::to_string(r.rows.size()),
              Flop(r.crossover_flop), Flop(r.largest_feasible_flop), Flop(r.latency_wall_flop),
              Flop(r.critical_compute_flop)});
  }
  std::fputs(t.Render().c_str(), stdout);
  std::printf(
      "\nmedian of %d sweeps per setting; slowest %.3f s, all %zu settings %.3f s "
      "(goal: < 2 s per setting; the reference Python takes ~10 s per setting)\n",
      repeat, worst, settings.size(), total);
  return worst < 2.0 ? 0 : 1;
}
