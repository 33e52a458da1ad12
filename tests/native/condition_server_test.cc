// temb.v1 Condition and ConditionStream end to end inside one process: App
// (the assembly temb-server runs) on 127.0.0.1:0 with a model repository of
// small checkpoints (a good model, one with a tensor left out and one with
// a truncated file), driven through the generated stub, and every answer
// compared with ConditioningService::Serve on the same repository.
#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "temb/app/app.h"
#include "temb/core/conditioning_service.h"
#include "temb/kernels/dtype.h"
#include "temb/testing/gated_backend.h"
#include "temb/v1/temb.grpc.pb.h"
#include "test_checkpoints.h"

namespace temb {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr auto kCallTimeout = std::chrono::seconds(30);

v1::NamedTensor Float32Input(const std::string& name,
                             const std::vector<float>& values,
                             std::vector<int64_t> shape = {}) {
  v1::NamedTensor input;
  input.set_name(name);
  v1::Tensor* tensor = input.mutable_tensor();
  tensor->set_dtype(v1::DTYPE_FP32);
  if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
  tensor->mutable_shape()->Add(shape.begin(), shape.end());
  tensor->set_data(std::string(reinterpret_cast<const char*>(values.data()),
                               values.size() * sizeof(float)));
  return input;
}

class ConditionServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"qwen", "broken", "truncated"}) {
      ASSERT_EQ(mkdir(repository_.File(name).c_str(), 0755), 0);
    }
    models::WriteQwenCheckpoint(repository_.File("qwen"));
    models::WriteQwenCheckpoint(repository_.File("broken"), /*bad=*/2);
    models::WriteQwenCheckpoint(repository_.File("truncated"));
    // The weights file cut in half: its header promises more than it holds.
    const std::string weights =
        repository_.File("truncated") + "/diffusion_pytorch_model.safetensors";
    struct stat st;
    ASSERT_EQ(stat(weights.c_str(), &st), 0);
    ASSERT_EQ(truncate(weights.c_str(), st.st_size / 2), 0);
    StartApp(Limits());
  }

  void StartApp(const Limits& limits) {
    app_.reset();
    AppOptions options;
    options.address = "127.0.0.1:0";
    options.metrics_address = "";
    options.limits = limits;
    options.model_repository = repository_.path();
    auto app = App::Start(options, std::make_unique<testing::GatedBackend>());
    ASSERT_TRUE(app.ok()) << app.status();
    app_ = *std::move(app);
    ASSERT_TRUE(app_->conditioning().WaitUntilLoaded(absl::Seconds(30)));
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    channel_ =
        grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(app_->port()),
                                  grpc::InsecureChannelCredentials(), args);
    stub_ = v1::EmbeddingService::NewStub(channel_);
  }

  grpc::Status Condition(const v1::ConditionRequest& request,
                         v1::ConditionResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
    return stub_->Condition(&context, request, response);
  }

  // The status of a request that must fail.
  grpc::Status Refusal(const v1::ConditionRequest& request) {
    v1::ConditionResponse response;
    return Condition(request, &response);
  }

  // What the core answers for the same timesteps, on its own service over
  // the same repository.
  ConditionResponse Direct(const std::vector<float>& timesteps,
                           std::vector<int64_t> shape = {},
                           std::vector<std::string> outputs = {}) {
    if (direct_ == nullptr) {
      direct_ =
          std::make_unique<ConditioningService>(ConditioningService::Options());
      EXPECT_TRUE(direct_->OpenRepository(repository_.path()).ok());
      EXPECT_TRUE(direct_->WaitUntilLoaded(absl::Seconds(30)));
    }
    ConditionRequest request;
    request.model = "qwen";
    ConditionInput input;
    input.name = "timesteps";
    input.field = "inputs[0]";
    input.values = timesteps;
    input.shape =
        shape.empty()
            ? std::vector<int64_t>{static_cast<int64_t>(timesteps.size())}
            : shape;
    request.inputs = {input};
    request.outputs = outputs;
    auto served = direct_->Serve(request, nullptr);
    EXPECT_TRUE(served.ok()) << served.status();
    return served.ok() ? *std::move(served) : ConditionResponse();
  }

  static void ExpectSame(const v1::ConditionResponse& response,
                         const ConditionResponse& direct) {
    ASSERT_EQ(response.outputs_size(), static_cast<int>(direct.outputs.size()));
    for (int i = 0; i < response.outputs_size(); ++i) {
      const v1::NamedTensor& got = response.outputs(i);
      const ConditionOutput& want = direct.outputs[i];
      SCOPED_TRACE(want.name);
      EXPECT_EQ(got.name(), want.name);
      EXPECT_EQ(std::vector<int64_t>(got.tensor().shape().begin(),
                                     got.tensor().shape().end()),
                want.shape);
      EXPECT_EQ(got.tensor().dtype(),
                want.index ? v1::DTYPE_INT64 : v1::DTYPE_FP32);
      EXPECT_TRUE(got.tensor().data() == want.data);  // bit for bit
    }
  }

  models::TempDir repository_;
  std::unique_ptr<App> app_;
  std::unique_ptr<ConditioningService> direct_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::EmbeddingService::Stub> stub_;
};

