// Pieces shared by the temb subcommands: exit codes, error printing, the
// connection flags and the embedding-spec flags.
#ifndef TEMB_CLI_COMMON_H_
#define TEMB_CLI_COMMON_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "temb/cli/args.h"
#include "temb/client/temb_client.h"
#include "temb/core/embed_service.h"
#include "temb/v1/temb.pb.h"

namespace temb::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;  // an RPC or computation failed
inline constexpr int kExitUsage = 2;  // bad command line

// Prints "error: CODE_NAME: message" to stderr; returns kExitError.
int PrintError(const absl::Status& status);
// Prints "usage error: message" and the command's flags; returns kExitUsage.
int PrintUsage(const std::string& command, const std::string& message,
               const std::vector<FlagSpec>& specs);

// --target, --timeout, --channels, --max_attempts, the TLS flags (--tls,
// --tls_ca, --tls_cert, --tls_key, --tls_server_name) and --auth_token_file.
std::vector<FlagSpec> ConnectionFlags();
absl::StatusOr<ClientOptions> ClientOptionsFromArgs(const Args& args);

// --preset, --dim and every spec field under diffusers' names, plus --dtype.
std::vector<FlagSpec> SpecFlags();

// The spec flags as the service core's request; unset flags stay unset.
// INVALID_ARGUMENT for an unparsable --layout, --exponent_order, --precision,
// --dtype or --timestep_dtype.
absl::StatusOr<SpecRequest> SpecRequestFromArgs(const Args& args);

// The float32 values `values` of `shape` as a temb.v1 input (Condition).
v1::NamedTensor Float32Input(absl::string_view name,
                             const std::vector<float>& values,
                             const std::vector<int64_t>& shape);

// The same request in temb.v1 form, with the given timesteps.
v1::EmbedRequest EmbedRequestFor(const SpecRequest& spec,
                                 const std::vector<float>& timesteps);

// One embedding of a multi-part call, from --part NAME:TIMESTEPS (embed and
// bench), or the one unnamed embedding of --timesteps.
struct PartArgs {
  std::string name;
  std::vector<float> timesteps;
  std::vector<int64_t> shape;  // empty: [N]
};

// The --part flags' values; INVALID_ARGUMENT naming the flag for one that is
// not NAME:TIMESTEPS.
absl::StatusOr<std::vector<PartArgs>> ParseParts(
    const std::vector<std::string>& flags);

// A request with `parts` (named ones) in temb.v1 form.
v1::EmbedRequest PartsRequestFor(const SpecRequest& spec,
                                 const std::vector<PartArgs>& parts);

// Parses "1,2.5,999" or "@path" (a file of numbers separated by commas and
// whitespace).  Each value is rounded once, from its decimal text, to
// float32; "nan" and "inf" parse (the server decides what is valid).
absl::StatusOr<std::vector<float>> ParseTimesteps(const std::string& text);

}  // namespace temb::cli

#endif  // TEMB_CLI_COMMON_H_
