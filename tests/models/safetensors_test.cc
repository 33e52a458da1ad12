// The checkpoint reader against hostile and damaged files: each is refused
// with a message naming the file, the tensor and the field.
#include "temb/models/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "temb/base/file_reader.h"
#include "temb/models/checkpoint.h"
#include "temb/models/conditioning_model.h"
#include "temb/models/weight_fingerprint.h"
#include "test_checkpoints.h"

namespace temb::models {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Message(const absl::Status& status) {
  return std::string(status.message());
}

TEST(SafetensorsTest, ReadsWhatTheWriterWrote) {
  TempDir dir;
  std::vector<TensorToWrite> tensors = {
      {"a", DType::kBFloat16, {2, 3}, std::vector<uint8_t>(12, 7)},
      {"b", DType::kFloat32, {1}, {0, 0, 128, 63}}};
  ASSERT_TRUE(WriteSafetensors(dir.File("x.safetensors"), tensors).ok());
  auto file = SafetensorsFile::Open(dir.File("x.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  const TensorEntry* a = (*file)->Find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::kBFloat16);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  auto data = (*file)->Read(*(*file)->Find("b"));
  ASSERT_TRUE(data.ok());
  EXPECT_EQ(std::vector<uint8_t>(data->begin(), data->end()),
            (std::vector<uint8_t>{0, 0, 128, 63}));
}

// A weight of 2 MiB or more lands in huge-page-aligned memory (the Linear
// streams it whole every step); a smaller one in plain memory.  Both hold
// exactly the stored bytes.
TEST(SafetensorsTest, LargeTensorsAreReadIntoHugePageAlignedBuffers) {
  TempDir dir;
  std::vector<uint8_t> large(3 * kHugePageBytes / 2);
  for (size_t i = 0; i < large.size(); ++i) {
    large[i] = static_cast<uint8_t>(i * 131 + 7);
  }
  std::vector<TensorToWrite> tensors = {
      {"large",
       DType::kBFloat16,
       {static_cast<int64_t>(large.size() / 2)},
       large},
      {"small", DType::kFloat32, {2}, {1, 2, 3, 4, 5, 6, 7, 8}}};
  ASSERT_TRUE(WriteSafetensors(dir.File("x.safetensors"), tensors).ok());
  auto file = SafetensorsFile::Open(dir.File("x.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  auto big = (*file)->Read(*(*file)->Find("large"));
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big->data()) % kHugePageBytes, 0u);
  EXPECT_TRUE(std::equal(big->begin(), big->end(), large.begin(), large.end()));
  auto little = (*file)->Read(*(*file)->Find("small"));
  ASSERT_TRUE(little.ok()) << little.status();
  EXPECT_EQ(std::vector<uint8_t>(little->begin(), little->end()),
            (std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8}));
}

// The fingerprint's definition (weight_fingerprint.h), pinned by values
// computed from it independently (Python's hashlib): the whole of a small
// tensor, 16 windows of a large one.
TEST(WeightFingerprintTest, FollowsItsDefinition) {
  std::vector<uint8_t> small(1000);
  for (size_t i = 0; i < small.size(); ++i) small[i] = i % 251;
  EXPECT_EQ(WeightFingerprint(DType::kBFloat16, small), "162b595cfd01a874");
  std::vector<uint8_t> large(200003);
  for (size_t i = 0; i < large.size(); ++i) large[i] = (i * 7 + 3) % 256;
  EXPECT_EQ(WeightFingerprint(DType::kFloat32, large), "bb488d3dee6d22be");
  // A byte inside a window changes it; the dtype does too.
  large[0] ^= 1;
  EXPECT_NE(WeightFingerprint(DType::kFloat32, large), "bb488d3dee6d22be");
  EXPECT_NE(WeightFingerprint(DType::kFloat16, small), "162b595cfd01a874");
}

TEST(SafetensorsTest, RefusesTruncatedFile) {
  TempDir dir;
  WriteText(dir.File("t.safetensors"), "abc");
  auto file = SafetensorsFile::Open(dir.File("t.safetensors"));
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(file.status()),
              AllOf(HasSubstr("t.safetensors"), HasSubstr("header length"),
                    HasSubstr("3 bytes")));
}

TEST(SafetensorsTest, RefusesHeaderAboveTheBound) {
  TempDir dir;
  WriteRaw(dir.File("big.safetensors"), "{}", 0,
           kMaxSafetensorsHeaderBytes + 1);
  auto file = SafetensorsFile::Open(dir.File("big.safetensors"));
  EXPECT_THAT(Message(file.status()),
              AllOf(HasSubstr("big.safetensors"), HasSubstr("header length"),
                    HasSubstr("above the limit")));
}

TEST(SafetensorsTest, RefusesHeaderPastTheFile) {
  TempDir dir;
  WriteRaw(dir.File("long.safetensors"), "{}", 0, 4096);
  auto file = SafetensorsFile::Open(dir.File("long.safetensors"));
  EXPECT_THAT(Message(file.status()),
              AllOf(HasSubstr("long.safetensors"), HasSubstr("header length"),
                    HasSubstr("past the end of the file")));
}

TEST(SafetensorsTest, RefusesMalformedJson) {
  auto parsed = ParseSafetensorsHeader("f.safetensors", "{\"a\": [", 0);
  EXPECT_THAT(Message(parsed.status()),
              AllOf(HasSubstr("f.safetensors"), HasSubstr("not valid JSON")));
  parsed = ParseSafetensorsHeader("f.safetensors", "[1]", 0);
  EXPECT_THAT(Message(parsed.status()), HasSubstr("must be a JSON object"));
}

struct HostileHeader {
  std::string header;
  uint64_t data_bytes;
  std::string tensor;
  std::string field;
  std::string why;
};

TEST(SafetensorsTest, RefusesHostileEntries) {
  const std::vector<HostileHeader> cases = {
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}})", 8,
       "w", "data_offsets", "past the data section"},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 8,
       "w", "data_offsets", "after end"},
      {R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8,
       "w", "data_offsets", "disagrees with dtype F32 and shape"},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "v": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       16, "v", "data_offsets", "overlap tensor \"w\""},
      {R"({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}})", 8,
       "w", "dtype", "unknown dtype"},
      {R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8,
       "w", "shape", "non-negative integers"},
      {R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296],
                 "data_offsets": [0, 8]}})",
       8, "w", "shape", "overflows"},
      {R"({"w": {"dtype": "F32", "shape": [2]}})", 8, "w", "data_offsets",
       "missing"},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8],
                 "extra": 1}})",
       8, "w", "\"extra\"", "unknown field"},
      {R"({"w": 5})", 8, "w", "(entry)", "JSON object"},
  };
  for (const HostileHeader& c : cases) {
    auto parsed =
        ParseSafetensorsHeader("h.safetensors", c.header, c.data_bytes);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << c.header;
    EXPECT_THAT(
        Message(parsed.status()),
        AllOf(HasSubstr("h.safetensors"),
              HasSubstr(absl::StrCat("tensor \"", c.tensor, "\"")),
              HasSubstr(absl::StrCat("field ", c.field)), HasSubstr(c.why)))
        << c.header;
  }
}

