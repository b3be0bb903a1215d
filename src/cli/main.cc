// atoll: train transformer language models from a laptop to many datacenters.
#include <cstdio>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"atoll: train GPT language models on one machine, a site, or many datacenters"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  atl::cli::AddDataCommands(app);
  atl::cli::AddTrainCommand(app);
  atl::cli::AddEvalCommand(app);
  atl::cli::AddReportCommand(app);
  atl::cli::AddSampleCommand(app);
  atl::cli::AddPlanCommands(app);
  atl::cli::AddCoordinatorCommand(app);
  atl::cli::AddCertsCommand(app);
  atl::cli::AddLaunchCommand(app);
  atl::cli::AddReplayCommand(app);
  atl::cli::AddSdcCommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;  // bad arguments are bad input
  }
  return 0;
}
