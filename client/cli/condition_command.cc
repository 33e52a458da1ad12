// temb condition: a diffusion transformer's time conditioning (timestep
// MLP, guidance and pooled-text embedders, every block's modulation) from
// the model's own diffusers checkpoint, computed in process on the CPU
// (--model_dir, temb/models/conditioning_model.h) or by a server's
// conditioning model (--target and --model, temb.v1 Condition), and written
// as a safetensors file, or a .npy file for one output.  Both modes write
// the same file for the same numbers, so they compare byte for byte.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "temb/base/file_reader.h"
#include "temb/base/quoted.h"
#include "temb/base/status_macros.h"
#include "temb/cli/commands.h"
#include "temb/cli/common.h"
#include "temb/cli/output.h"
#include "temb/client/temb_client.h"
#include "temb/core/conditioning_service.h"
#include "temb/kernels/registry.h"
#include "temb/models/conditioning_model.h"
#include "temb/models/safetensors.h"

namespace temb::cli {
namespace {

std::vector<FlagSpec> ConditionFlags() {
  std::vector<FlagSpec> flags = {
      {"model_dir", FlagType::kString,
       "compute in process from this diffusers model folder (config.json "
       "and safetensors weights)"},
      {"model", FlagType::kString,
       "with --target: the server's conditioning model (temb info lists "
       "them)"},
      {"timesteps", FlagType::kString,
       "the scheduler's timesteps, e.g. 999,500 or @file"},
      {"timestep", FlagType::kString,
       "with --model_dir, instead of --timesteps: the transformer forward's "
       "timestep as the pipeline passes it (e.g. t / 1000 in bf16), taken "
       "as it is"},
      {"guidance", FlagType::kDouble,
       "the guidance scale, for models with guidance_embeds"},
      {"pooled", FlagType::kString,
       ".npy file of float32 pooled text embeddings, [N, P] or [P]"},
      {"inputs", FlagType::kString,
       "a family's other inputs, ';'-separated: name=v1,v2,... or "
       "name=@file.npy (float32), e.g. resolution=1024,768;aspect_ratio=0.75"},
      {"outputs", FlagType::kString,
       "comma-separated outputs (default: all of the family's); any value "
       "of the family's description (server/models/families/) by name"},
      {"out", FlagType::kString,
       "the file to write: .safetensors (every output), or .npy (exactly "
       "one output; bf16 as raw uint16 bits)"},
      {"torch_dtype", FlagType::kString,
       "with --model_dir: compute in this dtype, as from_pretrained("
       "torch_dtype=...): fp32, bf16 or fp16 (default: the folder's "
       "temb.json, else the stored dtype)"},
      {"threads", FlagType::kInt,
       "with --model_dir: CPU threads (default: all cores)"},
      {"repeat", FlagType::kInt,
       "with --model_dir: compute this many times (with the row cache) and "
       "report timings"},
      {"cache_mib", FlagType::kInt,
       "with --model_dir: row cache capacity in MiB (default 256)"},
      {"device", FlagType::kString,
       "with --model_dir: where the Linear layers run: cpu (default) or "
       "cuda (cuBLASLt on GPU 0, as the server's --conditioning_device)"},
      {"help", FlagType::kBool, "show this help"},
  };
  // --target (a server) and its connection flags.
  for (FlagSpec& flag : ConnectionFlags()) flags.push_back(std::move(flag));
  return flags;
}

// The float32 values of a little-endian .npy file of dtype '<f4' in C
// order, and its shape.
absl::StatusOr<std::vector<float>> ReadNpyFloat32(
    const std::string& path, std::vector<int64_t>* shape,
    const std::string& what = "--pooled file") {
  ASSIGN_OR_RETURN(const std::string bytes, ReadFile(path, what));
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": ", why));
  };
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) {
    return bad("not a .npy file");
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len = 0;
  size_t header_start = 0;
  if (major == 1) {
    header_len =
        static_cast<unsigned char>(bytes[8]) |
        (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return bad("truncated header");
    for (int i = 3; i >= 0; --i) {
      header_len = (header_len << 8) | static_cast<unsigned char>(bytes[8 + i]);
    }
    header_start = 12;
  } else {
    return bad("unknown .npy version");
  }
  if (header_start + header_len > bytes.size()) return bad("truncated header");
  const std::string header = bytes.substr(header_start, header_len);
  if (header.find("'descr': '<f4'") == std::string::npos) {
    return bad("dtype must be float32 ('<f4')");
  }
  if (header.find("'fortran_order': False") == std::string::npos) {
    return bad("must be in C order");
  }
  const size_t open = header.find("'shape': (");
  const size_t close = header.find(')', open);
  if (open == std::string::npos || close == std::string::npos) {
    return bad("no shape");
  }
  shape->clear();
  int64_t elements = 1;
  for (absl::string_view dim :
       absl::StrSplit(header.substr(open + 10, close - open - 10), ',',
                      absl::SkipWhitespace())) {
    int64_t value;
    if (!absl::SimpleAtoi(dim, &value) || value < 0 || value > (1 << 24)) {
      return bad("malformed shape");
    }
    shape->push_back(value);
    elements *= value;
  }
  const size_t data_start = header_start + header_len;
  if (bytes.size() - data_start != static_cast<size_t>(elements) * 4) {
    return bad(absl::StrCat("holds ", bytes.size() - data_start,
                            " data bytes, shape needs ", elements * 4));
  }
  std::vector<float> values(static_cast<size_t>(elements));
  std::memcpy(values.data(), bytes.data() + data_start, values.size() * 4);
  return values;
}

// --inputs: "name=1,2;other=@values.npy" into `inputs`.
absl::Status ParseNamedInputs(const std::string& text,
                              models::ConditioningInputs* inputs) {
  for (absl::string_view entry :
       absl::StrSplit(text, ';', absl::SkipWhitespace())) {
    const size_t equals = entry.find('=');
    const std::string name(absl::StripAsciiWhitespace(entry.substr(0, equals)));
    if (equals == absl::string_view::npos || name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--inputs: '", entry, "' is not name=values or name=@file.npy"));
    }
    if (inputs->values.count(name) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--inputs: ", name, " is given twice"));
    }
    const std::string value(
        absl::StripAsciiWhitespace(entry.substr(equals + 1)));
    absl::StatusOr<std::vector<float>> values;
    if (absl::StartsWith(value, "@") && absl::EndsWith(value, ".npy")) {
      std::vector<int64_t> shape;
      values = ReadNpyFloat32(value.substr(1), &shape,
                              absl::StrCat("--inputs ", name, " file"));
    } else {
      values = ParseTimesteps(value);
    }
    if (!values.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--inputs: ", name, ": ", values.status().message()));
    }
    if (values->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--inputs: ", name, ": no values"));
    }
    inputs->values[name] = *std::move(values);
  }
  return absl::OkStatus();
}

// A server's answer as the tensors the in-process mode writes: the same
// names, order, shapes and bytes.
absl::StatusOr<std::vector<models::TensorToWrite>> TensorsFromResponse(
    const v1::ConditionResponse& response) {
  std::vector<models::TensorToWrite> tensors;
  for (const v1::NamedTensor& output : response.outputs()) {
    DType dtype;
    switch (output.tensor().dtype()) {
      case v1::DTYPE_FP32:
        dtype = DType::kFloat32;
        break;
      case v1::DTYPE_FP16:
        dtype = DType::kFloat16;
        break;
      case v1::DTYPE_BF16:
        dtype = DType::kBFloat16;
        break;
      case v1::DTYPE_FP64:
        dtype = DType::kFloat64;
        break;
      default:
        // Only per-token timesteps give an int64 index, and --timesteps is
        // one list.
        return absl::InternalError(absl::StrCat(
            "the server answered output ", Quoted(output.name()),
            " with dtype ", output.tensor().dtype(), ", which is not written"));
    }
    const std::string& data = output.tensor().data();
    tensors.push_back(
        {output.name(),
         dtype,
         {output.tensor().shape().begin(), output.tensor().shape().end()},
         std::vector<uint8_t>(data.begin(), data.end())});
  }
  return tensors;
}

// --out: a .npy file for exactly one tensor, else a safetensors file.
absl::Status WriteOutputs(const std::string& path,
                          const std::vector<models::TensorToWrite>& tensors) {
  if (!absl::EndsWith(path, ".npy")) {
    return models::WriteSafetensors(path, tensors);
  }
  if (tensors.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--out ", path, ": a .npy file holds one tensor and there are ",
        tensors.size(), "; name one with --outputs, or write .safetensors"));
  }
  const models::TensorToWrite& tensor = tensors[0];
  TensorView view;
  view.dtype = tensor.dtype;
  view.data = absl::string_view(
      reinterpret_cast<const char*>(tensor.data.data()), tensor.data.size());
  // [N, ..., last]: rows of the last extent, shaped by the rest.
  view.cols = tensor.shape.empty() ? 1 : tensor.shape.back();
  view.row_shape.assign(tensor.shape.begin(), tensor.shape.end() - 1);
  view.rows = 1;
  for (int64_t extent : view.row_shape) view.rows *= extent;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << ToNpy(view);
  out.close();
  if (!out) {
    return absl::UnavailableError(
        absl::StrCat("--out ", path, ": could not be written"));
  }
  return absl::OkStatus();
}

