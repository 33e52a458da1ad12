// The temb subcommands.  Each takes the arguments after its name and returns
// the process exit code (kExitOk, kExitError or kExitUsage, see common.h).
#ifndef TEMB_CLI_COMMANDS_H_
#define TEMB_CLI_COMMANDS_H_

#include <string>
#include <vector>

namespace temb::cli {

int RunEmbed(const std::vector<std::string>& argv);
int RunBench(const std::vector<std::string>& argv);
int RunHealth(const std::vector<std::string>& argv);
int RunInfo(const std::vector<std::string>& argv);
// In process only: a model's time conditioning from its checkpoint.
int RunCondition(const std::vector<std::string>& argv);

}  // namespace temb::cli

#endif  // TEMB_CLI_COMMANDS_H_