TEST(CheckpointTest, RefusesShapeDisagreeingWithConfig) {
  TempDir dir;
  WriteQwenCheckpoint(dir.path(), /*bad=*/1);
  auto model = ConditioningModel::Load(dir.path(), {});
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      Message(model.status()),
      AllOf(HasSubstr("diffusion_pytorch_model.safetensors"),
            HasSubstr(
                "tensor \"time_text_embed.timestep_embedder.linear_1.weight\""),
            HasSubstr("field shape: [8, 128]"), HasSubstr("[8, 256]")));
}

TEST(CheckpointTest, RefusesMissingTensor) {
  TempDir dir;
  WriteQwenCheckpoint(dir.path(), /*bad=*/2);
  auto model = ConditioningModel::Load(dir.path(), {});
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(
      Message(model.status()),
      AllOf(HasSubstr("tensor \"transformer_blocks.1.txt_mod.1.weight\""),
            HasSubstr("missing")));
}

TEST(CheckpointTest, RefusesDTypeDisagreeingWithTheModel) {
  TempDir dir;
  WriteQwenCheckpoint(dir.path());
  auto checkpoint = Checkpoint::Open(dir.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  auto loaded =
      (*checkpoint)->Load("norm_out.linear.bias", DType::kBFloat16, {16});
  EXPECT_THAT(Message(loaded.status()),
              AllOf(HasSubstr("diffusion_pytorch_model.safetensors"),
                    HasSubstr("tensor \"norm_out.linear.bias\""),
                    HasSubstr("field dtype: F32"), HasSubstr("BF16")));
}

TEST(CheckpointTest, RefusesMalformedConfig) {
  TempDir dir;
  WriteQwenCheckpoint(dir.path());
  WriteText(dir.File("config.json"), "{\"num_layers\": 2");
  auto model = ConditioningModel::Load(dir.path(), {});
  EXPECT_THAT(Message(model.status()),
              AllOf(HasSubstr("config.json"), HasSubstr("not a JSON object")));
  WriteText(dir.File("config.json"),
            R"({"_class_name": "QwenImageTransformer2DModel",
                "num_layers": "2", "num_attention_heads": 2,
                "attention_head_dim": 4})");
  model = ConditioningModel::Load(dir.path(), {});
  EXPECT_THAT(Message(model.status()),
              AllOf(HasSubstr("config.json"), HasSubstr("field num_layers"),
                    HasSubstr("integer")));
  WriteText(dir.File("config.json"), R"({"_class_name": "UNet2DModel"})");
  model = ConditioningModel::Load(dir.path(), {});
  EXPECT_THAT(Message(model.status()),
              AllOf(HasSubstr("field _class_name"), HasSubstr("UNet2DModel"),
                    HasSubstr("FluxTransformer2DModel")));
}

TEST(CheckpointTest, RefusesUnsupportedVariant) {
  TempDir dir;
  WriteQwenCheckpoint(dir.path());
  WriteText(dir.File("config.json"),
            R"({"_class_name": "QwenImageTransformer2DModel",
                "num_layers": 2, "num_attention_heads": 2,
                "attention_head_dim": 4, "guidance_embeds": true})");
  auto model = ConditioningModel::Load(dir.path(), {});
  EXPECT_THAT(Message(model.status()), AllOf(HasSubstr("config.json"),
                                             HasSubstr("field guidance_embeds"),
                                             HasSubstr("not supported")));
}

// Edit-2511's zero_cond_t only stacks a second row at t = 0, which the
// same ops compute: the model loads and serves the plain Qwen-Image outputs.
TEST(CheckpointTest, LoadsQwenImageWithZeroCondT) {
  TempDir dir;
  WriteQwenCheckpoint(dir.path());
  WriteText(dir.File("config.json"),
            R"({"_class_name": "QwenImageTransformer2DModel",
                "num_layers": 2, "num_attention_heads": 2,
                "attention_head_dim": 4, "zero_cond_t": true})");
  auto model = ConditioningModel::Load(dir.path(), {});
  ASSERT_TRUE(model.ok()) << model.status();
}

TEST(CheckpointTest, RefusesIndexPointingOutsideTheFolder) {
  TempDir dir;
  WriteQwenCheckpoint(dir.path());
  WriteText(dir.File("diffusion_pytorch_model.safetensors.index.json"),
            R"({"weight_map": {"norm_out.linear.bias": "../x.safetensors"}})");
  auto checkpoint = Checkpoint::Open(dir.path());
  EXPECT_THAT(Message(checkpoint.status()),
              AllOf(HasSubstr("index.json"),
                    HasSubstr("tensor \"norm_out.linear.bias\""),
                    HasSubstr("field weight_map"),
                    HasSubstr("not a file name in the model folder")));
}

TEST(CheckpointTest, RefusesIndexNamingATensorItsShardLacks) {
  TempDir dir;
  WriteQwenCheckpoint(dir.path());
  WriteText(dir.File("diffusion_pytorch_model.safetensors.index.json"),
            R"({"weight_map": {"no.such.tensor":
                "diffusion_pytorch_model.safetensors"}})");
  auto checkpoint = Checkpoint::Open(dir.path());
  EXPECT_THAT(Message(checkpoint.status()),
              AllOf(HasSubstr("tensor \"no.such.tensor\""),
                    HasSubstr("has no such tensor")));
}

TEST(CheckpointTest, RefusesFolderWithoutWeights) {
  TempDir dir;
  WriteText(dir.File("config.json"),
            R"({"_class_name": "QwenImageTransformer2DModel"})");
  auto checkpoint = Checkpoint::Open(dir.path());
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kNotFound);
}

TEST(ConditioningModelTest, CacheHitsGiveTheComputedBits) {
  TempDir dir;
  WriteQwenCheckpoint(dir.path());
  ConditioningOptions options;
  options.threads = 2;
  options.cache = std::make_shared<RowCache>(1 << 20);
  auto model = ConditioningModel::Load(dir.path(), options);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->width(), 8);
  ConditioningInputs inputs;
  inputs.values["t"] = {999.0f, 500.0f, 999.0f};
  auto first = (*model)->Compute(inputs, {});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->size(), 4u);
  EXPECT_EQ((*first)[1].name, "img_mod");
  EXPECT_EQ((*first)[1].shape, (std::vector<int64_t>{3, 2, 48}));
  // Two distinct timesteps: two misses, and the repeat computed once.
  EXPECT_EQ(options.cache->stats().misses, 2);
  EXPECT_EQ(options.cache->stats().entries, 2);
  const std::string& temb = (*first)[0].data;
  EXPECT_TRUE(std::equal(temb.begin(), temb.begin() + 32, temb.begin() + 64));

  auto second = (*model)->Compute(inputs, {});
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(options.cache->stats().hits, 2);
  for (size_t i = 0; i < first->size(); ++i) {
    EXPECT_EQ((*first)[i].data, (*second)[i].data) << (*first)[i].name;
  }
  // The same rows without a cache, one at a time.
  auto uncached = ConditioningModel::Load(dir.path(), {});
  ASSERT_TRUE(uncached.ok());
  ConditioningInputs one;
  one.values["t"] = {500.0f};
  auto alone = (*uncached)->Compute(one, {"norm_out"});
  ASSERT_TRUE(alone.ok());
  ASSERT_EQ(alone->size(), 1u);
  EXPECT_TRUE(std::equal((*alone)[0].data.begin(), (*alone)[0].data.end(),
                         (*first)[3].data.begin() + 16 * 4));
}