// The remote mode: one Condition call.
absl::StatusOr<std::vector<models::TensorToWrite>> ConditionOnServer(
    const Args& args, const std::vector<float>& timesteps,
    const std::vector<float>* pooled, const std::vector<int64_t>& pooled_shape,
    const std::vector<std::string>& outputs) {
  ASSIGN_OR_RETURN(const ClientOptions options, ClientOptionsFromArgs(args));
  ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Create(options));
  v1::ConditionRequest request;
  request.set_model(*args.String("model"));
  *request.add_inputs() = Float32Input(
      kConditionTimesteps, timesteps, {static_cast<int64_t>(timesteps.size())});
  if (args.Has("guidance")) {
    *request.add_inputs() =
        Float32Input(kConditionGuidance,
                     {static_cast<float>(*args.Double("guidance"))}, {1});
  }
  if (pooled != nullptr) {
    *request.add_inputs() =
        Float32Input(kConditionPooled, *pooled, pooled_shape);
  }
  for (const std::string& name : outputs) request.add_outputs(name);
  absl::StatusOr<v1::ConditionResponse> response = client->Condition(request);
  if (absl::IsResourceExhausted(response.status()) &&
      absl::StrContains(response.status().message(), "larger than max")) {
    // gRPC's refusal of a message over the server's receive limit names no
    // flag: say which input made it that large.
    std::string sizes;
    for (const v1::NamedTensor& input : request.inputs()) {
      absl::StrAppend(&sizes, sizes.empty() ? "" : ", ", input.name(), " ",
                      input.tensor().data().size(), " bytes");
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        response.status().message(), ": the request's inputs (", sizes,
        ") are over the server's request limit (temb info: "
        "max_request_bytes); give --pooled one row [P] when every timestep "
        "shares it, or split --timesteps over several calls"));
  }
  if (!response.ok()) return response.status();
  return TensorsFromResponse(*response);
}

}  // namespace

