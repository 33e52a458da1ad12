// The REST frontend without sockets: the JSON/binary wire format, the
// routes, status codes, admission and statistics, on a real CPU core.
#include "temb/rest/rest_handler.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "temb/core/admission.h"
#include "temb/kernels/dtype.h"
#include "temb/kernels/registry.h"
#include "temb/kserve/kserve_convert.h"
#include "temb/kserve/model_statistics.h"
#include "temb/kserve/shared_memory.h"
#include "temb/rest/rest_json.h"
#include "temb/v1_convert/preset_catalog.h"

namespace temb::rest {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

template <typename T>
std::string Raw(const std::vector<T>& values) {
  std::string bytes(values.size() * sizeof(T), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

class RestHandlerTest : public ::testing::Test {
 protected:
  void SetUp() override { Build(AdmissionLimits{}, nullptr); }

  void Build(AdmissionLimits admission_limits, const TokenVerifier* tokens) {
    handler_.reset();
    statistics_.reset();
    core_.reset();
    admission_ = std::make_unique<AdmissionController>(admission_limits);
    auto backend = CreateBackend(BackendChoice::kCpu, BackendOptions());
    ASSERT_TRUE(backend.ok()) << backend.status();
    EmbedService::Options options;
    options.limits.max_batch = 64;
    options.admission = admission_.get();
    core_ = std::make_unique<EmbedService>(*std::move(backend),
                                           BuiltInPresetCatalog(), options);
    statistics_ = std::make_unique<kserve::InferenceStatistics>(
        kserve::ServedModels{*core_}.Names());
    handler_ = std::make_unique<RestHandler>(*core_, admission_.get(), tokens,
                                             nullptr, statistics_.get());
  }

  HttpResponse Call(const std::string& method, const std::string& path,
                    const std::string& body = "",
                    const std::string& header_length = "",
                    const std::string& authorization = "") {
    HttpRequest request;
    request.method = method;
    request.path = path;
    request.body = body;
    request.header_length = header_length;
    request.authorization = authorization;
    HttpResponse response;
    handler_->Handle(request, &response);
    return response;
  }

  static json Json(const HttpResponse& response) {
    EXPECT_FALSE(response.body.empty());
    return json::parse(response.body.empty() ? "null" : response.body[0]);
  }

  // The bytes of the gRPC path for the same timesteps.
  std::string GrpcBytes(const std::string& model,
                        const std::vector<float>& timesteps,
                        const std::string& dtype = "") {
    inference::ModelInferRequest request;
    request.set_model_name(model);
    auto* input = request.add_inputs();
    input->set_name("TIMESTEP");
    input->set_datatype("FP32");
    input->add_shape(static_cast<int64_t>(timesteps.size()));
    input->add_shape(1);
    request.add_raw_input_contents(Raw(timesteps));
    if (!dtype.empty()) {
      (*request.mutable_parameters())["dtype"].set_string_param(dtype);
    }
    inference::ModelInferResponse response;
    EXPECT_TRUE(kserve::Infer(*core_, request, &response).ok());
    return response.raw_output_contents(0);
  }

  std::unique_ptr<AdmissionController> admission_;
  std::unique_ptr<EmbedService> core_;
  std::unique_ptr<kserve::InferenceStatistics> statistics_;
  std::unique_ptr<RestHandler> handler_;
};

TEST_F(RestHandlerTest, HealthAndMetadata) {
  EXPECT_EQ(Call("GET", "/v2/health/live").status, 200);
  EXPECT_EQ(Call("GET", "/v2/health/ready").status, 200);
  const json server = Json(Call("GET", "/v2"));
  EXPECT_EQ(server["name"], "temb");
  EXPECT_THAT(server["extensions"].get<std::vector<std::string>>(),
              ::testing::IsSupersetOf(
                  {"statistics", "binary_tensor_data", "model_configuration"}));
  const json model = Json(Call("GET", "/v2/models/sd15/versions/1"));
  EXPECT_EQ(model["name"], "sd15");
  EXPECT_EQ(model["inputs"][0]["shape"], json({-1, 1}));
  EXPECT_EQ(model["outputs"][0]["shape"], json({-1, 320}));
  // Triton's HTTP config: 64-bit integers as numbers, enums by name.
  const json config = Json(Call("GET", "/v2/models/sd15/config"));
  EXPECT_EQ(config["max_batch_size"], 64);
  EXPECT_EQ(config["input"][0]["dims"], json({1}));
  EXPECT_EQ(config["output"][0]["data_type"], "TYPE_FP32");
  EXPECT_EQ(Call("GET", "/v2/models/sd15/ready").status, 200);
}

TEST_F(RestHandlerTest, UnknownThingsAre404AndWrongMethods405) {
  EXPECT_EQ(Call("GET", "/v2/models/nope").status, 404);
  EXPECT_EQ(Call("GET", "/v2/models/sd15/versions/2").status, 404);
  EXPECT_EQ(Call("GET", "/v2/models/nope/ready").status, 404);
  EXPECT_EQ(Call("GET", "/v2/models/sd15/frobnicate").status, 404);
  EXPECT_EQ(Call("GET", "/v3").status, 404);
  const HttpResponse get_infer = Call("GET", "/v2/models/sd15/infer");
  EXPECT_EQ(get_infer.status, 405);
  EXPECT_THAT(Json(get_infer)["error"].get<std::string>(), HasSubstr("POST"));
  EXPECT_EQ(Call("POST", "/v2/health/live").status, 405);
  const HttpResponse unknown =
      Call("POST", "/v2/models/nope/infer",
           R"({"inputs":[{"name":"TIMESTEP","shape":[1],"datatype":"FP32",
               "data":[1]}]})");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_THAT(Json(unknown)["error"].get<std::string>(),
              HasSubstr("unknown model"));
}

