// How gRPC 1.51 hands a raw unary handler a call its client reset before the
// message arrived, and what CheckRequestArrived makes of it: a tiny raw
// Embed service on 127.0.0.1:0 records what each call's check said.
#include "temb/grpc/call_gate.h"

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "temb/testing/loopback_server.h"
#include "temb/v1/temb.grpc.pb.h"

namespace temb {
namespace {

constexpr char kEmbed[] = "/temb.v1.EmbeddingService/Embed";

class RecordingService final
    : public v1::EmbeddingService::WithRawCallbackMethod_Embed<
          v1::EmbeddingService::CallbackService> {
 public:
  grpc::ServerUnaryReactor* Embed(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override {
    const absl::Status status = CheckRequestArrived(*request);
    grpc::Slice empty("");
    *response = grpc::ByteBuffer(&empty, 1);  // an OK call sends a message
    {
      std::lock_guard<std::mutex> lock(mu_);
      codes_.push_back(status.code());
    }
    return FinishUnary(context, status);
  }

  std::vector<absl::StatusCode> codes() {
    std::lock_guard<std::mutex> lock(mu_);
    return codes_;
  }

 private:
  std::mutex mu_;
  std::vector<absl::StatusCode> codes_;
};

class CallGateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = testing::ServeOnLoopback(&service_, &port_);
    ASSERT_NE(server_, nullptr);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_),
                                   grpc::InsecureChannelCredentials());
  }
  void TearDown() override { server_->Shutdown(); }

  static constexpr std::chrono::milliseconds kResetAfter{50};

  // Calls Embed with `message`, or, with none, starts the call (its headers
  // go out) and cancels it `reset_after` later, before any message is
  // written.
  void Call(const std::string* message,
            std::chrono::milliseconds reset_after = kResetAfter) {
    grpc::GenericStub stub(channel_);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    grpc::CompletionQueue cq;
    auto call = stub.PrepareCall(&context, kEmbed, &cq);
    void* tag;
    bool ok;
    call->StartCall(reinterpret_cast<void*>(1));
    cq.Next(&tag, &ok);
    if (message == nullptr) {
      // Let the headers reach the server first, as a reset does.
      std::this_thread::sleep_for(reset_after);
      context.TryCancel();
    } else {
      grpc::Slice slice(*message);
      grpc::ByteBuffer buffer(&slice, 1);
      call->Write(buffer, reinterpret_cast<void*>(2));
      cq.Next(&tag, &ok);
      call->WritesDone(reinterpret_cast<void*>(4));
      cq.Next(&tag, &ok);
      grpc::ByteBuffer answer;
      call->Read(&answer, reinterpret_cast<void*>(5));
      cq.Next(&tag, &ok);
    }
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
  }

  std::vector<absl::StatusCode> WaitForCalls(size_t count) {
    for (int i = 0; i < 500 && service_.codes().size() < count; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return service_.codes();
  }

  RecordingService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(CallGateTest, ACallResetBeforeItsMessageIsCancelledNotInvalid) {
  // The handler runs only when the headers reached the server before the
  // reset; a loaded machine can lose that race, so the reset is tried
  // again, later each time.
  std::vector<absl::StatusCode> codes;
  for (int attempt = 0; attempt < 5 && codes.empty(); ++attempt) {
    Call(nullptr, kResetAfter * (1 << attempt));
    codes = WaitForCalls(1);
  }
  ASSERT_EQ(codes.size(), 1u) << "the handler never ran for a reset call";
  EXPECT_EQ(codes[0], absl::StatusCode::kCancelled);
}

TEST_F(CallGateTest, AnEmptyOrRealMessageArrived) {
  const std::string empty;
  const std::string garbage = "\x0a\xff";
  Call(&empty);
  Call(&garbage);
  const std::vector<absl::StatusCode> codes = WaitForCalls(2);
  ASSERT_EQ(codes.size(), 2u);
  EXPECT_EQ(codes[0], absl::StatusCode::kOk);
  EXPECT_EQ(codes[1], absl::StatusCode::kOk);  // parsing is the next step
}

}  // namespace
}  // namespace temb
