// PLACEHOLDER: replaced by the owner of this subcommand.
#include "cli/commands.h"

namespace atl::cli {
void AddSampleCommand(CLI::App& app) { (void)app; }
}  // namespace atl::cli
