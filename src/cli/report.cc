// atoll report: the run report page (train/report.h).
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "train/report.h"

namespace atl::cli {

namespace {
struct ReportArgs {
  std::string run_dir;
  std::string chartjs;
  std::string out;
};
}  // namespace

void AddReportCommand(CLI::App& app) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "report", "Write RUN_DIR/report.html: a run's charts, events and config on one page");
  cmd->add_option("run_dir", args->run_dir, "The run's directory (atoll train --out, atoll launch --out)")
      ->required();
  cmd->add_option("--out", args->out, "Write the page here instead of RUN_DIR/report.html");
  cmd->add_option("--chartjs", args->chartjs,
                  "Chart.js's UMD build (default: the npm package scripts/setup.sh installs)");
  cmd->footer(
      "One self-contained page (no server, no network): losses per site against steps, tokens\n"
      "and WAN bytes; tokens/s; the share of each step spent waiting on the WAN; the exchanges\n"
      "between sites; events (corruption found and where, sites lost and rejoined); the config;\n"
      "the planner's prediction next to what was measured when the run recorded one.\n"
      "atoll launch writes it when the run ends. Example: atoll report runs/world");
  cmd->callback([args] {
    auto path = WriteReport({args->run_dir, args->chartjs, args->out});
    ExitIfError(path.status().WithContext("report"));
    std::printf("%s\n", path->c_str());
  });
}

}  // namespace atl::cli