int RunCondition(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> specs = ConditionFlags();
  absl::StatusOr<Args> args = Args::Parse(specs, argv);
  if (!args.ok()) {
    return PrintUsage("condition", std::string(args.status().message()), specs);
  }
  if (args->Bool("help").value_or(false)) {
    std::cout << "usage: temb condition [flags]\n" << FlagHelp(specs);
    return kExitOk;
  }
  const bool remote = args->Has("target");
  if (remote == args->Has("model_dir")) {
    return PrintUsage("condition",
                      "give either --model_dir (compute in process) or "
                      "--target with --model (a server's conditioning model)",
                      specs);
  }
  if (!remote && args->Has("model")) {
    return PrintUsage("condition", "--model needs --target", specs);
  }
  if (remote && args->Has("inputs")) {
    return PrintUsage("condition",
                      "--inputs (a family's extra inputs) is computed in "
                      "process only, with --model_dir",
                      specs);
  }
  if (remote && args->Has("device")) {
    return PrintUsage("condition",
                      "--device is for --model_dir; a server's models run "
                      "where its --conditioning_device puts them",
                      specs);
  }
  if (remote && args->Has("torch_dtype")) {
    return PrintUsage("condition",
                      "--torch_dtype is for --model_dir; a server's model "
                      "is computed in the dtype its folder's temb.json sets",
                      specs);
  }
  for (const char* required : {remote ? "model" : "model_dir", "out"}) {
    if (!args->Has(required)) {
      return PrintUsage("condition",
                        absl::StrCat("--", required, " is required"), specs);
    }
  }
  // The scheduler's t, or (in process) the forward's timestep.
  const char* time_flag = args->Has("timestep") ? "timestep" : "timesteps";
  if (args->Has("timestep") == args->Has("timesteps") ||
      (remote && args->Has("timestep"))) {
    return PrintUsage("condition",
                      remote ? "--timesteps is required"
                             : "one of --timesteps and --timestep is required",
                      specs);
  }
  const int64_t threads = args->Int("threads").value_or(
      std::max(1u, std::thread::hardware_concurrency()));
  const int64_t repeat = args->Int("repeat").value_or(1);
  const int64_t cache_mib = args->Int("cache_mib").value_or(256);
  if (threads < 1 || threads > 1024 || repeat < 1 || cache_mib < 0) {
    return PrintUsage("condition",
                      "--threads must be in [1, 1024], --repeat >= 1 and "
                      "--cache_mib >= 0",
                      specs);
  }

  models::ConditioningInputs inputs;
  absl::StatusOr<std::vector<float>> timesteps =
      ParseTimesteps(*args->String(time_flag));
  if (!timesteps.ok()) return PrintError(timesteps.status());
  inputs.values[args->Has("timestep") ? "timestep" : "t"] =
      *std::move(timesteps);
  if (args->Has("guidance")) {
    inputs.values["guidance"] = {static_cast<float>(*args->Double("guidance"))};
  }
  std::vector<int64_t> pooled_shape;
  if (args->Has("pooled")) {
    absl::StatusOr<std::vector<float>> pooled =
        ReadNpyFloat32(*args->String("pooled"), &pooled_shape);
    if (!pooled.ok()) return PrintError(pooled.status());
    inputs.values["pooled"] = *std::move(pooled);
  }
  if (args->Has("inputs")) {
    const absl::Status parsed =
        ParseNamedInputs(*args->String("inputs"), &inputs);
    if (!parsed.ok()) return PrintError(parsed);
  }
  std::vector<std::string> outputs;
  if (args->Has("outputs")) {
    outputs =
        absl::StrSplit(*args->String("outputs"), ',', absl::SkipWhitespace());
  }

  if (remote) {
    const auto pooled = inputs.values.find("pooled");
    absl::StatusOr<std::vector<models::TensorToWrite>> tensors =
        ConditionOnServer(
            *args, inputs.values["t"],
            pooled == inputs.values.end() ? nullptr : &pooled->second,
            pooled_shape, outputs);
    if (!tensors.ok()) return PrintError(tensors.status());
    for (const models::TensorToWrite& tensor : *tensors) {
      std::cout << tensor.name << " [" << absl::StrJoin(tensor.shape, ", ")
                << "] " << DTypeName(tensor.dtype) << "\n";
    }
    const absl::Status written = WriteOutputs(*args->String("out"), *tensors);
    if (!written.ok()) return PrintError(written);
    return kExitOk;
  }

  models::ConditioningOptions options;
  options.threads = static_cast<int>(threads);
  if (args->Has("torch_dtype")) {
    absl::StatusOr<DType> dtype =
        models::ParseTorchDType(*args->String("torch_dtype"));
    if (!dtype.ok()) {
      return PrintError(absl::InvalidArgumentError(
          absl::StrCat("--torch_dtype: ", dtype.status().message())));
    }
    options.torch_dtype = *dtype;
  }
  options.cache = std::make_shared<models::RowCache>(cache_mib << 20);
  const std::string device = args->String("device").value_or("cpu");
  if (device == "cuda") {
    absl::StatusOr<std::unique_ptr<LinearEngine>> engine =
        CreateGpuLinearEngine();
    if (!engine.ok()) {
      return PrintError(absl::Status(
          engine.status().code(),
          absl::StrCat("--device=cuda: ", engine.status().message())));
    }
    options.linear_engine = *std::move(engine);
  } else if (device != "cpu") {
    return PrintUsage(
        "condition",
        absl::StrCat("--device must be cpu or cuda, got \"", device, "\""),
        specs);
  }
  const auto load_start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<models::ConditioningModel>> model =
      models::ConditioningModel::Load(*args->String("model_dir"), options);
  if (!model.ok()) return PrintError(model.status());
  const double load_s = std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - load_start)
                            .count();
  std::cerr << absl::StrFormat(
      "%s (%s, D=%d): %.1f MiB of conditioning weights loaded in %.3f s "
      "(Linears on %s)\n",
      (*model)->family().name, DTypeName((*model)->dtype()), (*model)->width(),
      (*model)->weight_bytes() / 1048576.0, load_s,
      options.linear_engine != nullptr ? options.linear_engine->name() : "cpu");

  absl::StatusOr<std::vector<models::ConditioningOutput>> result;
  for (int64_t i = 0; i < repeat; ++i) {
    const auto start = std::chrono::steady_clock::now();
    result = (*model)->Compute(inputs, outputs);
    if (!result.ok()) return PrintError(result.status());
    if (repeat > 1) {
      const models::RowCacheStats stats = options.cache->stats();
      std::cerr << absl::StrFormat(
          "run %d: %.3f ms (cache: %d hits, %d misses, %d bytes)\n", i + 1,
          std::chrono::duration<double, std::milli>(
              std::chrono::steady_clock::now() - start)
              .count(),
          stats.hits, stats.misses, stats.bytes);
    }
  }
  std::vector<models::TensorToWrite> tensors;
  for (models::ConditioningOutput& output : *result) {
    std::cout << output.name << " [" << absl::StrJoin(output.shape, ", ")
              << "] " << DTypeName(output.dtype) << "\n";
    tensors.push_back(
        {output.name, output.dtype, output.shape,
         std::vector<uint8_t>(output.data.begin(), output.data.end())});
    std::string().swap(output.data);
  }
  const absl::Status written = WriteOutputs(*args->String("out"), tensors);
  if (!written.ok()) return PrintError(written);
  return kExitOk;
}

}  // namespace temb::cli
