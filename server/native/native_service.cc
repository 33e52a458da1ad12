#include "server/native/native_service.h"

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "server/core/proto_conversions.h"
#include "server/core/version.h"
#include "server/grpc/status.h"
#include "temb/kernels/status_macros.h"

namespace temb {
namespace {

constexpr absl::string_view kEmbedMethod = "Embed";
constexpr absl::string_view kStreamMethod = "EmbedStream";

absl::Status CheckCallWanted(const grpc::CallbackServerContext& context) {
  if (context.IsCancelled()) {
    return absl::CancelledError("the call was cancelled before computing");
  }
  if (context.deadline() <= std::chrono::system_clock::now()) {
    return absl::DeadlineExceededError("the deadline passed before computing");
  }
  return absl::OkStatus();
}

// A view of the float timesteps, or the integer ones converted into
// `storage` (exact up to 2^24, as the contract says).
absl::StatusOr<absl::Span<const float>> Timesteps(
    const v1::EmbedRequest& request, std::vector<float>* storage) {
  if (request.integer_timesteps_size() == 0) {
    return absl::MakeConstSpan(request.timesteps().data(),
                               request.timesteps_size());
  }
  if (request.timesteps_size() > 0) {
    return absl::InvalidArgumentError(
        "set either timesteps or integer_timesteps, not both");
  }
  storage->reserve(request.integer_timesteps_size());
  for (int64_t t : request.integer_timesteps()) {
    storage->push_back(static_cast<float>(t));
  }
  return absl::MakeConstSpan(*storage);
}

v1::ServerInfo MakeServerInfo(const EmbedService& core, int max_message_bytes) {
  v1::ServerInfo info;
  info.set_version(std::string(Version()));
  info.set_backend(std::string(BackendKindName(core.backend().kind())));
  info.set_device(core.backend().device());
  v1::Limits* limits = info.mutable_limits();
  limits->set_max_dim(core.limits().max_dim);
  limits->set_max_batch(core.limits().max_batch);
  limits->set_max_output_bytes(core.limits().max_output_bytes);
  limits->set_max_message_bytes(max_message_bytes);
  for (const Preset& preset : core.presets().presets()) {
    PresetToProto(preset, info.add_presets());
  }
  return info;
}

}  // namespace

class NativeService::StreamReactor final
    : public grpc::ServerBidiReactor<v1::EmbedRequest,
                                     v1::EmbedStreamResponse> {
 public:
  StreamReactor(const NativeService& service,
                grpc::CallbackServerContext* context)
      : service_(service), context_(context) {
    if (absl::Status status = service_.gate_.Enter(*context); !status.ok()) {
      Finish(ToGrpcStatus(status));
      return;
    }
    StartRead(&request_);
  }

  // Exactly one read or write is outstanding at any time, which keeps the
  // answers in order and makes Finish() reachable from a single place each.
  void OnReadDone(bool ok) override {
    if (!ok) {  // half-close; after a cancellation the status is ignored
      Finish(grpc::Status::OK);
      return;
    }
    response_.Clear();
    const absl::Status status =
        service_.Handle(kStreamMethod, context_, request_,
                        response_.mutable_response(), &ticket_);
    if (absl::IsUnavailable(status)) {
      Finish(ToGrpcStatus(status));
      return;
    }
    if (!status.ok()) {
      v1::Error* error = response_.mutable_error();  // clears `response`
      error->set_code(static_cast<int32_t>(status.code()));
      error->set_message(std::string(status.message()));
    }
    response_.set_request_id(request_.request_id());
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                          "the stream was cancelled while writing"));
      return;
    }
    ticket_ = AdmissionTicket();  // the answer is out
    request_.Clear();
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  const NativeService& service_;
  grpc::CallbackServerContext* const context_;
  v1::EmbedRequest request_;
  v1::EmbedStreamResponse response_;
  AdmissionTicket ticket_;  // of the request being answered
};

NativeService::NativeService(const EmbedService& core, const CallGate& gate,
                             RequestObserver* observer, Options options)
    : core_(core),
      gate_(gate),
      observer_(observer),
      info_(MakeServerInfo(core, options.max_message_bytes)) {}

grpc::ServerUnaryReactor* NativeService::Embed(
    grpc::CallbackServerContext* context, const v1::EmbedRequest* request,
    v1::EmbedResponse* response) {
  AdmissionTicket ticket;
  const absl::Status status =
      Handle(kEmbedMethod, context, *request, response, &ticket);
  return FinishUnary(context, status, std::move(ticket));
}

grpc::ServerBidiReactor<v1::EmbedRequest, v1::EmbedStreamResponse>*
NativeService::EmbedStream(grpc::CallbackServerContext* context) {
  return new StreamReactor(*this, context);
}

grpc::ServerUnaryReactor* NativeService::GetServerInfo(
    grpc::CallbackServerContext* context,
    const v1::GetServerInfoRequest* /*request*/, v1::ServerInfo* response) {
  const absl::Status status = gate_.Enter(*context);
  if (status.ok()) *response = info_;
  return FinishUnary(context, status);
}

absl::Status NativeService::Handle(absl::string_view method,
                                   grpc::CallbackServerContext* context,
                                   const v1::EmbedRequest& request,
                                   v1::EmbedResponse* response,
                                   AdmissionTicket* ticket) const {
  RequestTimer timer(observer_, method);
  // A unary call authenticates here; a stream did once, when it opened.
  absl::Status status = method == kEmbedMethod
                            ? gate_.Authenticate(*context)
                            : absl::OkStatus();
  if (status.ok()) status = Compute(context, request, response, ticket);
  timer.Finish(
      status, request.timesteps_size() + request.integer_timesteps_size(),
      status.ok() ? static_cast<int64_t>(response->embedding().data().size())
                  : 0,
      request.request_id());
  return status;
}

absl::Status NativeService::Compute(grpc::CallbackServerContext* context,
                                    const v1::EmbedRequest& request,
                                    v1::EmbedResponse* response,
                                    AdmissionTicket* ticket) const {
  ASSIGN_OR_RETURN(*ticket,
                   gate_.Admit(*context,
                               static_cast<int64_t>(request.ByteSizeLong())));
  ASSIGN_OR_RETURN(
      SpecRequest spec_request,
      SpecRequestFromProto(request.preset(), request.spec(), request.dtype()));
  std::vector<float> storage;
  ASSIGN_OR_RETURN(absl::Span<const float> timesteps,
                   Timesteps(request, &storage));
  RETURN_IF_ERROR(CheckCallWanted(*context));
  ASSIGN_OR_RETURN(Embedding embedding,
                   core_.Embed(spec_request, timesteps, ticket));

  response->set_request_id(request.request_id());
  response->set_backend(std::string(BackendKindName(embedding.backend)));
  v1::Tensor* tensor = response->mutable_embedding();
  tensor->add_shape(embedding.rows);
  tensor->add_shape(embedding.spec.dim);
  tensor->set_dtype(DTypeToProto(embedding.spec.dtype));
  tensor->set_data(std::move(embedding.data));  // moves: no copy of the bytes
  return absl::OkStatus();
}

}  // namespace temb