TEST_F(RestHandlerTest, JsonInferMatchesGrpcBytes) {
  const HttpResponse response = Call("POST", "/v2/models/sd15/infer", R"({
      "id": "step-7",
      "inputs": [{"name": "TIMESTEP", "shape": [3, 1], "datatype": "FP32",
                  "data": [[999], [500.5], [0]]}]})");
  ASSERT_EQ(response.status, 200) << response.body[0];
  EXPECT_EQ(response.content_type, "application/json");
  const json body = Json(response);
  EXPECT_EQ(body["id"], "step-7");
  EXPECT_EQ(body["model_name"], "sd15");
  EXPECT_EQ(body["outputs"][0]["shape"], json({3, 320}));
  const std::vector<float> values =
      body["outputs"][0]["data"].get<std::vector<float>>();
  EXPECT_EQ(Raw(values), GrpcBytes("sd15", {999.0f, 500.5f, 0.0f}));
}

TEST_F(RestHandlerTest, BinaryInputsAndOutputs) {
  const std::string header = json{
      {"inputs",
       {{{"name", "TIMESTEP"},
         {"shape", {2}},
         {"datatype", "INT64"},
         {"parameters", {{"binary_data_size", 16}}}}}},
      {"outputs",
       {{{"name", "EMBEDDING"}, {"parameters", {{"binary_data", true}}}}}},
      {"parameters",
       {{"dtype", "BF16"}}}}.dump();
  const std::string body = header + Raw(std::vector<int64_t>{999, 1});
  const HttpResponse response = Call("POST", "/v2/models/sd15/infer", body,
                                     std::to_string(header.size()));
  ASSERT_EQ(response.status, 200) << response.body[0];
  ASSERT_EQ(response.body.size(), 2u);
  EXPECT_EQ(response.content_type, "application/octet-stream");
  ASSERT_EQ(response.headers.size(), 1u);
  EXPECT_EQ(response.headers[0].first, "Inference-Header-Content-Length");
  EXPECT_EQ(response.headers[0].second,
            std::to_string(response.body[0].size()));
  const json head = Json(response);
  EXPECT_EQ(head["outputs"][0]["datatype"], "BF16");
  EXPECT_EQ(head["outputs"][0]["parameters"]["binary_data_size"], 2 * 320 * 2);
  EXPECT_EQ(response.body[1], GrpcBytes("sd15", {999.0f, 1.0f}, "BF16"));
}