TEST(ConditioningModelTest, RefusesBadInputs) {
  TempDir dir;
  WriteQwenCheckpoint(dir.path());
  auto model = ConditioningModel::Load(dir.path(), {});
  ASSERT_TRUE(model.ok()) << model.status();
  ConditioningInputs inputs;
  inputs.values["t"] = {1.0f, std::nanf("")};
  EXPECT_THAT(Message((*model)->Compute(inputs, {}).status()),
              HasSubstr("t[1] must be finite"));
  inputs.values["t"] = {1.0f};
  inputs.values["guidance"] = {3.5f};
  EXPECT_THAT(
      Message((*model)->Compute(inputs, {}).status()),
      HasSubstr("guidance: not an input of qwen-image (t, addition_t_cond, "
                "timestep)"));
  inputs.values["guidance"].clear();
  EXPECT_THAT(Message((*model)->Compute(inputs, {"single_mod"}).status()),
              HasSubstr("outputs: \"single_mod\" is not an output"));
  auto internal = (*model)->Compute(inputs, {"t_model", "temb_silu"});
  ASSERT_TRUE(internal.ok()) << internal.status();
  EXPECT_EQ((*internal)[0].shape, (std::vector<int64_t>{1}));
  EXPECT_EQ((*internal)[1].shape, (std::vector<int64_t>{1, 8}));
  // Scalars alone: nothing is cached or unpacked.  t = 1 becomes
  // fl32(1) / 1000 in the float32 model.
  auto scalar = (*model)->Compute(inputs, {"t_model"});
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  float t_model;
  std::memcpy(&t_model, (*scalar)[0].data.data(), 4);
  EXPECT_EQ(t_model, 1.0f / 1000.0f);
  inputs.values["t"].assign(kMaxConditioningRows + 1, 1.0f);
  EXPECT_EQ((*model)->Compute(inputs, {}).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// A small SD3-shaped float32 checkpoint: D = 8, three blocks, pooled width
// 4; `dual` is config.json's dual_attention_layers and `nine_d` the blocks
// whose norm1 is written 9D (equal to `dual` unless a test disagrees).
void WriteSd3Checkpoint(const TempDir& dir, const std::string& dual,
                        const std::vector<int>& nine_d) {
  WriteText(dir.File("config.json"),
            absl::StrCat(R"({"_class_name": "SD3Transformer2DModel",
                "num_layers": 3, "num_attention_heads": 2,
                "attention_head_dim": 4, "pooled_projection_dim": 4,
                "dual_attention_layers": )",
                         dual, "}"));
  std::vector<TensorToWrite> tensors;
  uint32_t state = 3;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    tensors.push_back(RandomFloat32(name, std::move(shape), &state));
  };
  auto linear = [&](const std::string& prefix, int64_t out, int64_t in) {
    add(prefix + ".weight", {out, in});
    add(prefix + ".bias", {out});
  };
  linear("time_text_embed.timestep_embedder.linear_1", 8, 256);
  linear("time_text_embed.timestep_embedder.linear_2", 8, 8);
  linear("time_text_embed.text_embedder.linear_1", 8, 4);
  linear("time_text_embed.text_embedder.linear_2", 8, 8);
  for (int i = 0; i < 3; ++i) {
    const bool wide =
        std::find(nine_d.begin(), nine_d.end(), i) != nine_d.end();
    const std::string block = absl::StrCat("transformer_blocks.", i);
    linear(block + ".norm1.linear", wide ? 72 : 48, 8);
    linear(block + ".norm1_context.linear", i == 2 ? 16 : 48, 8);
  }
  linear("norm_out.linear", 16, 8);
  ASSERT_TRUE(
      WriteSafetensors(dir.File("diffusion_pytorch_model.safetensors"), tensors)
          .ok());
}

TEST(ConditioningModelTest, Sd3BlocksOfEachWidthAreSeparateOutputs) {
  TempDir dir;
  WriteSd3Checkpoint(dir, "[1]", {1});
  auto model = ConditioningModel::Load(dir.path(), {});
  ASSERT_TRUE(model.ok()) << model.status();
  ConditioningInputs inputs;
  inputs.values["t"] = {999.0f, 1.5f};
  inputs.values["pooled"] = {0.5f, -1.0f, 2.0f, 0.0f};
  auto outputs = (*model)->Compute(inputs, {});
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  for (const ConditioningOutput& output : *outputs) {
    names.push_back(output.name);
    shapes.push_back(output.shape);
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"temb", "img_mod", "img_mod_dual",
                                      "txt_mod", "txt_mod_last", "norm_out"}));
  EXPECT_EQ(shapes,
            (std::vector<std::vector<int64_t>>{
                {2, 8}, {2, 2, 48}, {2, 1, 72}, {2, 2, 48}, {2, 16}, {2, 16}}));
  // SD3.0 (no dual-attention block) has no img_mod_dual at all.
  TempDir plain;
  WriteSd3Checkpoint(plain, "[]", {});
  model = ConditioningModel::Load(plain.path(), {});
  ASSERT_TRUE(model.ok()) << model.status();
  outputs = (*model)->Compute(inputs, {"img_mod"});
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  EXPECT_EQ((*outputs)[0].shape, (std::vector<int64_t>{2, 3, 48}));
  EXPECT_THAT(Message((*model)->Compute(inputs, {"img_mod_dual"}).status()),
              HasSubstr("outputs: \"img_mod_dual\" is not an output"));
  inputs.values["pooled"].clear();
  EXPECT_THAT(Message((*model)->Compute(inputs, {}).status()),
              HasSubstr("pooled: required by this sd3 model"));
}

TEST(CheckpointTest, RefusesSd3DualLayersDisagreeingWithTheWeights) {
  TempDir dir;
  // config.json says block 2 is a dual-attention block; its norm1 is 6D.
  WriteSd3Checkpoint(dir, "[1, 2]", {1});
  auto model = ConditioningModel::Load(dir.path(), {});
  EXPECT_THAT(Message(model.status()),
              AllOf(HasSubstr("tensor \"transformer_blocks.2.norm1.linear."
                              "weight\""),
                    HasSubstr("field shape: [48, 8]"), HasSubstr("[72, 8]")));
  for (const char* dual : {"[3]", "1", "[-1]", "[\"0\"]"}) {
    WriteSd3Checkpoint(dir, dual, {});
    model = ConditioningModel::Load(dir.path(), {});
    EXPECT_THAT(Message(model.status()),
                AllOf(HasSubstr("config.json"),
                      HasSubstr("field dual_attention_layers")))
        << dual;
  }
}

// The same values rounded to bf16: a checkpoint saved in bf16.
TensorToWrite RandomBFloat16(const std::string& name,
                             std::vector<int64_t> shape, uint32_t* state) {
  TensorToWrite tensor = RandomFloat32(name, std::move(shape), state);
  std::vector<uint8_t> data(tensor.data.size() / 2);
  for (size_t i = 0; i < data.size() / 2; ++i) {
    float value;
    std::memcpy(&value, &tensor.data[i * 4], 4);
    const uint16_t bits = FloatToBFloat16(value);
    std::memcpy(&data[i * 2], &bits, 2);
  }
  tensor.dtype = DType::kBFloat16;
  tensor.data = std::move(data);
  return tensor;
}