TEST_F(ConditionServerTest, AnswersBitForBitAsTheCore) {
  const std::vector<float> t = {999.0f, 500.5f, 0.0f, 17.25f};
  v1::ConditionRequest request;
  request.set_request_id("step-1");
  request.set_model("qwen");
  *request.add_inputs() = Float32Input("timesteps", t);
  v1::ConditionResponse response;
  grpc::Status status = Condition(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.request_id(), "step-1");
  EXPECT_EQ(response.model(), "qwen");
  ExpectSame(response, Direct(t));
  EXPECT_EQ(response.outputs(0).name(), "temb");
  EXPECT_THAT(response.outputs(0).tensor().shape(), ElementsAre(4, 8));

  // A subset, answered in the model's order.
  request.add_outputs("norm_out");
  request.add_outputs("temb");
  ASSERT_TRUE(Condition(request, &response).ok());
  ExpectSame(response, Direct(t, {}, {"norm_out", "temb"}));

  // FP64 values that are float32 values, and BF16 ones, are the same input.
  const std::vector<double> wide(t.begin(), t.end());
  v1::Tensor* tensor = request.mutable_inputs(0)->mutable_tensor();
  tensor->set_dtype(v1::DTYPE_FP64);
  tensor->set_data(std::string(reinterpret_cast<const char*>(wide.data()),
                               wide.size() * sizeof(double)));
  ASSERT_TRUE(Condition(request, &response).ok());
  ExpectSame(response, Direct(t, {}, {"norm_out", "temb"}));
  const std::vector<float> bf16_values = {1000.0f, 500.0f, 0.0f, 17.25f};
  std::vector<uint16_t> bf16;
  for (float value : bf16_values) bf16.push_back(FloatToBFloat16(value));
  tensor->set_dtype(v1::DTYPE_BF16);
  tensor->set_data(
      std::string(reinterpret_cast<const char*>(bf16.data()), 2 * bf16.size()));
  ASSERT_TRUE(Condition(request, &response).ok());
  ExpectSame(response, Direct(bf16_values, {}, {"norm_out", "temb"}));
}

TEST_F(ConditionServerTest, PerTokenTimestepsGiveRowsAndAnInt64Index) {
  const std::vector<float> tokens = {999.0f, 0.0f, 0.0f, 999.0f, 999.0f, 0.0f};
  v1::ConditionRequest request;
  request.set_model("qwen");
  *request.add_inputs() = Float32Input("timesteps", tokens, {2, 3});
  request.add_outputs("norm_out");
  v1::ConditionResponse response;
  ASSERT_TRUE(Condition(request, &response).ok());
  ExpectSame(response, Direct(tokens, {2, 3}, {"norm_out"}));
  ASSERT_EQ(response.outputs_size(), 2);
  EXPECT_EQ(response.outputs(1).name(), "index");
  EXPECT_EQ(response.outputs(1).tensor().dtype(), v1::DTYPE_INT64);
  EXPECT_THAT(response.outputs(1).tensor().shape(), ElementsAre(2, 3));
}

TEST_F(ConditionServerTest, RefusalsCarryTheirCodeAndName) {
  v1::ConditionRequest request;
  request.set_model("broken");
  *request.add_inputs() = Float32Input("timesteps", {999.0f});
  grpc::Status status = Refusal(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(),
              AllOf(HasSubstr("broken"), HasSubstr("txt_mod")));

  request.set_model("truncated");
  status = Refusal(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(),
              HasSubstr("diffusion_pytorch_model.safetensors"));

  request.set_model("nope");
  status = Refusal(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(),
              AllOf(HasSubstr("nope"), HasSubstr("qwen")));

  request.set_model("qwen");
  request.mutable_inputs(0)->mutable_tensor()->set_dtype(v1::DTYPE_INT64);
  status = Refusal(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("inputs[0].tensor.dtype"));

  // 0.1 is no float32: refused, not rounded.
  const std::vector<double> inexact = {999.0, 0.1};
  v1::Tensor* tensor = request.mutable_inputs(0)->mutable_tensor();
  tensor->set_dtype(v1::DTYPE_FP64);
  tensor->clear_shape();
  tensor->set_data(
      std::string(reinterpret_cast<const char*>(inexact.data()), 16));
  status = Refusal(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              AllOf(HasSubstr("inputs[0].tensor.data[1]"),
                    HasSubstr("not exactly a float32")));

  tensor->set_dtype(v1::DTYPE_FP32);
  tensor->set_data("abcde");
  status = Refusal(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("inputs[0].tensor.data"));

  *request.mutable_inputs(0) = Float32Input("timesteps", {1.0f, 2.0f}, {3});
  status = Refusal(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("inputs[0]"));

  *request.mutable_inputs(0) = Float32Input("timesteps", {1.0f});
  *request.add_inputs() = Float32Input("guidance", {3.5f});
  status = Refusal(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              AllOf(HasSubstr("inputs[1]"), HasSubstr("not an input")));

  request.mutable_inputs()->RemoveLast();
  request.add_outputs("t_emb");
  status = Refusal(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("outputs[0]"));

  request.clear_outputs();
  request.set_request_id(std::string(2000, 'x'));
  status = Refusal(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("request_id"));
}

