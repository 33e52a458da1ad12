// temb health and temb info: one read-only call each.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "temb/cli/commands.h"
#include "temb/cli/common.h"
#include "temb/client/temb_client.h"
#include "temb/v1_convert/conversions.h"
#include "temb/v1_convert/preset_catalog.h"

namespace temb::cli {
namespace {

using ::grpc::health::v1::HealthCheckResponse;

// Parses the flags and creates the client; returns an exit code on failure.
int Connect(const std::string& command, std::vector<FlagSpec> specs,
            const std::vector<std::string>& argv, Args* args,
            std::unique_ptr<Client>* client) {
  specs.push_back({"help", FlagType::kBool, "show this help"});
  absl::StatusOr<Args> parsed = Args::Parse(specs, argv);
  if (!parsed.ok()) {
    return PrintUsage(command, std::string(parsed.status().message()), specs);
  }
  if (parsed->Bool("help").value_or(false)) {
    std::cout << "usage: temb " << command << " [flags]\n" << FlagHelp(specs);
    return kExitOk;  // and no client: the caller stops here
  }
  absl::StatusOr<ClientOptions> options = ClientOptionsFromArgs(*parsed);
  if (!options.ok()) {
    return PrintUsage(command, std::string(options.status().message()), specs);
  }
  // Health and info answer "is it up now": a default deadline of a few
  // seconds, and no retries that would hide an unavailable server.
  if (!parsed->Has("timeout")) options->deadline = absl::Seconds(2);
  if (!parsed->Has("max_attempts")) options->max_attempts = 1;
  absl::StatusOr<std::unique_ptr<Client>> created = Client::Create(*options);
  if (!created.ok()) return PrintError(created.status());
  *args = std::move(*parsed);
  *client = std::move(*created);
  return kExitOk;
}

std::string DTypeLabel(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP32:
      return "fp32";
    case v1::DTYPE_FP16:
      return "fp16";
    case v1::DTYPE_BF16:
      return "bf16";
    case v1::DTYPE_FP64:
      return "fp64";
    case v1::DTYPE_INT64:
      return "int64";
    default:
      return "fp32";
  }
}

std::string DescribeSpec(const v1::EmbeddingSpec& spec) {
  if (spec.repeat_only()) return "repeat_only";
  std::string out = spec.flip_sin_to_cos() ? "cos,sin" : "sin,cos";
  if (spec.layout() == v1::LAYOUT_INTERLEAVED) out += " interleaved";
  if (spec.frequencies_size() > 0) {
    absl::StrAppend(&out, " table[", spec.frequencies_size(), "]");
  } else {
    absl::StrAppendFormat(&out, " shift=%g P=%g", spec.downscale_freq_shift(),
                          spec.has_max_period() ? spec.max_period() : 10000.0);
    if (spec.exponent_order() == v1::EXPONENT_ORDER_SLOPE_FIRST) {
      out += " slope_first";
    }
  }
  if (spec.has_time_factor() && spec.time_factor() != 1) {
    absl::StrAppendFormat(&out, " time_factor=%g", spec.time_factor());
  }
  if (spec.has_scale() && spec.scale() != 1) {
    absl::StrAppendFormat(&out, " scale=%g", spec.scale());
  }
  if (spec.precision() == v1::PRECISION_FP64) out += " precision=fp64";
  return out;
}

// The model family a preset serves: its description up to the first colon.
std::string Family(const v1::Preset& preset) {
  const std::string& text = preset.description();
  const size_t colon = text.find(':');
  return colon == std::string::npos ? "" : text.substr(0, colon);
}

// "Which preset for my model": one line per preset, with its parts.
void PrintPresets(
    const google::protobuf::RepeatedPtrField<v1::Preset>& presets) {
  std::cout << absl::StrFormat("%-42s %-19s %-6s %s\n", "model (family)",
                               "preset", "dim", "convention / parts");
  for (const v1::Preset& preset : presets) {
    std::string parts;
    for (const v1::PresetPart& part : preset.parts()) {
      absl::StrAppend(&parts, parts.empty() ? "  parts: " : ", ", part.name(),
                      part.preset() == preset.name()
                          ? ""
                          : absl::StrCat("=", part.preset()));
    }
    std::cout << absl::StrFormat(
        "%-42s %-19s %-6s %s %s%s\n", Family(preset).substr(0, 42),
        preset.name(),
        absl::StrCat(preset.spec().dim(), preset.dim_overridable() ? "*" : ""),
        DTypeLabel(preset.default_dtype()), DescribeSpec(preset.spec()), parts);
  }
  std::cout << "(* dim may be chosen by the caller)" << std::endl;
}

std::string ModelStateLabel(v1::ModelState state) {
  switch (state) {
    case v1::MODEL_STATE_LOADING:
      return "loading";
    case v1::MODEL_STATE_READY:
      return "ready";
    case v1::MODEL_STATE_FAILED:
      return "failed";
    default:
      return "unknown";
  }
}

// The conditioning models: one line per model, then one per output with
// its row shape and bytes per row (what a step costs on the wire).
void PrintConditioningModels(const v1::ServerInfo& info) {
  const v1::RowCacheStats& cache = info.conditioning_cache();
  std::cout << absl::StrFormat(
      "conditioning models (row cache: %d hits, %d misses, %d of %d bytes):\n",
      cache.hits(), cache.misses(), cache.bytes(), cache.capacity_bytes());
  if (info.conditioning_models_size() == 0) {
    std::cout << "  none (temb-server --model_repository)" << std::endl;
    return;
  }
  std::cout << absl::StrFormat("  %-24s %-8s %-14s %-5s %-7s %-12s %s\n",
                               "model", "state", "family", "dtype", "width",
                               "weights", "inputs");
  for (const v1::ConditioningModel& model : info.conditioning_models()) {
    if (model.state() != v1::MODEL_STATE_READY) {
      std::cout << absl::StrFormat("  %-24s %-8s %s\n", model.name(),
                                   ModelStateLabel(model.state()),
                                   model.message());
      continue;
    }
    std::string inputs;
    for (const v1::ConditioningInput& input : model.inputs()) {
      absl::StrAppend(
          &inputs, inputs.empty() ? "" : ", ", input.name(),
          input.width() > 0 ? absl::StrCat("[", input.width(), "]") : "");
    }
    std::cout << absl::StrFormat(
        "  %-24s %-8s %-14s %-5s %-7d %-12s %s\n", model.name(),
        ModelStateLabel(model.state()), model.family(),
        DTypeLabel(model.dtype()), model.width(),
        absl::StrFormat("%.1f MiB", model.weight_bytes() / 1048576.0), inputs);
    int64_t row_bytes = 0;
    for (const v1::ConditioningOutput& output : model.outputs()) {
      std::cout << absl::StrFormat(
          "      %-22s [N, %s] %s  %d bytes/row\n", output.name(),
          absl::StrJoin(output.row_shape(), ", "), DTypeLabel(output.dtype()),
          output.row_bytes());
      row_bytes += output.row_bytes();
    }
    std::cout << absl::StrFormat("      %-22s %d bytes/row\n", "(all outputs)",
                                 row_bytes);
  }
}

}  // namespace

