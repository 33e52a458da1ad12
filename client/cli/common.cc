#include "temb/cli/common.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "temb/base/file_reader.h"
#include "temb/base/status_macros.h"
#include "temb/v1_convert/conversions.h"

namespace temb::cli {

int PrintError(const absl::Status& status) {
  std::cerr << "error: " << StatusCodeName(static_cast<int>(status.code()))
            << ": " << status.message() << std::endl;
  return kExitError;
}

int PrintUsage(const std::string& command, const std::string& message,
               const std::vector<FlagSpec>& specs) {
  std::cerr << "usage error: " << message << "\n\nusage: temb " << command
            << " [flags]\n"
            << FlagHelp(specs);
  return kExitUsage;
}

std::vector<FlagSpec> ConnectionFlags() {
  return {
      {"target", FlagType::kString,
       "server URI, e.g. localhost:50051 or "
       "ipv4:127.0.0.1:7001,127.0.0.1:7002"},
      {"timeout", FlagType::kDuration, "per-call deadline (default 30s)"},
      {"channels", FlagType::kInt, "gRPC channels in the pool (default 1)"},
      {"max_attempts", FlagType::kInt,
       "attempts per call for UNAVAILABLE/CANCELLED, 1 = no retry "
       "(default 4)"},
      {"tls", FlagType::kBool, "use TLS with the default roots"},
      {"tls_ca", FlagType::kString,
       "PEM CA bundle to verify the server with (implies --tls)"},
      {"tls_cert", FlagType::kString,
       "PEM client certificate for mutual TLS (with --tls_key)"},
      {"tls_key", FlagType::kString, "PEM private key of --tls_cert"},
      {"tls_server_name", FlagType::kString,
       "name expected in the server certificate (default: the target host)"},
      {"auth_token_file", FlagType::kString,
       "file whose first line is the bearer token to send"},
  };
}

absl::StatusOr<ClientOptions> ClientOptionsFromArgs(const Args& args) {
  ClientOptions options;
  options.target = args.String("target").value_or("");
  if (options.target.empty()) {
    return absl::InvalidArgumentError("--target is required");
  }
  options.deadline = args.Duration("timeout").value_or(options.deadline);
  const int64_t channels = args.Int("channels").value_or(options.channels);
  const int64_t attempts =
      args.Int("max_attempts").value_or(options.max_attempts);
  if (channels < 1 || channels > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--channels must be in [1, 1024], got ", channels));
  }
  if (attempts < 1 || attempts > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_attempts must be >= 1, got ", attempts));
  }
  options.channels = static_cast<int>(channels);
  options.max_attempts = static_cast<int>(attempts);
  options.tls = args.Bool("tls").value_or(false);
  options.tls_ca_file = args.String("tls_ca").value_or("");
  options.tls_cert_file = args.String("tls_cert").value_or("");
  options.tls_key_file = args.String("tls_key").value_or("");
  options.tls_server_name = args.String("tls_server_name").value_or("");
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (auto path = args.String("auth_token_file")) {
    ASSIGN_OR_RETURN(std::string contents,
                     ReadFile(*path, "--auth_token_file"));
    const absl::string_view line =
        absl::string_view(contents).substr(0, contents.find_first_of("\r\n"));
    options.auth_token = std::string(absl::StripAsciiWhitespace(line));
    if (options.auth_token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--auth_token_file '",
                                                     *path,
                                                     "' starts with an empty "
                                                     "line"));
    }
  }
  return options;
}

std::vector<FlagSpec> SpecFlags() {
  return {
      {"preset", FlagType::kString, "preset name (see `temb info`)"},
      {"dim", FlagType::kInt, "embedding width D"},
      {"max_period", FlagType::kDouble, "P (default 10000)"},
      {"flip_sin_to_cos", FlagType::kBool, "[cos, sin] instead of [sin, cos]"},
      {"downscale_freq_shift", FlagType::kDouble, "0 (LDM) or 1 (DDPM)"},
      {"scale", FlagType::kDouble, "multiplies the angle (default 1)"},
      {"time_factor", FlagType::kDouble, "multiplies t first (Flux: 1000)"},
      {"repeat_only", FlagType::kBool, "every column equals t"},
      {"layout", FlagType::kString, "halves | interleaved"},
      {"exponent_order", FlagType::kString,
       "divide_last (default) | slope_first: the float32 order of "
       "-ln(P) * i / (H - shift) in the model's code"},
      {"precision", FlagType::kString, "fp32 | fp64"},
      {"dtype", FlagType::kString, "fp32 | fp16 | bf16 | fp64"},
      {"timestep_dtype", FlagType::kString,
       "fp32 | fp16 | bf16: t rounded (and multiplied by time_factor) in "
       "this dtype first, as a pipeline of that dtype does"},
  };
}