TEST_F(RestHandlerTest, Bf16OnlyAsBinaryAndFp16AsJsonNumbers) {
  const std::string request = R"({"parameters": {"dtype": "%s"},
      "inputs": [{"name": "TIMESTEP", "shape": [1], "datatype": "FP32",
                  "data": [10]}]})";
  std::string bf16 = request;
  bf16.replace(bf16.find("%s"), 2, "BF16");
  const HttpResponse refused = Call("POST", "/v2/models/sd15/infer", bf16);
  EXPECT_EQ(refused.status, 400);
  EXPECT_THAT(Json(refused)["error"].get<std::string>(), HasSubstr("binary"));
  std::string fp16 = request;
  fp16.replace(fp16.find("%s"), 2, "FP16");
  const HttpResponse half = Call("POST", "/v2/models/sd15/infer", fp16);
  ASSERT_EQ(half.status, 200);
  const std::vector<float> values =
      Json(half)["outputs"][0]["data"].get<std::vector<float>>();
  const std::string bits = GrpcBytes("sd15", {10.0f}, "FP16");
  ASSERT_EQ(values.size(), 320u);
  for (size_t i = 0; i < values.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, bits.data() + 2 * i, 2);
    EXPECT_EQ(values[i], HalfToFloat(h)) << i;
  }
}

TEST_F(RestHandlerTest, BadBodiesName400AndTheField) {
  const struct {
    std::string body;
    std::string header_length;
    std::string message;
  } cases[] = {
      {"{not json", "", "malformed JSON"},
      {"[]", "", "JSON object"},
      {R"({"inputs": 3})", "", "inputs"},
      {R"({"inputs": [{"name": "TIMESTEP", "datatype": "FP32",
           "data": [1]}]})",
       "", "inputs[0].shape"},
      {R"({"inputs": [{"name": "TIMESTEP", "shape": [2, 1],
           "datatype": "FP32", "data": [1]}]})",
       "", "inputs[0].data has 1 elements"},
      {R"({"inputs": [{"name": "TIMESTEP", "shape": [1],
           "datatype": "FP32", "data": ["x"]}]})",
       "", "inputs[0].data[0] must be a number"},
      {R"({"inputs": [{"name": "TIMESTEP", "shape": [1],
           "datatype": "INT64", "data": [1.5]}]})",
       "", "must be an integer"},
      {R"({"inputs": [{"name": "T", "shape": [1], "datatype": "FP32",
           "data": [1]}]})",
       "", "unknown input"},
      {R"({"inputs": [{"name": "TIMESTEP", "shape": [1], "datatype": "FP32",
           "parameters": {"binary_data_size": 4}}]})",
       "", "binary"},
      {R"({"parameters": {"dtpye": "FP16"}, "inputs": [{"name": "TIMESTEP",
           "shape": [1], "datatype": "FP32", "data": [1]}]})",
       "", "dtpye"},
      {R"({"inputs": [{"name": "TIMESTEP", "shape": [1], "datatype": "FP32",
           "data": [1e39]}]})",
       "", "timesteps[0]"},
      {"{}", "99", "larger than the body"},
      {"{}", "x", "Inference-Header-Content-Length"},
  };
  for (const auto& c : cases) {
    const HttpResponse response =
        Call("POST", "/v2/models/sd15/infer", c.body, c.header_length);
    EXPECT_EQ(response.status, 400) << c.body;
    EXPECT_THAT(Json(response)["error"].get<std::string>(),
                HasSubstr(c.message))
        << c.body;
  }
}

