// The native temb.v1 frontend end to end inside one process: App (the same
// assembly temb-server runs) on 127.0.0.1:0, the real CPU backend behind a
// gate that can hold a computation in flight, and the generated stubs.
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "temb/app/app.h"
#include "temb/core/embed_service.h"
#include "temb/core/presets.h"
#include "temb/kernels/registry.h"
#include "temb/metrics/prometheus_metrics.h"
#include "temb/testing/cpu_reference.h"
#include "temb/testing/gated_backend.h"
#include "temb/testing/http_get.h"
#include "temb/v1/temb.grpc.pb.h"
#include "temb/v1_convert/preset_catalog.h"

namespace temb {
namespace {

using ::temb::testing::CpuBackendBytes;
using ::temb::testing::GatedBackend;
using ::temb::testing::HttpGet;
using ::testing::HasSubstr;
using HealthStatus = grpc::health::v1::HealthCheckResponse;

// Safety net for blocking calls; no assertion depends on timing.
constexpr auto kCallTimeout = std::chrono::seconds(30);

class NativeServerTest : public ::testing::Test {
 protected:
  void SetUp() override { StartApp(Limits()); }

  // Metrics only where a test reads them: stopping the HTTP exposer takes
  // about a second.
  void StartApp(const Limits& limits, bool metrics = false) {
    app_.reset();
    AppOptions options;
    options.address = "127.0.0.1:0";
    options.metrics_address = metrics ? "127.0.0.1:0" : "";
    options.limits = limits;
    options.drain_grace = absl::Seconds(20);
    auto backend = std::make_unique<GatedBackend>();
    backend_ = backend.get();
    auto app = App::Start(options, std::move(backend));
    ASSERT_TRUE(app.ok()) << app.status();
    app_ = *std::move(app);
    ASSERT_GT(app_->port(), 0);
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    channel_ =
        grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(app_->port()),
                                  grpc::InsecureChannelCredentials(), args);
    stub_ = v1::EmbeddingService::NewStub(channel_);
  }

  grpc::Status Embed(const v1::EmbedRequest& request,
                     v1::EmbedResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
    return stub_->Embed(&context, request, response);
  }

  grpc::StatusCode EmbedCode(const v1::EmbedRequest& request,
                             std::string* message = nullptr) {
    v1::EmbedResponse response;
    grpc::Status status = Embed(request, &response);
    if (message != nullptr) *message = status.error_message();
    return status.error_code();
  }