int RunHealth(const std::vector<std::string>& argv) {
  std::vector<FlagSpec> specs = ConnectionFlags();
  specs.push_back({"service", FlagType::kString,
                   "service name to check (default: the whole server)"});
  Args args;
  std::unique_ptr<Client> client;
  if (int rc = Connect("health", specs, argv, &args, &client);
      rc != kExitOk || !client) {
    return rc;
  }
  absl::StatusOr<HealthCheckResponse::ServingStatus> status =
      client->Health(args.String("service").value_or(""));
  if (!status.ok()) return PrintError(status.status());
  std::cout << HealthCheckResponse::ServingStatus_Name(*status) << std::endl;
  return *status == HealthCheckResponse::SERVING ? kExitOk : kExitError;
}

int RunInfo(const std::vector<std::string>& argv) {
  std::vector<FlagSpec> specs = ConnectionFlags();
  specs.push_back(
      {"local", FlagType::kBool, "list the built-in presets without a server"});
  // --local needs no connection: parse for it first.
  if (absl::StatusOr<Args> local = Args::Parse(specs, argv);
      local.ok() && local->Bool("local").value_or(false)) {
    v1::ServerInfo info;
    for (const Preset& preset : BuiltInPresetCatalog().presets()) {
      PresetToProto(preset, info.add_presets());
    }
    PrintPresets(info.presets());
    return kExitOk;
  }
  Args args;
  std::unique_ptr<Client> client;
  if (int rc = Connect("info", specs, argv, &args, &client);
      rc != kExitOk || !client) {
    return rc;
  }
  absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
  if (!info.ok()) return PrintError(info.status());
  const v1::Limits& limits = info->limits();
  std::cout << "version:  " << info->version() << "\n"
            << "backend:  " << info->backend() << "\n"
            << "device:   " << info->device() << "\n"
            << "limits:   max_dim=" << limits.max_dim()
            << " max_batch=" << limits.max_batch()
            << " max_output_bytes=" << limits.max_output_bytes()
            << " max_message_bytes=" << limits.max_message_bytes()
            << " max_request_bytes=" << limits.max_request_bytes() << "\n"
            << "presets:\n";
  PrintPresets(info->presets());
  PrintConditioningModels(*info);
  return kExitOk;
}

}  // namespace temb::cli