TEST_F(RestHandlerTest, LimitsAre400AndOverload429) {
  std::string big = R"({"inputs": [{"name": "TIMESTEP", "shape": [65],
      "datatype": "FP32", "data": [)";
  for (int i = 0; i < 65; ++i) big += i == 0 ? "1" : ",1";
  big += "]}]}";
  const HttpResponse over_batch = Call("POST", "/v2/models/sd15/infer", big);
  EXPECT_EQ(over_batch.status, 400);
  EXPECT_THAT(Json(over_batch)["error"].get<std::string>(),
              HasSubstr("must be <= 64"));

  Build(AdmissionLimits{0, 100}, nullptr);
  const HttpResponse overloaded =
      Call("POST", "/v2/models/sd15/infer", big);  // > 100 bytes
  EXPECT_EQ(overloaded.status, 429);
  EXPECT_THAT(Json(overloaded)["error"].get<std::string>(),
              HasSubstr("max_queued_bytes"));
}

TEST_F(RestHandlerTest, AcceptDecidesOnTheHeaderBeforeTheBodyIsRead) {
  HttpRequest head;
  head.method = "POST";
  head.path = "/v2/models/sd15/infer";
  HttpResponse refusal;
  // max_batch 64: 64 x 32 bytes + 64 KiB for an inference body.
  const uint64_t limit = 64 * 32 + (64 << 10);
  std::optional<BodyPermit> permit = handler_->Accept(head, 1000, &refusal);
  ASSERT_TRUE(permit.has_value());
  EXPECT_EQ(permit->max_body_bytes(), limit);
  // The declared length is held from now on; a chunked body holds the
  // limit.
  EXPECT_EQ(admission_->held_bytes(), 1000);
  EXPECT_EQ(admission_->inflight(), 1);
  permit.reset();
  EXPECT_EQ(admission_->held_bytes(), 0);
  permit = handler_->Accept(head, std::nullopt, &refusal);
  ASSERT_TRUE(permit.has_value());
  EXPECT_EQ(admission_->held_bytes(), static_cast<int64_t>(limit));
  permit.reset();

  // Over the limit: 413, nothing admitted.
  EXPECT_FALSE(handler_->Accept(head, limit + 1, &refusal).has_value());
  EXPECT_EQ(refusal.status, 413);
  EXPECT_THAT(Json(refusal)["error"].get<std::string>(),
              HasSubstr("larger than this endpoint's limit (67584 bytes)"));
  EXPECT_EQ(admission_->inflight(), 0);

  // Other endpoints take small bodies and admit nothing.
  head.path = "/v2/systemsharedmemory/region/r/register";
  permit = handler_->Accept(head, 100, &refusal);
  ASSERT_TRUE(permit.has_value());
  EXPECT_EQ(permit->max_body_bytes(), uint64_t{kMaxControlBodyBytes});
  EXPECT_EQ(admission_->inflight(), 0);
  EXPECT_FALSE(
      handler_->Accept(head, kMaxControlBodyBytes + 1, &refusal).has_value());
  EXPECT_EQ(refusal.status, 413);

  // A compressed body is refused before it is read.
  head.path = "/v2/models/sd15/infer";
  head.content_encoding = "gzip";
  EXPECT_FALSE(handler_->Accept(head, 10, &refusal).has_value());
  EXPECT_EQ(refusal.status, 400);
  EXPECT_EQ(admission_->inflight(), 0);

  // Without a token, 401 for every endpoint, body unread.
  auto tokens = TokenVerifier::FromTokens({"secret"});
  ASSERT_TRUE(tokens.ok());
  Build(AdmissionLimits{}, &*tokens);
  head.content_encoding.clear();
  EXPECT_FALSE(handler_->Accept(head, std::nullopt, &refusal).has_value());
  EXPECT_EQ(refusal.status, 401);
  EXPECT_EQ(admission_->inflight(), 0);
  head.authorization = "Bearer secret";
  EXPECT_TRUE(handler_->Accept(head, 10, &refusal).has_value());
}