v1::NamedTensor Float32Input(absl::string_view name,
                             const std::vector<float>& values,
                             const std::vector<int64_t>& shape) {
  v1::NamedTensor input;
  input.set_name(std::string(name));
  v1::Tensor* tensor = input.mutable_tensor();
  tensor->set_dtype(v1::DTYPE_FP32);
  tensor->mutable_shape()->Add(shape.begin(), shape.end());
  tensor->set_data(std::string(reinterpret_cast<const char*>(values.data()),
                               values.size() * sizeof(float)));
  return input;
}

absl::StatusOr<SpecRequest> SpecRequestFromArgs(const Args& args) {
  SpecRequest request;
  request.preset = args.String("preset").value_or("");
  if (auto dim = args.Int("dim")) {
    if (*dim < INT32_MIN || *dim > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("--dim out of the int32 range: ", *dim));
    }
    request.dim = static_cast<int>(*dim);
  }
  request.max_period = args.Double("max_period");
  request.flip_sin_to_cos = args.Bool("flip_sin_to_cos");
  request.downscale_freq_shift = args.Double("downscale_freq_shift");
  request.scale = args.Double("scale");
  request.time_factor = args.Double("time_factor");
  request.repeat_only = args.Bool("repeat_only");
  if (auto layout = args.String("layout")) {
    if (*layout == "halves") {
      request.layout = Layout::kHalves;
    } else if (*layout == "interleaved") {
      request.layout = Layout::kInterleaved;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--layout must be halves or interleaved, got '", *layout, "'"));
    }
  }
  if (auto order = args.String("exponent_order")) {
    if (*order == "divide_last") {
      request.exponent_order = ExponentOrder::kDivideLast;
    } else if (*order == "slope_first") {
      request.exponent_order = ExponentOrder::kSlopeFirst;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--exponent_order must be divide_last or slope_first, "
                       "got '",
                       *order, "'"));
    }
  }
  if (auto precision = args.String("precision")) {
    if (*precision == "fp32") {
      request.precision = Precision::kFloat32;
    } else if (*precision == "fp64") {
      request.precision = Precision::kFloat64;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--precision must be fp32 or fp64, got '", *precision, "'"));
    }
  }
  for (const auto& [flag, field] :
       {std::pair{"dtype", &request.dtype},
        std::pair{"timestep_dtype", &request.timestep_dtype}}) {
    if (auto name = args.String(flag)) {
      absl::StatusOr<DType> parsed = ParseDType(*name);
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag, ": ", parsed.status().message()));
      }
      *field = *parsed;
    }
  }
  return request;
}

v1::EmbedRequest EmbedRequestFor(const SpecRequest& spec,
                                 const std::vector<float>& timesteps) {
  v1::EmbedRequest request;
  SpecRequestToProto(spec, &request);
  request.mutable_timesteps()->Add(timesteps.begin(), timesteps.end());
  return request;
}

absl::StatusOr<std::vector<PartArgs>> ParseParts(
    const std::vector<std::string>& flags) {
  std::vector<PartArgs> parts;
  for (const std::string& text : flags) {
    const size_t colon = text.find(':');
    if (colon == std::string::npos || colon == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--part must be NAME:TIMESTEPS, e.g. guidance:3.5, got '", text,
          "'"));
    }
    PartArgs part;
    part.name = text.substr(0, colon);
    ASSIGN_OR_RETURN(part.timesteps, ParseTimesteps(text.substr(colon + 1)));
    parts.push_back(std::move(part));
  }
  return parts;
}

v1::EmbedRequest PartsRequestFor(const SpecRequest& spec,
                                 const std::vector<PartArgs>& parts) {
  v1::EmbedRequest request;
  SpecRequestToProto(spec, &request);
  for (const PartArgs& part : parts) {
    v1::EmbedPart* entry = request.add_parts();
    entry->set_name(part.name);
    entry->mutable_timesteps()->Add(part.timesteps.begin(),
                                    part.timesteps.end());
  }
  return request;
}

absl::StatusOr<std::vector<float>> ParseTimesteps(const std::string& text) {
  std::string content = text;
  if (absl::StartsWith(text, "@")) {
    ASSIGN_OR_RETURN(content, ReadFile(text.substr(1), "timesteps file"));
  }
  std::vector<float> values;
  for (absl::string_view token : absl::StrSplit(
           content, absl::ByAnyChar(", \t\r\n"), absl::SkipEmpty())) {
    const std::string item(token);
    char* end = nullptr;
    errno = 0;
    // strtof rounds the decimal text once, straight to float32.
    const float value = std::strtof(item.c_str(), &end);
    if (end != item.c_str() + item.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("timesteps: cannot parse '", item, "' as a number"));
    }
    values.push_back(value);
  }
  return values;
}

}  // namespace temb::cli