// A Wan-shaped checkpoint, D = 8, two blocks, as a bf16 pipeline saves it:
// time_proj in bf16, the kept modules (time_embedder, the tables) in float32
// except linear_1, stored bf16 to be upcast.  `block1_table` is block 1's
// table shape.
void WriteWanCheckpoint(const TempDir& dir,
                        std::vector<int64_t> block1_table = {1, 6, 8}) {
  WriteText(dir.File("config.json"),
            R"({"_class_name": "WanTransformer3DModel", "num_layers": 2,
                "num_attention_heads": 2, "attention_head_dim": 4,
                "freq_dim": 16})");
  std::vector<TensorToWrite> tensors;
  uint32_t state = 5;
  const std::string mlp = "condition_embedder.time_embedder.";
  tensors.push_back(RandomBFloat16(mlp + "linear_1.weight", {8, 16}, &state));
  tensors.push_back(RandomBFloat16(mlp + "linear_1.bias", {8}, &state));
  tensors.push_back(RandomFloat32(mlp + "linear_2.weight", {8, 8}, &state));
  tensors.push_back(RandomFloat32(mlp + "linear_2.bias", {8}, &state));
  tensors.push_back(
      RandomBFloat16("condition_embedder.time_proj.weight", {48, 8}, &state));
  tensors.push_back(
      RandomBFloat16("condition_embedder.time_proj.bias", {48}, &state));
  tensors.push_back(
      RandomFloat32("blocks.0.scale_shift_table", {1, 6, 8}, &state));
  tensors.push_back(RandomFloat32("blocks.1.scale_shift_table",
                                  std::move(block1_table), &state));
  tensors.push_back(RandomFloat32("scale_shift_table", {1, 2, 8}, &state));
  ASSERT_TRUE(
      WriteSafetensors(dir.File("diffusion_pytorch_model.safetensors"), tensors)
          .ok());
}

std::vector<float> AsFloats(const ConditioningOutput& output) {
  std::vector<float> values;
  const size_t size = DTypeSize(output.dtype);
  for (size_t i = 0; i < output.data.size(); i += size) {
    float value;
    if (output.dtype == DType::kFloat32) {
      std::memcpy(&value, &output.data[i], 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, &output.data[i], 2);
      value = BFloat16ToFloat(bits);
    }
    values.push_back(value);
  }
  return values;
}

TEST(ConditioningModelTest, WanTablesAddInFloat32ToTheBf16Values) {
  TempDir dir;
  WriteWanCheckpoint(dir);
  auto model = ConditioningModel::Load(dir.path(), {});
  ASSERT_TRUE(model.ok()) << model.status();
  // The kept float32 modules do not set the model's dtype.
  EXPECT_EQ((*model)->dtype(), DType::kBFloat16);
  ConditioningInputs inputs;
  inputs.values["t"] = {999.0f, 0.5f};
  auto outputs = (*model)->Compute(inputs, {});
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  ASSERT_EQ(outputs->size(), 4u);
  std::vector<std::vector<int64_t>> shapes;
  std::vector<DType> dtypes;
  for (const ConditioningOutput& output : *outputs) {
    shapes.push_back(output.shape);
    dtypes.push_back(output.dtype);
  }
  EXPECT_EQ(shapes, (std::vector<std::vector<int64_t>>{
                        {2, 8}, {2, 6, 8}, {2, 2, 6, 8}, {2, 2, 8}}));
  EXPECT_EQ(dtypes, (std::vector<DType>{DType::kBFloat16, DType::kBFloat16,
                                        DType::kFloat32, DType::kFloat32}));
  // norm_out = table (1, 2, D) + temb, temb repeated along the table.
  auto checkpoint = Checkpoint::Open(dir.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  auto table =
      (*checkpoint)->Load("scale_shift_table", DType::kFloat32, {1, 2, 8});
  ASSERT_TRUE(table.ok()) << table.status();
  std::vector<float> table_values(16);
  std::memcpy(table_values.data(), table->data.data(), 64);
  const std::vector<float> temb = AsFloats((*outputs)[0]);
  const std::vector<float> norm_out = AsFloats((*outputs)[3]);
  for (int row = 0; row < 2; ++row) {
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(norm_out[row * 16 + j], table_values[j] + temb[row * 8 + j % 8])
          << row << " " << j;
    }
  }
}

TEST(CheckpointTest, RefusesTableOfTheWrongShapeNamingIt) {
  TempDir dir;
  WriteWanCheckpoint(dir, {1, 5, 8});
  auto model = ConditioningModel::Load(dir.path(), {});
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      Message(model.status()),
      AllOf(HasSubstr("tensor \"blocks.1.scale_shift_table\""),
            HasSubstr("field shape: [1, 5, 8]"), HasSubstr("[1, 6, 8]")));
}

// A PixArt-shaped float32 checkpoint, D = 6, two blocks, with the size
// embedders (D // 3 = 2 wide) when `alpha`; config.json leaves
// use_additional_conditions null, as diffusers writes it by default.
void WritePixArtCheckpoint(const TempDir& dir, bool alpha) {
  WriteText(dir.File("config.json"),
            absl::StrCat(R"({"_class_name": "PixArtTransformer2DModel",
                "num_layers": 2, "num_attention_heads": 2,
                "attention_head_dim": 3, "use_additional_conditions": null,
                "sample_size": )",
                         alpha ? 128 : 32, "}"));
  std::vector<TensorToWrite> tensors;
  uint32_t state = 7;
  auto linear = [&](const std::string& prefix, int64_t out, int64_t in) {
    tensors.push_back(RandomFloat32(prefix + ".weight", {out, in}, &state));
    tensors.push_back(RandomFloat32(prefix + ".bias", {out}, &state));
  };
  const std::string emb = "adaln_single.emb.";
  linear(emb + "timestep_embedder.linear_1", 6, 256);
  linear(emb + "timestep_embedder.linear_2", 6, 6);
  if (alpha) {
    for (const char* size : {"resolution_embedder", "aspect_ratio_embedder"}) {
      linear(emb + size + ".linear_1", 2, 256);
      linear(emb + size + ".linear_2", 2, 2);
    }
  }
  linear("adaln_single.linear", 36, 6);
  for (int i = 0; i < 2; ++i) {
    tensors.push_back(RandomFloat32(
        absl::StrCat("transformer_blocks.", i, ".scale_shift_table"), {6, 6},
        &state));
  }
  tensors.push_back(RandomFloat32("scale_shift_table", {2, 6}, &state));
  ASSERT_TRUE(
      WriteSafetensors(dir.File("diffusion_pytorch_model.safetensors"), tensors)
          .ok());
}

