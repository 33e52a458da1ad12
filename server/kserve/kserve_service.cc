#include "server/kserve/kserve_service.h"

#include <chrono>
#include <string>
#include <utility>

#include "server/core/version.h"
#include "server/grpc/raw_messages.h"
#include "server/grpc/status.h"
#include "server/kserve/kserve_convert.h"

namespace temb::kserve {
namespace {

constexpr absl::string_view kInferMethod = "ModelInfer";
constexpr absl::string_view kStreamMethod = "ModelStreamInfer";

grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context,
                                     const absl::Status& status) {
  return FinishUnary(context, status);
}

absl::Status CheckCallWanted(const grpc::CallbackServerContext& context) {
  if (context.IsCancelled()) {
    return absl::CancelledError("the call was cancelled before computing");
  }
  if (context.deadline() <= std::chrono::system_clock::now()) {
    return absl::DeadlineExceededError("the deadline passed before computing");
  }
  return absl::OkStatus();
}

}  // namespace

// Reads one request, answers it, and only then reads the next: responses
// keep the requests' order and at most one read or write is ever in flight,
// so Finish() is reached from exactly one place.
class KServeService::StreamReactor final
    : public grpc::ServerBidiReactor<inference::ModelInferRequest,
                                     inference::ModelStreamInferResponse> {
 public:
  StreamReactor(const KServeService& service,
                grpc::CallbackServerContext* context)
      : service_(service), context_(context) {
    absl::StatusOr<AdmissionTicket> open = service_.gate_.OpenStream(*context);
    if (!open.ok()) {
      Finish(ToGrpcStatus(open.status()));
      return;
    }
    open_ = std::move(*open);
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // half-close; after a cancellation the status is ignored
      Finish(grpc::Status::OK);
      return;
    }
    response_.Clear();
    inference::ModelInferResponse* answer = response_.mutable_infer_response();
    RequestTimer timer(service_.observer_, kStreamMethod);
    const absl::Status status =
        service_.Compute(*context_, request_, answer, &ticket_);
    if (status.ok()) {
      timer.Finish(
          status, answer->outputs(0).shape(0),
          static_cast<int64_t>(answer->raw_output_contents(0).size()),
          request_.id());
    } else {
      timer.Finish(status, 0, 0, request_.id());
    }
    if (absl::IsUnavailable(status)) {
      Finish(ToGrpcStatus(status));
      return;
    }
    if (!status.ok()) {
      // Only the request's identity, so that clients can match the error.
      answer->Clear();
      answer->set_model_name(request_.model_name());
      answer->set_model_version(request_.model_version());
      answer->set_id(request_.id());
      response_.set_error_message(std::string(status.message()));
    }
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                          "the stream closed before the answer was sent"));
      return;
    }
    ticket_ = AdmissionTicket();  // the answer is out
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  const KServeService& service_;
  grpc::CallbackServerContext* const context_;
  inference::ModelInferRequest request_;
  inference::ModelStreamInferResponse response_;
  AdmissionTicket ticket_;  // of the request being answered
  AdmissionTicket open_;    // held until the stream ends, for the drain
};

KServeService::KServeService(const EmbedService& core, const CallGate& gate,
                             RequestObserver* observer)
    : core_(core), gate_(gate), observer_(observer) {}

absl::Status KServeService::Compute(
    const grpc::CallbackServerContext& context,
    const inference::ModelInferRequest& request,
    inference::ModelInferResponse* response, AdmissionTicket* ticket,
    OutputAllocator* output) const {
  absl::StatusOr<AdmissionTicket> admitted =
      gate_.Admit(context, static_cast<int64_t>(request.ByteSizeLong()));
  if (!admitted.ok()) return admitted.status();
  *ticket = std::move(*admitted);
  if (absl::Status status = CheckCallWanted(context); !status.ok()) {
    return status;
  }
  return Infer(core_, request, response, ticket, output);
}

