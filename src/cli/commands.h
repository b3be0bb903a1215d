// Subcommand registration. Each subcommand lives in its own file (data.cc, train.cc, ...) and
// registers itself on the root app. A subcommand's callback runs the command and, on error,
// prints the Status and exits with its code (2 for bad input, 1 for runtime failures) via
// atl::ExitIfError.
#pragma once

#include <CLI/CLI.hpp>

namespace atl::cli {

void AddDataCommands(CLI::App& app);    // data.cc:   atoll data prepare | encode | check-tokenizer
void AddTrainCommand(CLI::App& app);    // train.cc:  atoll train
void AddEvalCommand(CLI::App& app);     // eval.cc:   atoll eval
void AddSampleCommand(CLI::App& app);   // sample.cc: atoll sample
void AddPlanCommands(CLI::App& app);    // plan.cc:   atoll plan ...
void AddCoordinatorCommand(CLI::App& app);  // coordinator.cc: atoll coordinator
void AddCertsCommand(CLI::App& app);        // certs.cc:       atoll certs
void AddLaunchCommand(CLI::App& app);       // launch.cc:      atoll launch
void AddReplayCommand(CLI::App& app);       // replay.cc:      atoll replay
void AddSdcCommand(CLI::App& app);          // sdc.cc:         atoll sdc-campaign
void AddReportCommand(CLI::App& app);       // report.cc:      atoll report

}  // namespace atl::cli