TEST(ConditioningModelTest, PixArtSizeInputsFollowTheDerivedFlag) {
  TempDir alpha_dir;
  WritePixArtCheckpoint(alpha_dir, /*alpha=*/true);
  auto alpha = ConditioningModel::Load(alpha_dir.path(), {});
  ASSERT_TRUE(alpha.ok()) << alpha.status();
  ConditioningInputs inputs;
  inputs.values["t"] = {999.0f, 10.0f};
  // sample_size 128 with a null flag: the size inputs are required.
  EXPECT_THAT(Message((*alpha)->Compute(inputs, {}).status()),
              HasSubstr("resolution: required by this pixart model"));
  inputs.values["resolution"] = {896.0f, 1152.0f};
  inputs.values["aspect_ratio"] = {0.75f};
  auto outputs = (*alpha)->Compute(inputs, {});
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  std::vector<std::vector<int64_t>> shapes;
  for (const ConditioningOutput& output : *outputs) {
    shapes.push_back(output.shape);
  }
  EXPECT_EQ(shapes, (std::vector<std::vector<int64_t>>{
                        {2, 6}, {2, 36}, {2, 2, 6, 6}, {2, 2, 6}}));
  // The resolution embedder is one Linear over each of height and width,
  // side by side: swapping them swaps the halves, bit for bit.
  auto forward = (*alpha)->Compute(inputs, {"res_emb"});
  inputs.values["resolution"] = {1152.0f, 896.0f};
  auto swapped = (*alpha)->Compute(inputs, {"res_emb"});
  ASSERT_TRUE(forward.ok() && swapped.ok());
  const std::vector<float> a = AsFloats((*forward)[0]);
  const std::vector<float> b = AsFloats((*swapped)[0]);
  ASSERT_EQ(a.size(), 8u);  // [N, 2 * (D // 3)]
  for (int row = 0; row < 2; ++row) {
    for (int j = 0; j < 2; ++j) {
      EXPECT_EQ(a[row * 4 + j], b[row * 4 + 2 + j]);
      EXPECT_EQ(a[row * 4 + 2 + j], b[row * 4 + j]);
    }
  }
  // Any other sample_size with a null flag: PixArt-Sigma, no size inputs.
  TempDir sigma_dir;
  WritePixArtCheckpoint(sigma_dir, /*alpha=*/false);
  auto sigma = ConditioningModel::Load(sigma_dir.path(), {});
  ASSERT_TRUE(sigma.ok()) << sigma.status();
  EXPECT_THAT(Message((*sigma)->Compute(inputs, {}).status()),
              HasSubstr("resolution: pixart model does not take this input"));
}

TEST(ConditioningModelTest, CogVideoXOfsFollowsItsWidthField) {
  TempDir dir;
  auto write = [&](const std::string& ofs, const std::string& flip) {
    WriteText(dir.File("config.json"),
              absl::StrCat(R"({"_class_name": "CogVideoXTransformer3DModel",
                  "num_layers": 1, "num_attention_heads": 2,
                  "attention_head_dim": 4, "time_embed_dim": 6,
                  "freq_shift": 0, "flip_sin_to_cos": )",
                           flip, R"(, "ofs_embed_dim": )", ofs, "}"));
    std::vector<TensorToWrite> tensors;
    uint32_t state = 9;
    auto linear = [&](const std::string& prefix, int64_t out, int64_t in) {
      tensors.push_back(RandomFloat32(prefix + ".weight", {out, in}, &state));
      tensors.push_back(RandomFloat32(prefix + ".bias", {out}, &state));
    };
    // The sinusoid is D = 8 wide; the embedding time_embed_dim = 6.
    linear("time_embedding.linear_1", 6, 8);
    linear("time_embedding.linear_2", 6, 6);
    linear("ofs_embedding.linear_1", 6, 6);
    linear("ofs_embedding.linear_2", 6, 6);
    linear("transformer_blocks.0.norm1.linear", 48, 6);
    linear("transformer_blocks.0.norm2.linear", 48, 6);
    linear("norm_out.linear", 16, 6);
    ASSERT_TRUE(WriteSafetensors(
                    dir.File("diffusion_pytorch_model.safetensors"), tensors)
                    .ok());
  };
  ConditioningInputs inputs;
  inputs.values["t"] = {999.0f};
  inputs.values["ofs"] = {2.0f};
  write("null", "true");
  auto model = ConditioningModel::Load(dir.path(), {});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_THAT(Message((*model)->Compute(inputs, {}).status()),
              HasSubstr("ofs: cogvideox model does not take this input"));
  write("6", "true");
  model = ConditioningModel::Load(dir.path(), {});
  ASSERT_TRUE(model.ok()) << model.status();
  auto outputs = (*model)->Compute(inputs, {"temb", "norm1"});
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  EXPECT_EQ((*outputs)[0].shape, (std::vector<int64_t>{1, 6}));
  EXPECT_EQ((*outputs)[1].shape, (std::vector<int64_t>{1, 1, 48}));
  inputs.values.erase("ofs");
  EXPECT_THAT(Message((*model)->Compute(inputs, {}).status()),
              HasSubstr("ofs: required by this cogvideox model"));
  write("6", "\"yes\"");
  EXPECT_THAT(Message(ConditioningModel::Load(dir.path(), {}).status()),
              AllOf(HasSubstr("config.json"),
                    HasSubstr("field flip_sin_to_cos: must be true or false")));
}

// A small HunyuanVideo-1.5-shaped float32 checkpoint: D = 8, two blocks,
// every Linear with a bias; the tensor named `drop` is left out.
void WriteHunyuanVideo15Checkpoint(const TempDir& dir,
                                   const std::string& drop = "") {
  WriteText(dir.File("config.json"),
            R"({"_class_name": "HunyuanVideo15Transformer3DModel",
                "num_layers": 2, "num_attention_heads": 2,
                "attention_head_dim": 4, "use_meanflow": false})");
  std::vector<TensorToWrite> tensors;
  uint32_t state = 5;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    if (name != drop) {
      tensors.push_back(RandomFloat32(name, std::move(shape), &state));
    }
  };
  auto linear = [&](const std::string& prefix, int64_t out, int64_t in) {
    add(prefix + ".weight", {out, in});
    add(prefix + ".bias", {out});
  };
  linear("time_embed.timestep_embedder.linear_1", 8, 256);
  linear("time_embed.timestep_embedder.linear_2", 8, 8);
  for (int i = 0; i < 2; ++i) {
    const std::string block = absl::StrCat("transformer_blocks.", i);
    linear(block + ".norm1.linear", 48, 8);
    linear(block + ".norm1_context.linear", 48, 8);
  }
  linear("norm_out.linear", 16, 8);
  ASSERT_TRUE(
      WriteSafetensors(dir.File("diffusion_pytorch_model.safetensors"), tensors)
          .ok());
}

TEST(CheckpointTest, RefusesMissingBiasOfALinearThatHasOne) {
  TempDir dir;
  WriteHunyuanVideo15Checkpoint(dir);
  auto model = ConditioningModel::Load(dir.path(), {});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->family().name, "hunyuanvideo-1.5");
  WriteHunyuanVideo15Checkpoint(
      dir, "transformer_blocks.1.norm1_context.linear.bias");
  model = ConditioningModel::Load(dir.path(), {});
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(model.status()),
              AllOf(HasSubstr("tensor \"transformer_blocks.1.norm1_context."
                              "linear.bias\""),
                    HasSubstr("missing")));
  // The super-resolution (MeanFlow) model embeds a second timestep with
  // its own embedder, which this checkpoint lacks.
  WriteHunyuanVideo15Checkpoint(dir);
  WriteText(dir.File("config.json"),
            R"({"_class_name": "HunyuanVideo15Transformer3DModel",
                "num_layers": 2, "num_attention_heads": 2,
                "attention_head_dim": 4, "use_meanflow": true})");
  model = ConditioningModel::Load(dir.path(), {});
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(model.status()),
              HasSubstr("tensor \"time_embed.timestep_embedder_r.linear_1."
                        "weight\""));
}

