// Fuzzes the conditioning models' loader with whole model folders: the
// input is a list of files, each a tag byte, a 4-byte little-endian length
// and that many bytes (make_model_folder_seeds.py writes the seeds):
//
//   tag 0  config.json
//   tag 1  diffusion_pytorch_model.safetensors (the single weights file)
//   tag 2  diffusion_pytorch_model.safetensors.index.json
//   tag 3  model-00001.safetensors (a shard an index may name)
//   tag 4  temb.json
//
// A later file of a tag replaces the earlier one; a length past the end
// takes the rest.  The folder is written to a temporary directory and
// loaded as the server loads a repository's model.  Any input must be
// refused with a status naming a file of the folder, or load a model that
// keeps the loader's promises: the weights it holds are at most twice the
// checkpoint's bytes (a bf16 tensor kept in float32), and one row for
// t = 500 (zeros for the other inputs) is computed or refused, each output
// holding exactly its shape's bytes.  libFuzzer's -rss_limit_mb and
// -timeout catch a load that allocates or waits beyond that.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "temb/kernels/dtype.h"
#include "temb/models/checkpoint.h"
#include "temb/models/conditioning_model.h"

namespace temb::fuzz {
namespace {

void Fail(const char* what) {
  std::fprintf(stderr, "model_folder invariant failed: %s\n", what);
  std::abort();
}

constexpr const char* kFileNames[] = {
    models::kConfigFile, models::kSingleWeightsFile, models::kWeightsIndexFile,
    "model-00001.safetensors", models::kFolderOptionsFile};

// The folder the inputs are written to, made once per process.
const std::string& Folder() {
  static const std::string folder = [] {
    std::string path =
        (std::filesystem::temp_directory_path() / "temb-fuzz-XXXXXX").string();
    if (mkdtemp(path.data()) == nullptr) Fail("mkdtemp");
    return path;
  }();
  return folder;
}

// The input's files by tag.
std::map<int, std::string> Files(const uint8_t* data, size_t size) {
  std::map<int, std::string> files;
  size_t at = 0;
  while (at + 5 <= size) {
    const int tag = data[at] % 5;
    uint32_t length = 0;
    for (int i = 3; i >= 0; --i) length = (length << 8) | data[at + 1 + i];
    at += 5;
    const size_t take = std::min<size_t>(length, size - at);
    files[tag].assign(reinterpret_cast<const char*>(data + at), take);
    at += take;
  }
  return files;
}

uint64_t WriteFolder(const std::map<int, std::string>& files) {
  uint64_t bytes = 0;
  for (int tag = 0; tag < 5; ++tag) {
    const std::string path = Folder() + "/" + kFileNames[tag];
    std::filesystem::remove(path);
    const auto file = files.find(tag);
    if (file == files.end()) continue;
    std::ofstream(path, std::ios::binary) << file->second;
    bytes += file->second.size();
  }
  return bytes;
}

void CheckOneRow(const models::ConditioningModel& model) {
  models::ConditioningInputs inputs;
  for (const models::InputInfo& input : model.inputs()) {
    if (!input.stands_for.empty()) continue;  // the alternative to t
    inputs.values[input.name] = std::vector<float>(
        static_cast<size_t>(input.width > 0 ? input.width : 1), 0.0f);
  }
  inputs.values["t"] = {500.0f};
  const auto outputs = model.Compute(inputs, {});
  if (!outputs.ok()) return;
  for (const models::ConditioningOutput& output : *outputs) {
    int64_t elements = 1;
    for (const int64_t extent : output.shape) elements *= extent;
    if (output.data.size() !=
        static_cast<size_t>(elements) * DTypeSize(output.dtype)) {
      Fail("an output whose bytes disagree with its shape");
    }
  }
}

}  // namespace
}  // namespace temb::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using temb::fuzz::Fail;
  const uint64_t bytes = temb::fuzz::WriteFolder(temb::fuzz::Files(data, size));
  temb::models::ConditioningOptions options;
  auto model =
      temb::models::ConditioningModel::Load(temb::fuzz::Folder(), options);
  if (!model.ok()) {
    if (model.status().message().find(temb::fuzz::Folder()) ==
        std::string::npos) {
      Fail("an error that does not name the folder");
    }
    return 0;
  }
  if (static_cast<uint64_t>((*model)->weight_bytes()) > 2 * bytes) {
    Fail("more weight bytes held than twice the folder's bytes");
  }
  temb::fuzz::CheckOneRow(**model);
  return 0;
}