  HealthStatus::ServingStatus Health(const std::string& service) {
    auto health = grpc::health::v1::Health::NewStub(channel_);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    HealthStatus response;
    grpc::Status status = health->Check(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.status();
  }

  static v1::EmbedRequest PresetRequest(const std::string& preset,
                                        std::vector<float> timesteps) {
    v1::EmbedRequest request;
    request.set_preset(preset);
    for (float t : timesteps) request.add_timesteps(t);
    return request;
  }

  std::unique_ptr<App> app_;
  GatedBackend* backend_ = nullptr;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::EmbeddingService::Stub> stub_;
};

TEST_F(NativeServerTest, EmbedEqualsTheCpuBackendBitForBit) {
  const std::vector<float> ts = {0.0f, 1.0f, 10.5f, 999.0f, -3.25f, 54321.5f};
  const std::pair<v1::DType, DType> dtypes[] = {
      {v1::DTYPE_FP32, DType::kFloat32},
      {v1::DTYPE_FP16, DType::kFloat16},
      {v1::DTYPE_BF16, DType::kBFloat16}};
  for (const char* preset : {"sd15", "ddpm", "flux", "wan", "transformer"}) {
    for (const auto& [proto_dtype, dtype] : dtypes) {
      SCOPED_TRACE(std::string(preset) + " " + std::string(DTypeName(dtype)));
      v1::EmbedRequest request = PresetRequest(preset, ts);
      request.set_request_id("id-42");
      request.set_dtype(proto_dtype);
      v1::EmbedResponse response;
      grpc::Status status = Embed(request, &response);
      ASSERT_TRUE(status.ok()) << status.error_message();

      EmbeddingSpec spec = BuiltInPresetCatalog().Find(preset)->spec;
      spec.dtype = dtype;
      EXPECT_EQ(response.request_id(), "id-42");
      EXPECT_EQ(response.backend(), "cpu");
      EXPECT_EQ(response.embedding().dtype(), proto_dtype);
      EXPECT_THAT(
          response.embedding().shape(),
          ::testing::ElementsAre(static_cast<int64_t>(ts.size()), spec.dim));
      EXPECT_TRUE(response.embedding().data() == CpuBackendBytes(spec, ts));
    }
  }
}

TEST_F(NativeServerTest, ExplicitSpecAndIntegerTimesteps) {
  v1::EmbedRequest request;
  request.mutable_spec()->set_dim(7);
  request.mutable_spec()->set_flip_sin_to_cos(false);
  request.mutable_spec()->set_downscale_freq_shift(1);
  for (int64_t t : {0, 1, 999, -5, 16777216}) request.add_integer_timesteps(t);
  v1::EmbedResponse response;
  ASSERT_TRUE(Embed(request, &response).ok());
  EmbeddingSpec spec;
  spec.dim = 7;
  spec.flip_sin_to_cos = false;
  spec.downscale_freq_shift = 1;
  EXPECT_TRUE(response.embedding().data() ==
              CpuBackendBytes(spec, {0.0f, 1.0f, 999.0f, -5.0f, 16777216.0f}));
}

TEST_F(NativeServerTest, BadRequestsGetTheirCodes) {
  std::string message;
  EXPECT_EQ(EmbedCode(PresetRequest("sd99", {1}), &message),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(message, HasSubstr("sd99"));

  v1::EmbedRequest no_convention;
  no_convention.mutable_spec()->set_dim(8);
  no_convention.add_timesteps(1);
  EXPECT_EQ(EmbedCode(no_convention, &message),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(message, HasSubstr("flip_sin_to_cos"));

  v1::EmbedRequest conflicting = PresetRequest("sdxl", {1});
  conflicting.mutable_spec()->set_time_factor(1000);
  EXPECT_EQ(EmbedCode(conflicting, &message),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(message, HasSubstr("time_factor"));

  EXPECT_EQ(EmbedCode(PresetRequest("sd15", {1, NAN}), &message),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(message, HasSubstr("timesteps[1]"));

  v1::EmbedRequest both = PresetRequest("sd15", {1});
  both.add_integer_timesteps(1);
  EXPECT_EQ(EmbedCode(both), grpc::StatusCode::INVALID_ARGUMENT);

  v1::EmbedRequest bad_enum = PresetRequest("sd15", {1});
  bad_enum.set_dtype(static_cast<v1::DType>(99));
  EXPECT_EQ(EmbedCode(bad_enum, &message), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(message, HasSubstr("dtype"));

  v1::EmbedRequest too_wide = PresetRequest("transformer", {1});
  too_wide.mutable_spec()->set_dim(1 << 20);
  EXPECT_EQ(EmbedCode(too_wide), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(backend_->calls(), 0);  // none of these reached the backend
}

TEST_F(NativeServerTest, ExpiredDeadlineIsNotComputed) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() -
                       std::chrono::seconds(1));
  v1::EmbedResponse response;
  grpc::Status status =
      stub_->Embed(&context, PresetRequest("sd15", {1}), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(backend_->calls(), 0);
}

TEST_F(NativeServerTest, ServerInfoDescribesTheServer) {
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(
      stub_->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  EXPECT_FALSE(info.version().empty());
  EXPECT_EQ(info.backend(), "cpu");
  EXPECT_EQ(info.device(), app_->service().backend().device());
  EXPECT_EQ(info.limits().max_dim(), Limits().max_dim);
  EXPECT_EQ(info.limits().max_batch(), Limits().max_batch);
  EXPECT_EQ(info.limits().max_output_bytes(), Limits().max_output_bytes);
  EXPECT_EQ(info.limits().max_message_bytes(), app_->max_message_bytes());
  EXPECT_GT(info.limits().max_message_bytes(), Limits().max_output_bytes);
  const auto& builtin = BuiltInPresetCatalog().presets();
  ASSERT_EQ(info.presets_size(), static_cast<int>(builtin.size()));
  for (int i = 0; i < info.presets_size(); ++i) {
    const v1::Preset& p = info.presets(i);
    EXPECT_EQ(p.name(), builtin[i].name);
    EXPECT_EQ(p.description(), builtin[i].description);
    EXPECT_EQ(p.dim_overridable(), builtin[i].dim_overridable);
    EXPECT_EQ(p.spec().has_dim(), builtin[i].spec.dim > 0);
    EXPECT_EQ(p.spec().flip_sin_to_cos(), builtin[i].spec.flip_sin_to_cos);
    EXPECT_EQ(p.spec().time_factor(), builtin[i].spec.time_factor);
  }
}

TEST_F(NativeServerTest, StreamAnswersInOrderAndSurvivesBadRequests) {
  constexpr int kRequests = 200;
  constexpr int kBad = 57;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
  auto stream = stub_->EmbedStream(&context);
  std::vector<v1::EmbedRequest> requests;
  for (int i = 0; i < kRequests; ++i) {
    v1::EmbedRequest request = PresetRequest(i == kBad ? "nope" : "ldm",
                                             {static_cast<float>(i), 0.5f});
    request.mutable_spec()->set_dim(4 + 2 * (i % 5));
    request.set_request_id("r" + std::to_string(i));
    requests.push_back(request);
    ASSERT_TRUE(stream->Write(request));
  }
  ASSERT_TRUE(stream->WritesDone());
  v1::EmbedStreamResponse answer;
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(stream->Read(&answer)) << i;
    ASSERT_EQ(answer.request_id(), "r" + std::to_string(i));
    if (i == kBad) {
      ASSERT_TRUE(answer.has_error());
      EXPECT_EQ(answer.error().code(), grpc::StatusCode::NOT_FOUND);
      EXPECT_THAT(answer.error().message(), HasSubstr("nope"));
      continue;
    }
    ASSERT_TRUE(answer.has_response()) << answer.error().message();
    v1::EmbedResponse unary;
    ASSERT_TRUE(Embed(requests[i], &unary).ok());
    EXPECT_TRUE(answer.response().embedding().data() ==
                unary.embedding().data());
    EXPECT_EQ(answer.response().embedding().shape(1), 4 + 2 * (i % 5));
  }
  EXPECT_FALSE(stream->Read(&answer));
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(NativeServerTest, StreamCancelledByTheClientLeavesTheServerHealthy) {
  {
    grpc::ClientContext context;
    auto stream = stub_->EmbedStream(&context);
    ASSERT_TRUE(stream->Write(PresetRequest("sd15", {1})));
    v1::EmbedStreamResponse answer;
    ASSERT_TRUE(stream->Read(&answer));
    EXPECT_TRUE(answer.has_response());
    context.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  {
    grpc::ClientContext context;  // half-close without a request
    auto stream = stub_->EmbedStream(&context);
    ASSERT_TRUE(stream->WritesDone());
    EXPECT_TRUE(stream->Finish().ok());
  }
  v1::EmbedResponse response;
  EXPECT_TRUE(Embed(PresetRequest("sd15", {1}), &response).ok());
}

TEST_F(NativeServerTest, MessageAndBatchLimits) {
  Limits limits;
  limits.max_batch = 1000;
  limits.max_output_bytes = 64 << 10;
  StartApp(limits);
  const int max_message = app_->max_message_bytes();
  EXPECT_GE(max_message, 64 << 10);

  // Over the gRPC message limit: refused before any parsing.
  std::vector<float> many(static_cast<size_t>(max_message / 4 + 1), 1.0f);
  std::string message;
  EXPECT_EQ(EmbedCode(PresetRequest("sd15", many), &message),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  // Within the message limit but over max_batch.
  EXPECT_EQ(EmbedCode(PresetRequest("sd15", std::vector<float>(1001, 1.0f)),
                      &message),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(message, HasSubstr("1000"));
  // Over max_output_bytes: 100 rows * 320 * 4 bytes = 128000 > 65536.
  EXPECT_EQ(
      EmbedCode(PresetRequest("sd15", std::vector<float>(100, 1.0f)), &message),
      grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(message, HasSubstr("output size"));
  // The largest allowed request and response both fit the message limit.
  v1::EmbedRequest largest = PresetRequest("ldm", {});
  largest.mutable_spec()->set_dim(16);
  for (int i = 0; i < 1000; ++i) largest.add_integer_timesteps(-1 - i);
  largest.set_dtype(v1::DTYPE_FP32);
  EXPECT_EQ(EmbedCode(largest), grpc::StatusCode::OK);
  v1::EmbedRequest widest = PresetRequest("ldm", std::vector<float>(16, 1.0f));
  widest.mutable_spec()->set_dim(1024);  // 16 * 1024 * 4 = 64 KiB exactly
  EXPECT_EQ(EmbedCode(widest), grpc::StatusCode::OK);
  EXPECT_EQ(backend_->calls(), 2);
}

TEST_F(NativeServerTest, BusyPortIsAnError) {
  AppOptions options;
  options.address = "127.0.0.1:" + std::to_string(app_->port());
  options.metrics_address = "";
  options.backend = BackendChoice::kCpu;
  auto second = App::Start(options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(NativeServerTest, HealthServing) {
  EXPECT_EQ(Health(""), HealthStatus::SERVING);
  EXPECT_EQ(Health("temb.v1.EmbeddingService"), HealthStatus::SERVING);
}

TEST_F(NativeServerTest, ShutdownDrainsInFlightCallsAndTurnsHealthOff) {
  // Hold one computation inside the backend.
  backend_->Close();
  v1::EmbedResponse in_flight_response;
  grpc::Status in_flight_status;
  std::thread in_flight([&] {
    in_flight_status =
        Embed(PresetRequest("sd15", {1, 2, 3}), &in_flight_response);
  });
  backend_->WaitForCalls(1);

  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext watch_context;
  grpc::health::v1::HealthCheckRequest watch_request;
  watch_request.set_service("temb.v1.EmbeddingService");
  auto watch = health->Watch(&watch_context, watch_request);
  HealthStatus update;
  ASSERT_TRUE(watch->Read(&update));
  EXPECT_EQ(update.status(), HealthStatus::SERVING);

  std::thread shutdown([&] { app_->Shutdown(); });
  ASSERT_TRUE(watch->Read(&update));
  EXPECT_EQ(update.status(), HealthStatus::NOT_SERVING);
  watch_context.TryCancel();
  watch->Finish();

  // New calls are refused by the admission gate ("server is draining")
  // while the in-flight one drains; gRPC itself keeps listening until the
  // drain is over, so no call races with its shutdown.
  EXPECT_EQ(EmbedCode(PresetRequest("sd15", {1})),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(backend_->calls(), 1);

  backend_->Open();
  in_flight.join();
  shutdown.join();
  ASSERT_TRUE(in_flight_status.ok()) << in_flight_status.error_message();
  EmbeddingSpec spec = BuiltInPresetCatalog().Find("sd15")->spec;
  EXPECT_TRUE(in_flight_response.embedding().data() ==
              CpuBackendBytes(spec, {1.0f, 2.0f, 3.0f}));
}

TEST_F(NativeServerTest, MetricsCountRequests) {
  StartApp(Limits(), /*metrics=*/true);
  v1::EmbedResponse response;
  ASSERT_TRUE(Embed(PresetRequest("sd15", {1, 2}), &response).ok());
  EXPECT_EQ(EmbedCode(PresetRequest("nope", {1})), grpc::StatusCode::NOT_FOUND);
  ASSERT_GT(app_->metrics_port(), 0);
  const std::string scrape = HttpGet(app_->metrics_port(), "/metrics");
  EXPECT_THAT(scrape, HasSubstr("200 OK"));
  EXPECT_THAT(scrape,
              HasSubstr("temb_requests_total{code=\"OK\",method=\"Embed\"} 1"));
  EXPECT_THAT(scrape, HasSubstr("temb_requests_total{code=\"NOT_FOUND\","
                                "method=\"Embed\"} 1"));
  EXPECT_THAT(scrape, HasSubstr("temb_output_bytes_total 2560"));
  EXPECT_THAT(scrape, HasSubstr("temb_batch_size_count 1"));
  EXPECT_THAT(scrape, HasSubstr("temb_inflight_requests 0"));
  EXPECT_THAT(scrape, HasSubstr("temb_request_latency_seconds_count{method="
                                "\"Embed\"} 2"));
  EXPECT_THAT(scrape, HasSubstr("temb_backend_info{backend=\"cpu\""));
}

// The CPU backend, lending its own memory for outputs of 4 KiB and more
// (as the CUDA backend lends page-locked memory), and counting what it lent
// and what came back.
class LendingBackend final : public Backend {
 public:
  static constexpr size_t kMinLent = 4096;

  LendingBackend() : inner_(*CreateBackend(BackendChoice::kCpu)) {}
  BackendKind kind() const override { return inner_->kind(); }
  std::string device() const override { return inner_->device(); }

  std::unique_ptr<HostBuffer> AllocateOutput(size_t bytes) override {
    if (bytes < kMinLent) return nullptr;
    auto buffer = std::make_unique<Lent>(bytes, counts_);
    std::lock_guard<std::mutex> lock(counts_->mutex);
    counts_->lent_addresses.push_back(buffer->bytes().data());
    return buffer;
  }

  absl::Status Compute(const EmbeddingSpec& spec,
                       absl::Span<const float> timesteps,
                       absl::Span<uint8_t> out) override {
    {
      std::lock_guard<std::mutex> lock(counts_->mutex);
      computed_into_.push_back(out.data());
    }
    return inner_->Compute(spec, timesteps, out);
  }

  std::vector<const uint8_t*> lent() {
    std::lock_guard<std::mutex> lock(counts_->mutex);
    return counts_->lent_addresses;
  }
  std::vector<const uint8_t*> computed_into() {
    std::lock_guard<std::mutex> lock(counts_->mutex);
    return computed_into_;
  }
  // Waits (30 s at most, a safety net) until `n` buffers came back.
  bool WaitForReturned(int n) {
    std::unique_lock<std::mutex> lock(counts_->mutex);
    return counts_->changed.wait_for(lock, kCallTimeout,
                                     [&] { return counts_->returned >= n; });
  }

 private:
  struct Counts {
    std::mutex mutex;
    std::condition_variable changed;
    std::vector<const uint8_t*> lent_addresses;
    int returned = 0;
  };
  class Lent final : public HostBuffer {
   public:
    Lent(size_t bytes, std::shared_ptr<Counts> counts)
        : memory_(bytes, 0xA5), counts_(std::move(counts)) {}
    ~Lent() override {
      std::lock_guard<std::mutex> lock(counts_->mutex);
      ++counts_->returned;
      counts_->changed.notify_all();
    }
    absl::Span<uint8_t> bytes() override { return absl::MakeSpan(memory_); }

   private:
    std::vector<uint8_t> memory_;
    std::shared_ptr<Counts>
        counts_;  // a buffer may come back after the backend is gone
  };

  std::unique_ptr<Backend> inner_;
  std::shared_ptr<Counts> counts_ = std::make_shared<Counts>();
  std::vector<const uint8_t*> computed_into_;
};

TEST(NativeServerLentOutputTest, LentMemoryIsSentAndGivenBack) {
  AppOptions options;
  options.address = "127.0.0.1:0";
  options.metrics_address = "";
  auto owned = std::make_unique<LendingBackend>();
  LendingBackend* backend = owned.get();
  auto app = App::Start(options, std::move(owned));
  ASSERT_TRUE(app.ok()) << app.status();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto stub = v1::EmbeddingService::NewStub(
      grpc::CreateCustomChannel("127.0.0.1:" + std::to_string((*app)->port()),
                                grpc::InsecureChannelCredentials(), args));

  EmbeddingSpec spec = BuiltInPresetCatalog().Find("sdxl")->spec;
  for (int rows :
       {1, 64, 1000}) {  // 1.25 KiB: not lent; 80 KiB and 1.2 MiB: lent
    SCOPED_TRACE(rows);
    std::vector<float> ts;
    for (int n = 0; n < rows; ++n)
      ts.push_back(static_cast<float>((n * 37) % 1000));
    v1::EmbedRequest request;
    request.set_preset("sdxl");
    for (float t : ts) request.add_timesteps(t);
    v1::EmbedResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
    ASSERT_TRUE(stub->Embed(&context, request, &response).ok());
    EXPECT_TRUE(response.embedding().data() == CpuBackendBytes(spec, ts));
  }
  // The two large outputs were computed into the memory lent for them...
  const std::vector<const uint8_t*> lent = backend->lent();
  ASSERT_EQ(lent.size(), 2u);
  const std::vector<const uint8_t*> computed = backend->computed_into();
  ASSERT_EQ(computed.size(), 3u);
  EXPECT_EQ(computed[1], lent[0]);
  EXPECT_EQ(computed[2], lent[1]);
  // ...and each came back once gRPC had sent it.
  EXPECT_TRUE(backend->WaitForReturned(2));
  (*app)->Shutdown();
}

}  // namespace
}  // namespace temb