// A small FLUX.2-shaped float32 checkpoint: D = 8, no Linear with a bias,
// the guidance embedder when `guidance`.
void WriteFlux2Checkpoint(const TempDir& dir, bool guidance) {
  WriteText(dir.File("config.json"),
            absl::StrCat(R"({"_class_name": "Flux2Transformer2DModel",
                "num_layers": 2, "num_single_layers": 3,
                "num_attention_heads": 2, "attention_head_dim": 4,
                "guidance_embeds": )",
                         guidance ? "true" : "false", "}"));
  std::vector<TensorToWrite> tensors;
  uint32_t state = 7;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    tensors.push_back(RandomFloat32(name, std::move(shape), &state));
  };
  add("time_guidance_embed.timestep_embedder.linear_1.weight", {8, 256});
  add("time_guidance_embed.timestep_embedder.linear_2.weight", {8, 8});
  if (guidance) {
    add("time_guidance_embed.guidance_embedder.linear_1.weight", {8, 256});
    add("time_guidance_embed.guidance_embedder.linear_2.weight", {8, 8});
  }
  add("double_stream_modulation_img.linear.weight", {48, 8});
  add("double_stream_modulation_txt.linear.weight", {48, 8});
  add("single_stream_modulation.linear.weight", {24, 8});
  add("norm_out.linear.weight", {16, 8});
  ASSERT_TRUE(
      WriteSafetensors(dir.File("diffusion_pytorch_model.safetensors"), tensors)
          .ok());
}

TEST(ConditioningModelTest, Flux2LinearsWithoutBiasAndSharedModulations) {
  for (const bool guidance : {true, false}) {
    TempDir dir;
    WriteFlux2Checkpoint(dir, guidance);
    auto model = ConditioningModel::Load(dir.path(), {});
    ASSERT_TRUE(model.ok()) << model.status();
    // Weights only: (2 or 4) MLP Linears, four modulation Linears.
    const int64_t weights =
        (guidance ? 2 : 1) * (8 * 256 + 8 * 8) + 48 * 8 * 2 + 24 * 8 + 16 * 8;
    EXPECT_EQ((*model)->weight_bytes(), 4 * weights);
    ConditioningInputs inputs;
    inputs.values["t"] = {999.0f, 1.5f};
    if (guidance) inputs.values["guidance"] = {3.5f};
    auto outputs = (*model)->Compute(inputs, {});
    ASSERT_TRUE(outputs.ok()) << outputs.status();
    std::vector<std::string> names;
    std::vector<std::vector<int64_t>> shapes;
    for (const ConditioningOutput& output : *outputs) {
      names.push_back(output.name);
      shapes.push_back(output.shape);
    }
    // One [N, W] row per modulation, whatever the block counts.
    EXPECT_EQ(names, (std::vector<std::string>{"temb", "img_mod", "txt_mod",
                                               "single_mod", "norm_out"}));
    EXPECT_EQ(shapes, (std::vector<std::vector<int64_t>>{
                          {2, 8}, {2, 48}, {2, 48}, {2, 24}, {2, 16}}));
  }
}

TEST(ConditioningModelTest, EmbedderInputsStandInForTheirInputs) {
  TempDir dir;
  WriteFlux2Checkpoint(dir, /*guidance=*/true);
  auto model = ConditioningModel::Load(dir.path(), {});
  ASSERT_TRUE(model.ok()) << model.status();
  // Where an offload patch captures each, and what each replaces.
  std::vector<std::string> described;
  for (const InputInfo& input : (*model)->inputs()) {
    described.push_back(absl::StrCat(input.name, ":", input.stands_for, ":",
                                     input.instead_of, ":", input.module, ":",
                                     input.argument));
  }
  EXPECT_EQ(described, (std::vector<std::string>{
                           "t::::", "guidance::::", "timestep:t_passed:t::",
                           "embedder_timestep:t_model:t:time_guidance_embed:"
                           "timestep",
                           "embedder_guidance:g_model:guidance:time_guidance_"
                           "embed:guidance"}));
  EXPECT_EQ((*model)->config_fields().at("guidance_embeds"), "true");
  // The values the embedder receives give the bits of t and the guidance
  // scale.
  ConditioningInputs by_scale;
  by_scale.values["t"] = {999.0f, 1.5f};
  by_scale.values["guidance"] = {3.5f};
  auto values = (*model)->Compute(by_scale, {"t_model", "g_model"});
  ASSERT_TRUE(values.ok()) << values.status();
  auto floats = [](const ConditioningOutput& output) {
    std::vector<float> out(output.data.size() / 4);
    std::memcpy(out.data(), output.data.data(), output.data.size());
    return out;
  };
  ConditioningInputs by_embedder;
  by_embedder.values["embedder_timestep"] = floats((*values)[0]);
  by_embedder.values["embedder_guidance"] = floats((*values)[1]);
  auto want = (*model)->Compute(by_scale, {});
  auto got = (*model)->Compute(by_embedder, {});
  ASSERT_TRUE(want.ok() && got.ok()) << got.status();
  ASSERT_EQ(want->size(), got->size());
  for (size_t i = 0; i < want->size(); ++i) {
    EXPECT_EQ((*want)[i].data, (*got)[i].data) << (*want)[i].name;
  }
  // An input and the one standing in for it, or two for t, are refused.
  ConditioningInputs both = by_embedder;
  both.values["guidance"] = {3.5f};
  EXPECT_THAT(Message((*model)->Compute(both, {}).status()),
              HasSubstr("embedder_guidance: given with guidance"));
  both = by_embedder;
  both.values["timestep"] = {0.5f};
  EXPECT_THAT(Message((*model)->Compute(both, {}).status()),
              HasSubstr("given with"));
  // What comes before the embedder's value needs t.
  EXPECT_THAT(Message((*model)->Compute(by_embedder, {"t_passed"}).status()),
              HasSubstr("is computed from t"));
}

// A small SDXL-UNet-shaped float32 checkpoint: block_out_channels [4, 6, 8]
// (time embedding 16 wide), one resnet per down block, added time ids
// embedded 4 wide beside a pooled embedding of 3.  `config` replaces
// fields of config.json ("key": value pairs appended last win).
void WriteSdxlUnetCheckpoint(const TempDir& dir,
                             const std::string& config = "") {
  WriteText(dir.File("config.json"),
            absl::StrCat(R"({"_class_name": "UNet2DConditionModel",
                "addition_embed_type": "text_time",
                "time_embedding_type": "positional", "act_fn": "silu",
                "flip_sin_to_cos": true, "freq_shift": 0,
                "resnet_time_scale_shift": "default",
                "resnet_skip_time_act": false, "time_cond_proj_dim": null,
                "mid_block_type": "UNetMidBlock2DCrossAttn",
                "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D",
                                     "CrossAttnDownBlock2D"],
                "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                                   "UpBlock2D"],
                "block_out_channels": [4, 6, 8], "layers_per_block": 1,
                "addition_time_embed_dim": 4,
                "projection_class_embeddings_input_dim": 27)",
                         config, "}"));
  std::vector<TensorToWrite> tensors;
  uint32_t state = 9;
  auto linear = [&](const std::string& prefix, int64_t out, int64_t in) {
    tensors.push_back(RandomFloat32(prefix + ".weight", {out, in}, &state));
    tensors.push_back(RandomFloat32(prefix + ".bias", {out}, &state));
  };
  linear("time_embedding.linear_1", 16, 4);
  linear("time_embedding.linear_2", 16, 16);
  linear("add_embedding.linear_1", 16, 27);
  linear("add_embedding.linear_2", 16, 16);
  const int64_t widths[] = {4, 6, 8};
  for (int b = 0; b < 3; ++b) {
    linear(absl::StrCat("down_blocks.", b, ".resnets.0.time_emb_proj"),
           widths[b], 16);
    for (int j = 0; j < 2; ++j) {
      linear(absl::StrCat("up_blocks.", b, ".resnets.", j, ".time_emb_proj"),
             widths[2 - b], 16);
    }
  }
  linear("mid_block.resnets.0.time_emb_proj", 8, 16);
  linear("mid_block.resnets.1.time_emb_proj", 8, 16);
  ASSERT_TRUE(
      WriteSafetensors(dir.File("diffusion_pytorch_model.safetensors"), tensors)
          .ok());
}