grpc::ServerUnaryReactor* KServeService::ServerLive(
    grpc::CallbackServerContext* context,
    const inference::ServerLiveRequest* /*request*/,
    inference::ServerLiveResponse* response) {
  const absl::Status status = gate_.Authenticate(*context);
  response->set_live(status.ok());
  return FinishWith(context, status);
}

grpc::ServerUnaryReactor* KServeService::ServerReady(
    grpc::CallbackServerContext* context,
    const inference::ServerReadyRequest* /*request*/,
    inference::ServerReadyResponse* response) {
  const absl::Status status = gate_.Authenticate(*context);
  response->set_ready(status.ok() && gate_.serving());
  return FinishWith(context, status);
}

grpc::ServerUnaryReactor* KServeService::ModelReady(
    grpc::CallbackServerContext* context,
    const inference::ModelReadyRequest* request,
    inference::ModelReadyResponse* response) {
  const absl::Status status = gate_.Authenticate(*context);
  response->set_ready(
      status.ok() && gate_.serving() &&
      FindModel(core_.presets(), request->name(), request->version()).ok());
  return FinishWith(context, status);
}

grpc::ServerUnaryReactor* KServeService::ServerMetadata(
    grpc::CallbackServerContext* context,
    const inference::ServerMetadataRequest* /*request*/,
    inference::ServerMetadataResponse* response) {
  const absl::Status status = gate_.Enter(*context);
  if (status.ok()) FillServerMetadata(Version(), response);
  return FinishWith(context, status);
}

grpc::ServerUnaryReactor* KServeService::ModelMetadata(
    grpc::CallbackServerContext* context,
    const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  if (absl::Status status = gate_.Enter(*context); !status.ok()) {
    return FinishWith(context, status);
  }
  absl::StatusOr<const Preset*> model =
      FindModel(core_.presets(), request->name(), request->version());
  if (model.ok()) FillModelMetadata(**model, response);
  return FinishWith(context, model.status());
}

grpc::ServerUnaryReactor* KServeService::ModelConfig(
    grpc::CallbackServerContext* context,
    const inference::ModelConfigRequest* request,
    inference::ModelConfigResponse* response) {
  if (absl::Status status = gate_.Enter(*context); !status.ok()) {
    return FinishWith(context, status);
  }
  absl::StatusOr<const Preset*> model =
      FindModel(core_.presets(), request->name(), request->version());
  if (model.ok()) {
    FillModelConfig(**model, core_.limits(), response->mutable_config());
  }
  return FinishWith(context, model.status());
}

grpc::ServerUnaryReactor* KServeService::ModelInfer(
    grpc::CallbackServerContext* context,
    const grpc::ByteBuffer* request_bytes, grpc::ByteBuffer* response_bytes) {
  RequestTimer timer(observer_, kInferMethod);
  AdmissionTicket ticket;
  inference::ModelInferRequest request;
  // A unary call authenticates here; a stream did once, when it opened.
  absl::Status status = gate_.Authenticate(*context);
  if (status.ok()) status = ParseRequest(*request_bytes, &request);
  inference::ModelInferResponse head;
  SliceAllocator output;
  if (status.ok()) status = Compute(*context, request, &head, &ticket, &output);
  if (status.ok()) {
    *response_bytes = WithBytesField(
        head.SerializeAsString(),
        inference::ModelInferResponse::kRawOutputContentsFieldNumber,
        output.slice());
    timer.Finish(status, head.outputs(0).shape(0),
                 static_cast<int64_t>(output.slice().size()), request.id());
  } else {
    timer.Finish(status, 0, 0, request.id());
  }
  return FinishUnary(context, status, std::move(ticket));
}

grpc::ServerBidiReactor<inference::ModelInferRequest,
                        inference::ModelStreamInferResponse>*
KServeService::ModelStreamInfer(grpc::CallbackServerContext* context) {
  return new StreamReactor(*this, context);
}

}  // namespace temb::kserve