TEST_F(ConditionServerTest, StreamAnswersInOrderWithPerRequestErrors) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
  auto stream = stub_->ConditionStream(&context);
  constexpr int kRequests = 12;
  constexpr int kBad = 5;
  for (int i = 0; i < kRequests; ++i) {
    v1::ConditionRequest request;
    request.set_request_id("r" + std::to_string(i));
    request.set_model(i == kBad ? "broken" : "qwen");
    *request.add_inputs() =
        Float32Input("timesteps", {static_cast<float>(1000 - 50 * i)});
    ASSERT_TRUE(stream->Write(request));
  }
  ASSERT_TRUE(stream->WritesDone());
  v1::ConditionStreamResponse answer;
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(stream->Read(&answer)) << i;
    ASSERT_EQ(answer.request_id(), "r" + std::to_string(i));
    if (i == kBad) {
      ASSERT_TRUE(answer.has_error());
      EXPECT_EQ(answer.error().code(), grpc::StatusCode::FAILED_PRECONDITION);
      EXPECT_THAT(answer.error().message(), HasSubstr("broken"));
      continue;
    }
    ASSERT_TRUE(answer.has_response()) << answer.error().message();
    EXPECT_EQ(answer.response().request_id(), "r" + std::to_string(i));
    ExpectSame(answer.response(), Direct({static_cast<float>(1000 - 50 * i)}));
  }
  EXPECT_FALSE(stream->Read(&answer));
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(ConditionServerTest, ServerInfoListsTheModelsAndTheCache) {
  v1::ConditionRequest request;
  request.set_model("qwen");
  *request.add_inputs() = Float32Input("timesteps", {999.0f, 999.0f});
  v1::ConditionResponse response;
  ASSERT_TRUE(Condition(request, &response).ok());

  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(
      stub_->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  ASSERT_EQ(info.conditioning_models_size(), 3);
  const v1::ConditioningModel& broken = info.conditioning_models(0);
  EXPECT_EQ(broken.name(), "broken");
  EXPECT_EQ(broken.state(), v1::MODEL_STATE_FAILED);
  EXPECT_THAT(broken.message(), HasSubstr("txt_mod"));
  const v1::ConditioningModel& qwen = info.conditioning_models(1);
  EXPECT_EQ(qwen.name(), "qwen");
  EXPECT_EQ(qwen.state(), v1::MODEL_STATE_READY);
  EXPECT_EQ(qwen.family(), "qwen-image");
  EXPECT_EQ(qwen.dtype(), v1::DTYPE_FP32);
  EXPECT_EQ(qwen.width(), 8);
  EXPECT_GT(qwen.weight_bytes(), 0);
  ASSERT_EQ(qwen.inputs_size(), 2);
  EXPECT_EQ(qwen.inputs(0).name(), "timesteps");
  EXPECT_EQ(qwen.inputs(1).name(), "timestep");
  EXPECT_EQ(qwen.inputs(1).stands_for(), "t_model");
  ASSERT_GT(qwen.outputs_size(), 0);
  EXPECT_EQ(qwen.outputs(0).name(), "temb");
  EXPECT_THAT(qwen.outputs(0).row_shape(), ElementsAre(8));
  EXPECT_EQ(qwen.outputs(0).row_bytes(), 32);
  EXPECT_EQ(info.conditioning_models(2).state(), v1::MODEL_STATE_FAILED);
  EXPECT_GT(info.limits().max_request_bytes(), 0);
  // The repeated timestep was one row computed, then found in the cache.
  EXPECT_GT(info.conditioning_cache().capacity_bytes(), 0);
  EXPECT_GE(
      info.conditioning_cache().hits() + info.conditioning_cache().misses(), 1);
}

TEST_F(ConditionServerTest, ARequestAboveTheReceiveLimitIsRefused) {
  Limits limits;
  limits.max_batch = 16;
  StartApp(limits);
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(
      stub_->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  const int64_t max_request = info.limits().max_request_bytes();
  ASSERT_GT(max_request, 0);
  v1::ConditionRequest request;
  request.set_model("qwen");
  *request.add_inputs() =
      Float32Input("timesteps", std::vector<float>(max_request / 4 + 16, 1.0f));
  grpc::Status status = Refusal(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  // Within the limit, max_batch speaks.
  *request.mutable_inputs(0) =
      Float32Input("timesteps", std::vector<float>(17, 1.0f));
  status = Refusal(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("max_batch=16"));
}

}  // namespace
}  // namespace temb