TEST(ConditioningModelTest, SdxlUnetResnetsGroupedByBlockWithTheirWidths) {
  TempDir dir;
  WriteSdxlUnetCheckpoint(dir);
  auto model = ConditioningModel::Load(dir.path(), {});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->width(), 16);  // block_out_channels[0] * 4
  ConditioningInputs inputs;
  inputs.values["t"] = {999.0f, 1.5f};
  inputs.values["pooled"] = {0.5f, -1.0f, 2.0f};
  inputs.values["time_ids"] = {0, 0, 0, 0, 0, 1000};
  auto outputs = (*model)->Compute(inputs, {});
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  for (const ConditioningOutput& output : *outputs) {
    names.push_back(output.name);
    shapes.push_back(output.shape);
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{
                "temb", "down_blocks.0", "down_blocks.1", "down_blocks.2",
                "mid_block", "up_blocks.0", "up_blocks.1", "up_blocks.2"}));
  EXPECT_EQ(shapes, (std::vector<std::vector<int64_t>>{{2, 16},
                                                       {2, 1, 4},
                                                       {2, 1, 6},
                                                       {2, 1, 8},
                                                       {2, 2, 8},
                                                       {2, 2, 8},
                                                       {2, 2, 6},
                                                       {2, 2, 4}}));
  // The add embedding's input: the pooled embedding, then each time id's
  // 4-wide sinusoid (cos first) in order; an id of 0 embeds as 1, 1, 0, 0.
  outputs = (*model)->Compute(inputs, {"add_in_float"});
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  const ConditioningOutput& add_in = (*outputs)[0];
  ASSERT_EQ(add_in.shape, (std::vector<int64_t>{2, 27}));
  std::vector<float> row(27);
  std::memcpy(row.data(), add_in.data.data() + 27 * 4, 27 * 4);  // row 1
  EXPECT_EQ(std::vector<float>(row.begin(), row.begin() + 3),
            (std::vector<float>{0.5f, -1.0f, 2.0f}));
  for (int id = 0; id < 5; ++id) {
    EXPECT_EQ(
        std::vector<float>(row.begin() + 3 + 4 * id, row.begin() + 7 + 4 * id),
        (std::vector<float>{1, 1, 0, 0}))
        << id;
  }
  // Frequencies exp(-ln(10000) * k / 2), k = 0, 1: 1 and 0.01.
  EXPECT_NEAR(row[23], std::cos(1000.0), 1e-4);
  EXPECT_NEAR(row[24], std::cos(10.0), 1e-5);
  EXPECT_NEAR(row[25], std::sin(1000.0), 1e-4);
  EXPECT_NEAR(row[26], std::sin(10.0), 1e-5);
  inputs.values["time_ids"].clear();
  EXPECT_THAT(Message((*model)->Compute(inputs, {}).status()),
              HasSubstr("time_ids: required by this sdxl-unet model"));
}

TEST(CheckpointTest, RefusesUnetConfigsTheSdxlDescriptionDoesNotFollow) {
  TempDir dir;
  const std::pair<const char*, std::vector<const char*>> cases[] = {
      {R"(, "addition_embed_type": "text")",
       {"field addition_embed_type: \"text\" is not supported",
        "supported: \"text_time\""}},
      {R"(, "time_cond_proj_dim": 256)",
       {"field time_cond_proj_dim: 256 is not supported"}},
      {R"(, "block_out_channels": [4, 6, 8, 8])",
       {"field block_out_channels: must be a list of 3 entries"}},
      {R"(, "block_out_channels": [4, 6, 0])",
       {"field block_out_channels: entry 2 must be an integer"}},
      {R"(, "layers_per_block": [1, 1, 1])",
       {"field layers_per_block: must be an integer"}},
      {R"(, "projection_class_embeddings_input_dim": 24)",
       {"config expression", "addition_time_embed_dim", "is 0"}},
  };
  for (const auto& [config, expected] : cases) {
    WriteSdxlUnetCheckpoint(dir, config);
    const std::string message =
        Message(ConditioningModel::Load(dir.path(), {}).status());
    EXPECT_THAT(message, HasSubstr("config.json")) << config;
    for (const char* part : expected) {
      EXPECT_THAT(message, HasSubstr(part)) << config;
    }
  }
}

// Lumina-Image-2.0's time embedding is min(hidden_size, 1024) wide: a
// checkpoint whose first Linear is hidden_size wide is refused at 2048 wide
// naming the 1024 expected, and loads at 512.
TEST(CheckpointTest, ReadsWidthsThroughMinInAConfigExpression) {
  TempDir dir;
  for (const int64_t width : {2048, 512}) {
    WriteText(dir.File("config.json"),
              absl::StrCat(R"({"_class_name": "Lumina2Transformer2DModel",
                  "num_layers": 1, "num_refiner_layers": 1,
                  "hidden_size": )",
                           width, "}"));
    const int64_t embedding = std::min<int64_t>(width, 1024);
    std::vector<TensorToWrite> tensors;
    uint32_t state = 3;
    auto linear = [&](const std::string& prefix, int64_t out, int64_t in) {
      tensors.push_back(RandomFloat32(prefix + ".weight", {out, in}, &state));
      tensors.push_back(RandomFloat32(prefix + ".bias", {out}, &state));
    };
    linear("time_caption_embed.timestep_embedder.linear_1", width, 256);
    linear("time_caption_embed.timestep_embedder.linear_2", embedding, width);
    linear("noise_refiner.0.norm1.linear", 4 * width, embedding);
    linear("layers.0.norm1.linear", 4 * width, embedding);
    linear("norm_out.linear_1", width, embedding);
    ASSERT_TRUE(WriteSafetensors(
                    dir.File("diffusion_pytorch_model.safetensors"), tensors)
                    .ok());
    auto model = ConditioningModel::Load(dir.path(), {});
    if (width > 1024) {
      EXPECT_THAT(Message(model.status()),
                  AllOf(HasSubstr("linear_1.weight"), HasSubstr("[1024, 256]"),
                        HasSubstr("[2048, 256]")));
    } else {
      EXPECT_TRUE(model.ok()) << model.status();
    }
  }
}

