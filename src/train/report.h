// `atoll report RUN_DIR`: one self-contained HTML page of a run (RUN_DIR/report.html) that opens
// offline: losses per site against steps, tokens and WAN bytes; throughput; the share of each step
// spent waiting on the WAN; the exchanges between sites; events (corruption found and where,
// sites lost, rejoined, leaving); the config; and the planner's prediction next to what was
// measured when the run recorded one (RUN_DIR/plan.json).
//
// It reads what a run writes: a single site's RUN_DIR/metrics.jsonl and events.jsonl, or a
// world's RUN_DIR/site-N/{metrics,events}.jsonl and coordinator.log, and config.toml. The charts
// are drawn by Chart.js (npm, installed by scripts/setup.sh), inlined into the page with the data
// (src/train/report_template.html). Malformed lines are skipped with a count in the log, so a run
// that crashed mid-line still gets its report.
//
// Thread-safety: pure functions of the files they read.
#pragma once

#include <string>

#include "core/status.h"

namespace atl {

struct ReportOptions {
  std::string run_dir;
  std::string chartjs;  // Chart.js's UMD build; empty: DefaultChartJs()
  std::string out;      // empty: <run_dir>/report.html
};

// <cache>/npm/node_modules/chart.js/dist/chart.umd.min.js (ATOLL_CACHE_DIR or .cache).
std::string DefaultChartJs();

// Writes the page (atomically); returns its path. InvalidArgument when run_dir holds no metrics
// (naming what was looked for) or Chart.js is missing (saying how to install it).
StatusOr<std::string> WriteReport(const ReportOptions& options);

}  // namespace atl