TEST_F(RestHandlerTest, WhatABodyCostsOnceParsedIsHeldInAdmission) {
  // 4,000 rows of [1]: 16 KB of text, several times that once parsed.
  std::string rows;
  for (int i = 0; i < 4000; ++i) rows += i == 0 ? "[1]" : ",[1]";
  const std::string body = absl::StrCat(
      R"({"inputs": [{"name": "TIMESTEP", "shape": [4000, 1],
          "datatype": "FP32", "data": [)",
      rows, "]}]}");
  int64_t reserved = 0;
  absl::StatusOr<InferBody> parsed =
      ParseInferBody(body, std::nullopt, [&reserved](int64_t bytes) {
        reserved += bytes;
        return absl::OkStatus();
      });
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->request.inputs(0).contents().fp32_contents_size(), 4000);
  // The lexer's copy, 48 bytes an element kept aside and 24 for its typed
  // and raw copies, at least.
  EXPECT_GE(reserved, static_cast<int64_t>(body.size()) + 4000 * (48 + 24));

  // A budget smaller than that refuses the parse with its own answer.
  Build(AdmissionLimits{0, static_cast<int64_t>(body.size()) + 4096}, nullptr);
  const HttpResponse refused = Call("POST", "/v2/models/sd15/infer", body);
  EXPECT_EQ(refused.status, 429);
  EXPECT_THAT(Json(refused)["error"].get<std::string>(),
              HasSubstr("max_queued_bytes"));
  EXPECT_EQ(admission_->held_bytes(), 0);
}

TEST_F(RestHandlerTest, DrainingIs503AndNotReady) {
  admission_->StartDraining();
  EXPECT_EQ(Call("GET", "/v2/health/live").status, 200);
  EXPECT_EQ(Call("GET", "/v2/health/ready").status, 503);
  EXPECT_EQ(Call("GET", "/v2/models/sd15/ready").status, 503);
  EXPECT_EQ(Call("GET", "/v2/models/sd15").status, 503);
  const HttpResponse infer = Call("POST", "/v2/models/sd15/infer", "{}");
  EXPECT_EQ(infer.status, 503);
  EXPECT_THAT(Json(infer)["error"].get<std::string>(), HasSubstr("draining"));
}

TEST_F(RestHandlerTest, TokensGuardEverythingWith401) {
  auto tokens = TokenVerifier::FromTokens({"secret"});
  ASSERT_TRUE(tokens.ok());
  Build(AdmissionLimits{}, &*tokens);
  for (const auto& [method, path] :
       std::vector<std::pair<std::string, std::string>>{
           {"GET", "/v2/health/live"},
           {"GET", "/v2/health/ready"},
           {"GET", "/v2"},
           {"GET", "/v2/models/sd15"},
           {"GET", "/v2/models/sd15/ready"},
           {"GET", "/v2/models/sd15/config"},
           {"GET", "/v2/models/sd15/stats"},
           {"GET", "/v2/models/stats"},
           {"POST", "/v2/models/sd15/infer"}}) {
    const HttpResponse refused = Call(method, path, "{}", "", "Bearer wrong");
    EXPECT_EQ(refused.status, 401) << path;
    ASSERT_FALSE(refused.headers.empty()) << path;
    EXPECT_EQ(refused.headers[0].first, "WWW-Authenticate");
    EXPECT_NE(Call(method, path, "{}", "", "Bearer secret").status, 401)
        << path;
  }
}

