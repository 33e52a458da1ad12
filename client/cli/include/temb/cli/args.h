// A small command-line parser for the temb subcommands.
//
// Each subcommand declares its flags; the parser rejects unknown flags and
// malformed values up front (a usage error, exit code 2) and remembers which
// flags were given, so that unset spec fields stay unset in the request and
// the server's preset rules apply.  absl::ParseCommandLine fits neither need:
// its flags are global to the binary and it exits with status 1 on errors.
#ifndef TEMB_CLI_ARGS_H_
#define TEMB_CLI_ARGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace temb::cli {

// kStrings: a string flag that may be given several times (--part).
enum class FlagType { kString, kInt, kDouble, kBool, kDuration, kStrings };

struct FlagSpec {
  std::string name;
  FlagType type;
  std::string help;
};

class Args {
 public:
  // Accepts --name=value, --name value (not for booleans), --name and
  // --noname (booleans).  INVALID_ARGUMENT naming the flag for an unknown
  // flag, a missing or malformed value, or a positional argument.
  static absl::StatusOr<Args> Parse(const std::vector<FlagSpec>& specs,
                                    const std::vector<std::string>& argv);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }

  // Values of given flags; std::nullopt when the flag was not given.  The
  // type must match the flag's declared type (checked by Parse).
  std::optional<std::string> String(const std::string& name) const;
  std::optional<int64_t> Int(const std::string& name) const;
  std::optional<double> Double(const std::string& name) const;
  std::optional<bool> Bool(const std::string& name) const;
  std::optional<absl::Duration> Duration(const std::string& name) const;
  // Every value of a kStrings flag, in command-line order (empty if none).
  std::vector<std::string> Strings(const std::string& name) const;

 private:
  std::map<std::string, std::string> values_;  // the last value of each flag
  std::map<std::string, std::vector<std::string>> lists_;  // kStrings flags
};

// "  --name  help" lines for a usage message.
std::string FlagHelp(const std::vector<FlagSpec>& specs);

}  // namespace temb::cli

#endif  // TEMB_CLI_ARGS_H_
