// The KServe v2 <-> core conversion rules, without a server.
#include "temb/kserve/kserve_convert.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inference/model_config.pb.h"
#include "temb/v1_convert/preset_catalog.h"

namespace temb::kserve {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const Preset& Model(const std::string& name) {
  const Preset* preset = BuiltInPresetCatalog().Find(name);
  EXPECT_NE(preset, nullptr) << name;
  return *preset;
}

template <typename T>
std::string RawBytes(const std::vector<T>& values) {
  std::string bytes(values.size() * sizeof(T), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

inference::ModelInferRequest Request(const std::string& datatype,
                                     std::vector<int64_t> shape) {
  inference::ModelInferRequest request;
  request.set_model_name("sd15");
  auto* input = request.add_inputs();
  input->set_name(kInputName);
  input->set_datatype(datatype);
  for (int64_t d : shape) input->add_shape(d);
  return request;
}

void ExpectInvalid(const inference::ModelInferRequest& request,
                   const std::string& field) {
  absl::StatusOr<InferCall> call = ParseInferRequest(request, Model("sd15"));
  ASSERT_FALSE(call.ok());
  EXPECT_EQ(call.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(call.status().message()), HasSubstr(field));
}

TEST(FindModelTest, PresetsAreModelsWithVersionOne) {
  const PresetCatalog& presets = BuiltInPresetCatalog();
  EXPECT_TRUE(FindModel(presets, "flux", "").ok());
  EXPECT_TRUE(FindModel(presets, "flux", "1").ok());
  EXPECT_EQ(FindModel(presets, "flux", "2").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(FindModel(presets, "nope", "").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ParseInferRequestTest, DecodesRawInt64AndTypedFp64) {
  inference::ModelInferRequest raw = Request("INT64", {3, 1});
  raw.add_raw_input_contents(RawBytes<int64_t>({0, 999, -7}));
  absl::StatusOr<InferCall> call = ParseInferRequest(raw, Model("sd15"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->spec.preset, "sd15");
  ASSERT_EQ(call->inputs.size(), 1u);
  EXPECT_THAT(call->inputs[0].timesteps, ElementsAre(0.0f, 999.0f, -7.0f));
  EXPECT_TRUE(call->inputs[0].timesteps_shape.empty());  // [N, 1]: [N, dim]

  inference::ModelInferRequest typed = Request("FP64", {2});
  typed.mutable_inputs(0)->mutable_contents()->add_fp64_contents(0.5);
  typed.mutable_inputs(0)->mutable_contents()->add_fp64_contents(1e30);
  call = ParseInferRequest(typed, Model("sd15"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_THAT(call->inputs[0].timesteps, ElementsAre(0.5f, 1e30f));
}

TEST(ParseInferRequestTest, Parameters) {
  inference::ModelInferRequest request = Request("FP32", {1, 1});
  request.mutable_inputs(0)->mutable_contents()->add_fp32_contents(1.0f);
  (*request.mutable_parameters())["dtype"].set_string_param("BF16");
  (*request.mutable_parameters())["dim"].set_int64_param(64);
  (*request.mutable_parameters())["precision"].set_string_param("FP64");
  (*request.mutable_parameters())["triton_enable_empty_final_response"]
      .set_bool_param(false);
  absl::StatusOr<InferCall> call = ParseInferRequest(request, Model("sd15"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->spec.dtype, DType::kBFloat16);
  EXPECT_EQ(call->spec.dim, 64);  // the core decides whether sd15 allows it
  EXPECT_EQ(call->spec.precision, Precision::kFloat64);

  auto* output = request.add_outputs();
  output->set_name(kOutputName);
  (*output->mutable_parameters())["datatype"].set_string_param("FP16");
  ExpectInvalid(request, "contradicts");
  (*output->mutable_parameters())["datatype"].set_string_param("bf16");
  EXPECT_TRUE(ParseInferRequest(request, Model("sd15")).ok());

  (*request.mutable_parameters())["dtpye"].set_string_param("FP16");
  ExpectInvalid(request, "\"dtpye\"");
}

TEST(ParseInferRequestTest, RejectsMalformedTensors) {
  inference::ModelInferRequest request = Request("FP32", {2, 1});
  request.add_raw_input_contents(RawBytes<float>({1.0f}));
  ExpectInvalid(request, "raw_input_contents[0] has 4 bytes");

  request = Request("FP32", {2, 1});
  request.add_raw_input_contents(RawBytes<float>({1.0f, 2.0f}));
  request.mutable_inputs(0)->mutable_contents()->add_fp32_contents(1.0f);
  ExpectInvalid(request, "inputs[0].contents");

  request = Request("FP32", {1, 1});
  request.mutable_inputs(0)->mutable_contents()->add_int64_contents(1);
  ExpectInvalid(request, "fp32_contents only");

  // Shaped timesteps are valid up to rank 5 (see ShapedTimesteps below).
  ExpectInvalid(Request("FP32", {1, 1, 1, 1, 1, 1}), "inputs[0].shape");
  ExpectInvalid(Request("FP32", {-1, 1}), "inputs[0].shape");
  ExpectInvalid(Request("FP32", {}), "inputs[0].shape");
  ExpectInvalid(Request("UINT8", {1}), "inputs[0].datatype");

  request = Request("FP32", {1});
  request.mutable_inputs(0)->set_name("X");
  ExpectInvalid(request, "inputs[0].name");

  request = Request("FP32", {0});
  request.add_outputs()->set_name("OTHER");
  ExpectInvalid(request, "outputs[0].name");
}

TEST(ParseInferRequestTest, ShapedTimesteps) {
  inference::ModelInferRequest request = Request("FP32", {2, 3});
  for (int i = 0; i < 6; ++i) {
    request.mutable_inputs(0)->mutable_contents()->add_fp32_contents(i);
  }
  absl::StatusOr<InferCall> call = ParseInferRequest(request, Model("wan"));
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_THAT(call->inputs[0].timesteps_shape, ElementsAre(2, 3));
  EXPECT_EQ(call->inputs[0].timesteps.size(), 6u);
}

// A model with parts takes one input per part besides TIMESTEP.
TEST(ParseInferRequestTest, PartsAreInputs) {
  inference::ModelInferRequest request = Request("FP32", {1});
  request.mutable_inputs(0)->mutable_contents()->add_fp32_contents(0.5f);
  auto* guidance = request.add_inputs();
  guidance->set_name("GUIDANCE");
  guidance->set_datatype("FP32");
  guidance->add_shape(1);
  guidance->mutable_contents()->add_fp32_contents(3.5f);
  request.add_outputs()->set_name("GUIDANCE_EMBEDDING");
  absl::StatusOr<InferCall> call = ParseInferRequest(request, Model("flux"));
  ASSERT_TRUE(call.ok()) << call.status();
  ASSERT_EQ(call->inputs.size(), 2u);
  EXPECT_EQ(call->inputs[1].part, "guidance");
  EXPECT_EQ(OutputNameFor("GUIDANCE"), "GUIDANCE_EMBEDDING");
  EXPECT_EQ(OutputNameFor("TIMESTEP"), "EMBEDDING");
  // sd15 has no parts: GUIDANCE is not one of its inputs.
  EXPECT_EQ(ParseInferRequest(request, Model("sd15")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FillTest, ResponseAndModelDescriptions) {
  inference::ModelInferRequest request = Request("FP32", {2});
  request.set_id("abc");
  Embedding embedding;
  embedding.spec.dim = 4;
  embedding.spec.dtype = DType::kFloat16;
  embedding.rows = 2;
  embedding.data = std::string(16, 'x');
  inference::ModelInferResponse response;
  FillInferResponse(request, embedding, &response);
  EXPECT_EQ(response.id(), "abc");
  EXPECT_EQ(response.model_version(), "1");
  ASSERT_EQ(response.outputs_size(), 1);
  EXPECT_EQ(response.outputs(0).datatype(), "FP16");
  EXPECT_THAT(response.outputs(0).shape(), ElementsAre(2, 4));
  EXPECT_EQ(response.raw_output_contents(0), std::string(16, 'x'));

  inference::ModelConfig config;
  Limits limits;
  limits.max_batch = int64_t{1} << 40;
  FillModelConfig(Model("ddpm"), limits, &config);
  EXPECT_EQ(config.max_batch_size(), 2147483647);
  EXPECT_THAT(config.input(0).dims(), ElementsAre(1));
  EXPECT_THAT(config.output(0).dims(), ElementsAre(128));

  inference::ModelMetadataResponse metadata;
  FillModelMetadata(Model("transformer"), &metadata);
  EXPECT_THAT(metadata.inputs(0).shape(), ElementsAre(-1, 1));
  EXPECT_THAT(metadata.outputs(0).shape(), ElementsAre(-1, -1));
}

}  // namespace
}  // namespace temb::kserve