TEST_F(RestHandlerTest, StatisticsCountRequestsAndInferences) {
  const std::string request = R"({"inputs": [{"name": "TIMESTEP",
      "shape": [4, 1], "datatype": "FP32", "data": [1, 2, 3, 4]}]})";
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(Call("POST", "/v2/models/sdxl/infer", request).status, 200);
  }
  EXPECT_EQ(Call("POST", "/v2/models/sdxl/infer", "{").status, 400);
  const json stats = Json(Call("GET", "/v2/models/sdxl/stats"));
  ASSERT_EQ(stats["model_stats"].size(), 1u);
  const json& sdxl = stats["model_stats"][0];
  EXPECT_EQ(sdxl["name"], "sdxl");
  EXPECT_EQ(sdxl["version"], "1");
  EXPECT_EQ(sdxl["inference_count"], 12);
  EXPECT_EQ(sdxl["execution_count"], 3);
  EXPECT_EQ(sdxl["inference_stats"]["success"]["count"], 3);
  EXPECT_EQ(sdxl["inference_stats"]["fail"]["count"], 1);
  for (const char* phase :
       {"queue", "compute_input", "compute_infer", "compute_output"}) {
    EXPECT_EQ(sdxl["inference_stats"][phase]["count"], 3) << phase;
    EXPECT_TRUE(sdxl["inference_stats"][phase]["ns"].is_number_unsigned());
  }
  EXPECT_GT(sdxl["inference_stats"]["compute_infer"]["ns"].get<uint64_t>(), 0u);
  EXPECT_GT(sdxl["last_inference"].get<uint64_t>(), 0u);
  const json all = Json(Call("GET", "/v2/models/stats"));
  EXPECT_EQ(all["model_stats"].size(), core_->presets().presets().size());
  EXPECT_EQ(Call("GET", "/v2/models/nope/stats").status, 404);
  EXPECT_EQ(Call("GET", "/v2/models/sdxl/versions/3/stats").status, 404);
}

TEST(RestJsonTest, MixedBinaryAndJsonInputsBecomeRawContents) {
  const std::string header = R"({"inputs": [
      {"name": "A", "shape": [2], "datatype": "INT32", "data": [7, -1]},
      {"name": "B", "shape": [1], "datatype": "FP64",
       "parameters": {"binary_data_size": 8}}]})";
  const std::string body = header + Raw(std::vector<double>{2.5});
  auto parsed = ParseInferBody(body, header.size());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->request.raw_input_contents_size(), 2);
  EXPECT_EQ(parsed->request.raw_input_contents(0),
            Raw(std::vector<int32_t>{7, -1}));
  EXPECT_EQ(parsed->request.raw_input_contents(1),
            Raw(std::vector<double>{2.5}));
  EXPECT_TRUE(parsed->request.inputs(1).parameters().empty());
  EXPECT_EQ(ParseInferBody(body + "x", header.size()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RestJsonTest, BinarySizesThatWouldWrapAreRefused) {
  // 2^64 - 1 plus 2 wraps to 1, the byte the body carries: the sum must be
  // refused before any input is cut out of the body.
  const std::string json = R"({"inputs": [
      {"name": "TIMESTEP", "shape": [1], "datatype": "FP32",
       "parameters": {"binary_data_size": 18446744073709551615}},
      {"name": "GUIDANCE", "shape": [1], "datatype": "FP32",
       "parameters": {"binary_data_size": 2}}]})";
  const absl::StatusOr<InferBody> body =
      ParseInferBody(json + "x", json.size());
  EXPECT_EQ(body.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(body.status().message()),
              HasSubstr("add up to more than the 1 bytes"));
}

TEST(RestJsonTest, JsonNestedPastTheLimitIsRefusedWithoutRecursion) {
  for (const std::string& field : {"data", "shape"}) {
    std::string nested(100000, '[');
    nested += std::string(100000, ']');
    const std::string json =
        absl::StrCat(R"({"inputs": [{"name": "TIMESTEP", "datatype": "FP32", )",
                     field == "data" ? R"("shape": [1], "data": )"
                                     : R"("data": [1], "shape": )",
                     nested, "}]}");
    const absl::StatusOr<InferBody> body = ParseInferBody(json, std::nullopt);
    EXPECT_EQ(body.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(body.status().message()),
                HasSubstr("nests deeper than 32 levels"));
  }
}

