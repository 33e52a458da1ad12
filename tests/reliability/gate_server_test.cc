// The real server assembly (temb::app) on 127.0.0.1:0: every temb.v1 and
// inference method passes the gate; a failing backend leads to the
// configured policy, never to a crash.
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "inference/grpc_service.grpc.pb.h"
#include "temb/app/app.h"
#include "temb/kernels/registry.h"
#include "temb/metrics/prometheus_metrics.h"
#include "temb/v1/temb.grpc.pb.h"
#include "temb/v1_convert/preset_catalog.h"

namespace temb {
namespace {

using ::grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

constexpr char kToken[] = "s3cret-token";

AppOptions LocalOptions() {
  AppOptions options;
  options.address = "127.0.0.1:0";
  options.metrics_address = "";
  options.drain_grace = absl::Seconds(5);
  return options;
}

std::shared_ptr<grpc::Channel> Connect(const App& app) {
  return grpc::CreateChannel(absl::StrCat("127.0.0.1:", app.port()),
                             grpc::InsecureChannelCredentials());
}

// Calls `method` ("/pkg.Service/Method") with one empty message and
// half-close, whatever its streaming kind, reads at most one answer and
// returns the final status.
grpc::Status CallEmpty(grpc::Channel* channel, const std::string& method,
                       const std::string& authorization) {
  grpc::GenericStub stub(channel->shared_from_this());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  if (!authorization.empty()) {
    context.AddMetadata("authorization", authorization);
  }
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&context, method, &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  grpc::Slice empty("");
  grpc::ByteBuffer message(&empty, 1);
  call->Write(message, reinterpret_cast<void*>(2));
  cq.Next(&tag, &ok);
  call->WritesDone(reinterpret_cast<void*>(3));
  cq.Next(&tag, &ok);
  // The status comes only once every answer sent has been read.
  grpc::ByteBuffer answer;
  call->Read(&answer, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(4));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

std::vector<std::string> GatedMethods() {
  std::vector<std::string> methods;
  for (const char* name :
       {v1::EmbeddingService::service_full_name(),
        inference::GRPCInferenceService::service_full_name()}) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            name);
    EXPECT_NE(service, nullptr) << name;
    if (service == nullptr) continue;
    for (int i = 0; i < service->method_count(); ++i) {
      methods.push_back(absl::StrCat("/", service->full_name(), "/",
                                     service->method(i)->name()));
    }
  }
  return methods;
}

TEST(GateServerTest, EveryMethodNeedsTheTokenButHealthDoesNot) {
  const std::string path = ::testing::TempDir() + "/gate_tokens";
  std::ofstream(path) << kToken << "\nsecond-token\n";
  AppOptions options = LocalOptions();
  options.auth_token_file = path;
  auto app = App::Start(options);
  ASSERT_TRUE(app.ok()) << app.status();
  auto channel = Connect(**app);
  const std::vector<std::string> methods = GatedMethods();
  ASSERT_GE(methods.size(), 11u);
  for (const std::string& method : methods) {
    for (const std::string& header :
         {std::string(), std::string("Bearer wrong"),
          std::string("Bearer ") + kToken + "x"}) {
      const grpc::Status status = CallEmpty(channel.get(), method, header);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << method << " with '" << header << "': " << status.error_message();
    }
    // With the token the gate lets it through (the empty request may still
    // be invalid, but it is not an authentication failure).
    const grpc::Status with_token =
        CallEmpty(channel.get(), method, std::string("Bearer ") + kToken);
    EXPECT_NE(with_token.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << method;
  }
  // Probes stay open.
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckRequest request;
  HealthCheckResponse response;
  ASSERT_TRUE(health->Check(&context, request, &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
}

// A device that works for `good_calls` computations and then fails.
class FailingBackend final : public Backend {
 public:
  explicit FailingBackend(int good_calls) : good_calls_(good_calls) {}
  BackendKind kind() const override { return BackendKind::kCuda; }
  std::string device() const override { return "failing test device"; }
  absl::Status Compute(const EmbeddingSpec& spec,
                       absl::Span<const float> timesteps,
                       absl::Span<uint8_t> out) override {
    if (good_calls_.fetch_sub(1) > 0)
      return cpu_->Compute(spec, timesteps, out);
    return absl::InternalError("injected: an illegal memory access");
  }

 private:
  std::atomic<int> good_calls_;
  std::unique_ptr<Backend> cpu_ = *CreateBackend(BackendChoice::kCpu);
};

v1::EmbedRequest SmallRequest() {
  v1::EmbedRequest request;
  request.set_preset("sdxl");
  for (float t : {0.0f, 1.0f, 999.0f}) request.add_timesteps(t);
  return request;
}

HealthCheckResponse::ServingStatus Health(grpc::Channel* channel,
                                          const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(channel->shared_from_this());
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  EXPECT_TRUE(stub->Check(&context, request, &response).ok());
  return response.status();
}

TEST(GateServerTest, BackendFailureStopsServingWhenSoConfigured) {
  AppOptions options = LocalOptions();
  options.metrics_address = "127.0.0.1:0";
  options.on_backend_failure = BackendFailurePolicy::kNotServing;
  auto app = App::Start(options, std::make_unique<FailingBackend>(1));
  ASSERT_TRUE(app.ok()) << app.status();
  auto channel = Connect(**app);
  auto stub = v1::EmbeddingService::NewStub(channel);
  auto kserve = inference::GRPCInferenceService::NewStub(channel);
  const auto embed = [&] {
    grpc::ClientContext context;
    v1::EmbedResponse response;
    return stub->Embed(&context, SmallRequest(), &response);
  };
  EXPECT_TRUE(embed().ok());
  const grpc::Status failed = embed();
  EXPECT_EQ(failed.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(failed.error_message(), HasSubstr("illegal memory access"));
  // From now on: refused before the backend, and health says so.
  const grpc::Status later = embed();
  EXPECT_EQ(later.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(later.error_message(), HasSubstr("stopped serving"));
  EXPECT_EQ(Health(channel.get(), ""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Health(channel.get(), "temb.v1.EmbeddingService"),
            HealthCheckResponse::NOT_SERVING);
  grpc::ClientContext ready_context;
  inference::ServerReadyResponse ready;
  ASSERT_TRUE(kserve->ServerReady(&ready_context, {}, &ready).ok());
  EXPECT_FALSE(ready.ready());
  const std::string metrics = (*app)->metrics()->TextExposition();
  EXPECT_THAT(metrics, HasSubstr("temb_backend_failures_total{action=\"not_"
                                 "serving\",backend=\"cuda\"} 1"));
  EXPECT_THAT(metrics,
              HasSubstr("temb_serving_state{state=\"backend_failed\"} 1"));
  EXPECT_THAT(
      metrics,
      HasSubstr("temb_rejected_requests_total{reason=\"backend_failed\"} 1"));
}

TEST(GateServerTest, BackendFailureFallsBackToCpuWhenSoConfigured) {
  AppOptions options = LocalOptions();
  options.on_backend_failure = BackendFailurePolicy::kFallbackCpu;
  auto app = App::Start(options, std::make_unique<FailingBackend>(0));
  ASSERT_TRUE(app.ok()) << app.status();
  auto channel = Connect(**app);
  auto stub = v1::EmbeddingService::NewStub(channel);
  auto cpu = *CreateBackend(BackendChoice::kCpu);
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext context;
    v1::EmbedResponse response;
    const grpc::Status status =
        stub->Embed(&context, SmallRequest(), &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.backend(), "cpu");
    // The same numbers the CPU backend computes directly.
    SpecRequest sdxl;
    sdxl.preset = "sdxl";
    auto spec = ResolveSpec(sdxl, BuiltInPresetCatalog(), Limits());
    ASSERT_TRUE(spec.ok());
    std::string expected(OutputBytes(*spec, 3), '\0');
    ASSERT_TRUE(
        cpu->Compute(*spec, std::vector<float>{0.0f, 1.0f, 999.0f},
                     absl::MakeSpan(reinterpret_cast<uint8_t*>(expected.data()),
                                    expected.size()))
            .ok());
    EXPECT_EQ(response.embedding().data(), expected);
  }
  EXPECT_EQ(Health(channel.get(), ""), HealthCheckResponse::SERVING);
  EXPECT_EQ((*app)->service().backend().kind(), BackendKind::kCpu);
}

TEST(GateServerTest, QueuedBytesLimitNamesTheLimit) {
  AppOptions options = LocalOptions();
  options.admission.max_queued_bytes = 64 << 10;
  auto app = App::Start(options);
  ASSERT_TRUE(app.ok()) << app.status();
  auto stub = v1::EmbeddingService::NewStub(Connect(**app));
  v1::EmbedRequest request = SmallRequest();
  for (int i = 0; i < 100; ++i) request.add_timesteps(i);  // 103 x 320 fp32
  grpc::ClientContext context;
  v1::EmbedResponse response;
  const grpc::Status status = stub->Embed(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("max_queued_bytes (65536)"));
  grpc::ClientContext small_context;
  EXPECT_TRUE(stub->Embed(&small_context, SmallRequest(), &response).ok());
  // Released once gRPC is done with the call, just after the client has
  // the answer.
  for (int i = 0; i < 1000 && (*app)->admission().held_bytes() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ((*app)->admission().held_bytes(), 0);
  EXPECT_EQ((*app)->admission().inflight(), 0);
}

}  // namespace
}  // namespace temb
