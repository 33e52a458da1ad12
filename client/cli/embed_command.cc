// temb embed: one embedding request, remote (--target) or in-process
// (--local, through the same service core the server runs).
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "temb/cli/commands.h"
#include "temb/cli/common.h"
#include "temb/cli/output.h"
#include "temb/client/temb_client.h"
#include "temb/core/embed_service.h"
#include "temb/core/presets.h"
#include "temb/kernels/registry.h"
#include "temb/v1_convert/conversions.h"
#include "temb/v1_convert/preset_catalog.h"

namespace temb::cli {
namespace {

// The embedding with its storage, from either path.
struct Result {
  int64_t rows = 0;
  int64_t cols = 0;
  DType dtype = DType::kFloat32;
  std::string data;
};

std::vector<FlagSpec> EmbedFlags() {
  std::vector<FlagSpec> specs = ConnectionFlags();
  std::vector<FlagSpec> spec_flags = SpecFlags();
  specs.insert(specs.end(), spec_flags.begin(), spec_flags.end());
  specs.push_back({"local", FlagType::kBool,
                   "compute in-process instead of calling a server"});
  specs.push_back({"timesteps", FlagType::kString,
                   "comma list, or @file of numbers (required)"});
  specs.push_back({"format", FlagType::kString, "json | npy | table"});
  specs.push_back({"help", FlagType::kBool, "show this help"});
  return specs;
}

absl::StatusOr<Result> EmbedLocal(const SpecRequest& spec,
                                  const std::vector<float>& timesteps) {
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      CreateBackend(BackendChoice::kAuto);
  if (!backend.ok()) return backend.status();
  EmbedService service(std::move(*backend), BuiltInPresetCatalog(), {});
  absl::StatusOr<Embedding> embedding = service.Embed(spec, timesteps);
  if (!embedding.ok()) return embedding.status();
  return Result{embedding->rows, embedding->spec.dim, embedding->spec.dtype,
                std::move(embedding->data)};
}

absl::StatusOr<Result> EmbedRemote(const ClientOptions& options,
                                   const SpecRequest& spec,
                                   const std::vector<float>& timesteps) {
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  if (!client.ok()) return client.status();
  absl::StatusOr<v1::EmbedResponse> response =
      (*client)->Embed(EmbedRequestFor(spec, timesteps));
  if (!response.ok()) return response.status();
  v1::Tensor* tensor = response->mutable_embedding();
  absl::StatusOr<std::optional<DType>> dtype =
      DTypeFromProto(tensor->dtype(), "embedding.dtype");
  if (!dtype.ok()) return dtype.status();
  if (!dtype->has_value()) {
    return absl::InvalidArgumentError("server sent a tensor without a dtype");
  }
  if (tensor->shape_size() != 2) {
    return absl::InternalError("server sent a tensor that is not 2-D");
  }
  Result result{tensor->shape(0), tensor->shape(1), **dtype,
                std::move(*tensor->mutable_data())};
  const uint64_t expected = static_cast<uint64_t>(result.rows) *
                            static_cast<uint64_t>(result.cols) *
                            DTypeSize(result.dtype);
  if (result.rows < 0 || result.cols < 0 || result.data.size() != expected) {
    return absl::InternalError(
        "server sent a tensor whose size disagrees with its shape");
  }
  return result;
}

}  // namespace

int RunEmbed(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> specs = EmbedFlags();
  absl::StatusOr<Args> args = Args::Parse(specs, argv);
  if (!args.ok()) {
    return PrintUsage("embed", std::string(args.status().message()), specs);
  }
  if (args->Bool("help").value_or(false)) {
    std::cout << "usage: temb embed [flags]\n" << FlagHelp(specs);
    return kExitOk;
  }
  const bool local = args->Bool("local").value_or(false);
  if (local == args->Has("target")) {
    return PrintUsage("embed", "give exactly one of --target and --local",
                      specs);
  }
  const std::string format = args->String("format").value_or("json");
  if (format != "json" && format != "npy" && format != "table") {
    return PrintUsage("embed", "--format must be json, npy or table", specs);
  }
  if (!args->Has("timesteps")) {
    return PrintUsage("embed", "--timesteps is required", specs);
  }
  absl::StatusOr<SpecRequest> spec = SpecRequestFromArgs(*args);
  if (!spec.ok()) {
    return PrintUsage("embed", std::string(spec.status().message()), specs);
  }
  absl::StatusOr<std::vector<float>> timesteps =
      ParseTimesteps(*args->String("timesteps"));
  if (!timesteps.ok()) return PrintError(timesteps.status());

  absl::StatusOr<Result> result;
  if (local) {
    result = EmbedLocal(*spec, *timesteps);
  } else {
    absl::StatusOr<ClientOptions> options = ClientOptionsFromArgs(*args);
    if (!options.ok()) {
      return PrintUsage("embed", std::string(options.status().message()),
                        specs);
    }
    result = EmbedRemote(*options, *spec, *timesteps);
  }
  if (!result.ok()) return PrintError(result.status());

  const TensorView view{result->rows, result->cols, result->dtype,
                        result->data};
  std::string out;
  if (format == "json") {
    out = ToJson(view);
  } else if (format == "npy") {
    out = ToNpy(view);
  } else {
    out = ToTable(view, *timesteps);
  }
  if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size() ||
      std::fflush(stdout) != 0) {
    return PrintError(absl::UnavailableError("cannot write to stdout"));
  }
  return kExitOk;
}

}  // namespace temb::cli