TEST(RestSharedMemoryTest, ByteCountsMustBeWholeNonNegativeIntegers) {
  AdmissionController admission(AdmissionLimits{});
  auto backend = CreateBackend(BackendChoice::kCpu, BackendOptions());
  ASSERT_TRUE(backend.ok()) << backend.status();
  EmbedService core(*std::move(backend), BuiltInPresetCatalog(), {});
  kserve::SharedMemoryRegistry registry;
  RestHandler handler(core, &admission, nullptr, nullptr, nullptr, &registry);
  for (const char* size : {"16.9", "1e30", "-1", "9223372036854775808"}) {
    HttpRequest request;
    request.method = "POST";
    request.path = "/v2/systemsharedmemory/region/r/register";
    request.body =
        absl::StrCat(R"({"key": "/temb-none", "byte_size": )", size, "}");
    HttpResponse response;
    handler.Handle(request, &response);
    EXPECT_EQ(response.status, 400) << size;
    const std::string body = response.body.empty() ? "" : response.body[0];
    EXPECT_THAT(body, HasSubstr("byte_size")) << size;
    EXPECT_THAT(body, HasSubstr("must be an integer in [0, "
                                "9223372036854775807]"))
        << size;
  }
}

TEST(RestJsonTest, StatusCodes) {
  EXPECT_EQ(HttpStatusFor(absl::InvalidArgumentError("x")), 400);
  EXPECT_EQ(HttpStatusFor(absl::ResourceExhaustedError("dim 99 > max_dim")),
            400);
  EXPECT_EQ(HttpStatusFor(
                OverloadedError("server overloaded: max_inflight (1) calls")),
            429);
  // The mark decides, not the words.
  EXPECT_EQ(HttpStatusFor(absl::ResourceExhaustedError(
                "server overloaded: max_inflight (1) calls")),
            400);
  EXPECT_EQ(HttpStatusFor(absl::UnauthenticatedError("x")), 401);
  EXPECT_EQ(HttpStatusFor(absl::NotFoundError("x")), 404);
  EXPECT_EQ(HttpStatusFor(absl::UnavailableError("x")), 503);
  EXPECT_EQ(HttpStatusFor(absl::InternalError("x")), 500);
  Limits limits;
  limits.max_batch = 10;
  EXPECT_EQ(MaxRequestBodyBytes(limits), 10 * 32 + 65536);
}

TEST(RestJsonTest, ErrorJsonEscapesAndSurvivesBadUtf8) {
  const json error = json::parse(ErrorJson("bad \"x\"\n\xff"));
  EXPECT_THAT(error["error"].get<std::string>(), HasSubstr("bad \"x\""));
}

TEST(ModelStatisticsTest, RecordsPerModelAndIgnoresUnknownModels) {
  kserve::InferenceStatistics stats({"flux", "sd"});
  const int64_t phases[4] = {1, 2, 3, 4};
  stats.Record("flux", true, 8, 100, phases);
  stats.Record("flux", true, 2, 50, phases);
  stats.Record("flux", false, 0, 7, phases);
  stats.Record("nope", true, 1, 1, phases);
  inference::ModelStatisticsResponse response;
  ASSERT_TRUE(stats.Fill("flux", "", &response).ok());
  ASSERT_EQ(response.model_stats_size(), 1);
  const auto& flux = response.model_stats(0);
  EXPECT_EQ(flux.inference_count(), 10u);
  EXPECT_EQ(flux.execution_count(), 2u);
  EXPECT_EQ(flux.inference_stats().success().count(), 2u);
  EXPECT_EQ(flux.inference_stats().success().ns(), 150u);
  EXPECT_EQ(flux.inference_stats().fail().count(), 1u);
  EXPECT_EQ(flux.inference_stats().fail().ns(), 7u);
  EXPECT_EQ(flux.inference_stats().queue().ns(), 2u);
  EXPECT_EQ(flux.inference_stats().compute_input().ns(), 4u);
  EXPECT_EQ(flux.inference_stats().compute_infer().ns(), 6u);
  EXPECT_EQ(flux.inference_stats().compute_output().ns(), 8u);
  EXPECT_EQ(stats.Fill("flux", "2", &response).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(stats.Fill("nope", "", &response).code(),
            absl::StatusCode::kNotFound);
  inference::ModelStatisticsResponse all;
  ASSERT_TRUE(stats.Fill("", "", &all).ok());
  EXPECT_EQ(all.model_stats_size(), 2);
}

}  // namespace
}  // namespace temb::rest
