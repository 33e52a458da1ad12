// temb condition: a diffusion transformer's time conditioning (timestep
// MLP, guidance and pooled-text embedders, every block's modulation) from
// the model's own diffusers checkpoint, computed in process on the CPU and
// written as a safetensors file (temb/models/conditioning_model.h).
#include <algorithm>
#include <chrono>
#include <cstring>
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
#include "temb/base/status_macros.h"
#include "temb/cli/commands.h"
#include "temb/cli/common.h"
#include "temb/models/conditioning_model.h"
#include "temb/models/safetensors.h"

namespace temb::cli {
namespace {

std::vector<FlagSpec> ConditionFlags() {
  return {
      {"model_dir", FlagType::kString,
       "a diffusers model folder (config.json and safetensors weights)"},
      {"timesteps", FlagType::kString,
       "the scheduler's timesteps, e.g. 999,500 or @file"},
      {"guidance", FlagType::kDouble,
       "the guidance scale, for models with guidance_embeds"},
      {"pooled", FlagType::kString,
       ".npy file of float32 pooled text embeddings, [N, P] or [P]"},
      {"inputs", FlagType::kString,
       "a family's other inputs, ';'-separated: name=v1,v2,... or "
       "name=@file.npy (float32), e.g. resolution=1024,768;aspect_ratio=0.75"},
      {"outputs", FlagType::kString,
       "comma-separated outputs (default: all of the family's); any value "
       "of the family's description (server/models/families.cc) by name"},
      {"out", FlagType::kString, "the safetensors file to write"},
      {"torch_dtype", FlagType::kString,
       "compute in this dtype, as from_pretrained(torch_dtype=...): fp32, "
       "bf16 or fp16 (default: the folder's temb.json, else the stored "
       "dtype)"},
      {"threads", FlagType::kInt, "CPU threads (default: all cores)"},
      {"repeat", FlagType::kInt,
       "compute this many times (with the row cache) and report timings"},
      {"cache_mib", FlagType::kInt, "row cache capacity in MiB (default 256)"},
      {"help", FlagType::kBool, "show this help"},
  };
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
  for (const char* required : {"model_dir", "timesteps", "out"}) {
    if (!args->Has(required)) {
      return PrintUsage("condition",
                        absl::StrCat("--", required, " is required"), specs);
    }
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
      ParseTimesteps(*args->String("timesteps"));
  if (!timesteps.ok()) return PrintError(timesteps.status());
  inputs.values["t"] = *std::move(timesteps);
  if (args->Has("guidance")) {
    inputs.values["guidance"] = {static_cast<float>(*args->Double("guidance"))};
  }
  if (args->Has("pooled")) {
    std::vector<int64_t> shape;
    absl::StatusOr<std::vector<float>> pooled =
        ReadNpyFloat32(*args->String("pooled"), &shape);
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
  const auto load_start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<models::ConditioningModel>> model =
      models::ConditioningModel::Load(*args->String("model_dir"), options);
  if (!model.ok()) return PrintError(model.status());
  const double load_s = std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - load_start)
                            .count();
  std::cerr << absl::StrFormat(
      "%s (%s, D=%d): %.1f MiB of conditioning weights loaded in %.3f s\n",
      (*model)->family().name, DTypeName((*model)->dtype()), (*model)->width(),
      (*model)->weight_bytes() / 1048576.0, load_s);

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
        {output.name, output.dtype, output.shape, std::move(output.data)});
  }
  const absl::Status written =
      models::WriteSafetensors(*args->String("out"), tensors);
  if (!written.ok()) return PrintError(written);
  return kExitOk;
}

}  // namespace temb::cli