// The folder's temb.json: an unknown field or value is refused, naming the
// file and the field, rather than computed in a dtype nobody asked for.
TEST(CheckpointTest, RefusesBadFolderOptionsNamingTheFileAndField) {
  TempDir dir;
  WriteQwenCheckpoint(dir.path());
  const std::string file = dir.File("temb.json");
  WriteText(file, R"({"torch_dtyp": "bfloat16"})");
  auto model = ConditioningModel::Load(dir.path(), {});
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(model.status()),
              AllOf(HasSubstr(file), HasSubstr("field \"torch_dtyp\""),
                    HasSubstr("unknown")));
  WriteText(file, R"({"torch_dtype": "float64"})");
  model = ConditioningModel::Load(dir.path(), {});
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(model.status()),
              AllOf(HasSubstr(file), HasSubstr("field torch_dtype"),
                    HasSubstr("got \"float64\""), HasSubstr("bfloat16")));
  WriteText(file, R"({"torch_dtype": 16})");
  EXPECT_THAT(Message(ConditioningModel::Load(dir.path(), {}).status()),
              AllOf(HasSubstr(file), HasSubstr("field torch_dtype"),
                    HasSubstr("must be a string, got 16")));
  WriteText(file, R"(["bfloat16"])");
  EXPECT_THAT(Message(ConditioningModel::Load(dir.path(), {}).status()),
              AllOf(HasSubstr(file), HasSubstr("not a JSON object")));
  EXPECT_THAT(Message(ParseTorchDType("bf17").status()),
              HasSubstr("got \"bf17\""));
  ConditioningOptions options;
  options.torch_dtype = DType::kFloat64;
  EXPECT_THAT(Message(ConditioningModel::Load(dir.path(), options).status()),
              HasSubstr("torch_dtype: fp64 is not one of fp32, bf16, fp16"));
}

// Every tensor of `from`'s single file rounded to bf16 into `to`, with its
// config.json: the folder a bf16 save_pretrained of the same model writes.
void WriteBFloat16Copy(const TempDir& from, const TempDir& to) {
  auto file = SafetensorsFile::Open(from.File(kSingleWeightsFile));
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<TensorToWrite> tensors;
  for (const auto& [name, entry] : (*file)->tensors()) {
    auto bytes = (*file)->Read(entry);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    TensorToWrite tensor{name, DType::kBFloat16, entry.shape, {}};
    tensor.data.resize(bytes->size() / 2);
    for (size_t i = 0; i < tensor.data.size() / 2; ++i) {
      float value;
      std::memcpy(&value, bytes->data() + i * 4, 4);
      const uint16_t bits = FloatToBFloat16(value);
      std::memcpy(&tensor.data[i * 2], &bits, 2);
    }
    tensors.push_back(std::move(tensor));
  }
  ASSERT_TRUE(WriteSafetensors(to.File(kSingleWeightsFile), tensors).ok());
  auto config = ReadFile(from.File(kConfigFile), "config");
  ASSERT_TRUE(config.ok()) << config.status();
  WriteText(to.File(kConfigFile), *config);
}

// An fp32 folder loaded with torch_dtype bf16 holds half the bytes, computes
// in bf16, and gives the bits of the same model saved in bf16; the override
// is part of the cache key.
TEST(ConditioningModelTest, TorchDTypeKeepsOnlyTheConvertedWeights) {
  TempDir dir;
  WriteQwenCheckpoint(dir.path());
  auto stored = ConditioningModel::Load(dir.path(), {});
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ((*stored)->dtype(), DType::kFloat32);
  ConditioningOptions options;
  options.torch_dtype = DType::kBFloat16;
  auto converted = ConditioningModel::Load(dir.path(), options);
  ASSERT_TRUE(converted.ok()) << converted.status();
  EXPECT_EQ((*converted)->dtype(), DType::kBFloat16);
  EXPECT_EQ((*converted)->weight_bytes() * 2, (*stored)->weight_bytes());
  EXPECT_NE((*converted)->cache_key(), (*stored)->cache_key());

  TempDir bf16;
  WriteBFloat16Copy(dir, bf16);
  auto saved_bf16 = ConditioningModel::Load(bf16.path(), {});
  ASSERT_TRUE(saved_bf16.ok()) << saved_bf16.status();
  EXPECT_EQ((*saved_bf16)->weight_bytes(), (*converted)->weight_bytes());
  ConditioningInputs inputs;
  inputs.values["t"] = {1000.0f, 992.3125f, 0.5f};
  auto got = (*converted)->Compute(inputs, {});
  auto expected = (*saved_bf16)->Compute(inputs, {});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_EQ(got->size(), expected->size());
  for (size_t i = 0; i < got->size(); ++i) {
    EXPECT_EQ((*got)[i].dtype, DType::kBFloat16) << (*got)[i].name;
    EXPECT_EQ((*got)[i].data, (*expected)[i].data) << (*got)[i].name;
  }
}

// temb.json sets the dtype the server and the CLI load a folder in; the
// option, set, overrides it.
TEST(ConditioningModelTest, TorchDTypeOptionOverridesTheFolderFile) {
  TempDir dir;
  WriteQwenCheckpoint(dir.path());
  auto stored = ConditioningModel::Load(dir.path(), {});
  ASSERT_TRUE(stored.ok()) << stored.status();
  WriteText(dir.File("temb.json"), R"({"torch_dtype": "bfloat16"})");
  auto from_file = ConditioningModel::Load(dir.path(), {});
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_EQ((*from_file)->dtype(), DType::kBFloat16);
  EXPECT_EQ((*from_file)->weight_bytes() * 2, (*stored)->weight_bytes());
  ConditioningOptions options;
  options.torch_dtype = DType::kFloat32;
  auto overridden = ConditioningModel::Load(dir.path(), options);
  ASSERT_TRUE(overridden.ok()) << overridden.status();
  EXPECT_EQ((*overridden)->dtype(), DType::kFloat32);
  EXPECT_EQ((*overridden)->weight_bytes(), (*stored)->weight_bytes());
}

// Wan under a torch_dtype: the kept modules (time_embedder, the tables)
// stay float32 whatever it is; time_proj alone follows it.
TEST(ConditioningModelTest, TorchDTypeLeavesTheKeptModulesInFloat32) {
  TempDir dir;
  WriteWanCheckpoint(dir);
  auto stored = ConditioningModel::Load(dir.path(), {});
  ASSERT_TRUE(stored.ok()) << stored.status();
  ConditioningOptions options;
  options.torch_dtype = DType::kFloat32;
  auto fp32 = ConditioningModel::Load(dir.path(), options);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  EXPECT_EQ((*fp32)->dtype(), DType::kFloat32);
  // time_proj (48 x 8 and 48, stored bf16) is the one tensor upcast.
  EXPECT_EQ((*fp32)->weight_bytes() - (*stored)->weight_bytes(),
            (48 * 8 + 48) * 2);
  options.torch_dtype = DType::kFloat16;
  auto fp16 = ConditioningModel::Load(dir.path(), options);
  ASSERT_TRUE(fp16.ok()) << fp16.status();
  EXPECT_EQ((*fp16)->dtype(), DType::kFloat16);
  EXPECT_EQ((*fp16)->weight_bytes(), (*stored)->weight_bytes());
  ConditioningInputs inputs;
  inputs.values["t"] = {999.0f};
  auto outputs = (*fp16)->Compute(inputs, {});
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  std::vector<DType> dtypes;
  for (const ConditioningOutput& output : *outputs) {
    dtypes.push_back(output.dtype);
  }
  EXPECT_EQ(dtypes, (std::vector<DType>{DType::kFloat16, DType::kFloat16,
                                        DType::kFloat32, DType::kFloat32}));
}

}  // namespace
}  // namespace temb::models
