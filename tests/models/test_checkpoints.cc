#include "test_checkpoints.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace temb::models {

TempDir::TempDir() {
  char pattern[] = "/tmp/temb_models_test.XXXXXX";
  path_ = mkdtemp(pattern);
}

TempDir::~TempDir() {
  std::system(absl::StrCat("rm -rf '", path_, "'").c_str());
}

std::string TempDir::File(const std::string& name) const {
  return absl::StrCat(path_, "/", name);
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

void WriteRaw(const std::string& path, const std::string& header,
              size_t data_bytes, int64_t length) {
  const uint64_t field = length < 0 ? header.size() : length;
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(field >> (8 * i));
  bytes += header;
  bytes.append(data_bytes, '\0');
  WriteText(path, bytes);
}

TensorToWrite RandomFloat32(const std::string& name, std::vector<int64_t> shape,
                            uint32_t* state) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<uint8_t> data(n * 4);
  for (int64_t i = 0; i < n; ++i) {
    *state = *state * 1664525u + 1013904223u;
    const float v = static_cast<float>(*state >> 8) / (1 << 24) - 0.5f;
    std::memcpy(&data[i * 4], &v, 4);
  }
  return {name, DType::kFloat32, std::move(shape), std::move(data)};
}

void WriteQwenCheckpoint(const std::string& dir, int bad) {
  WriteText(dir + "/config.json",
            R"({"_class_name": "QwenImageTransformer2DModel",
                "num_layers": 2, "num_attention_heads": 2,
                "attention_head_dim": 4})");
  std::vector<TensorToWrite> tensors;
  uint32_t state = 1;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    tensors.push_back(RandomFloat32(name, std::move(shape), &state));
  };
  const std::string mlp = "time_text_embed.timestep_embedder.";
  add(mlp + "linear_1.weight", {8, bad == 1 ? 128 : 256});
  add(mlp + "linear_1.bias", {8});
  add(mlp + "linear_2.weight", {8, 8});
  add(mlp + "linear_2.bias", {8});
  for (int i = 0; i < 2; ++i) {
    for (const char* stream : {"img_mod", "txt_mod"}) {
      if (bad == 2 && i == 1 && std::string(stream) == "txt_mod") continue;
      const std::string prefix =
          absl::StrCat("transformer_blocks.", i, ".", stream, ".1.");
      add(prefix + "weight", {48, 8});
      add(prefix + "bias", {48});
    }
  }
  add("norm_out.linear.weight", {16, 8});
  add("norm_out.linear.bias", {16});
  ASSERT_TRUE(
      WriteSafetensors(dir + "/diffusion_pytorch_model.safetensors", tensors)
          .ok());
}

}  // namespace temb::models
