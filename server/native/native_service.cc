#include "temb/native/native_service.h"

#include <string>
#include <utility>
#include <vector>

#include "temb/base/status_macros.h"
#include "temb/core/timesteps.h"
#include "temb/core/version.h"
#include "temb/grpc/ordered_stream.h"
#include "temb/grpc/raw_messages.h"
#include "temb/grpc/status.h"
#include "temb/native/embed_response_bytes.h"
#include "temb/v1_convert/conversions.h"

namespace temb {
namespace {

constexpr absl::string_view kEmbedMethod = "Embed";
constexpr absl::string_view kStreamMethod = "EmbedStream";

// A view of the float timesteps, or the integer ones converted into
// `storage`.
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
  *storage = TimestepsAsFloat32(request.integer_timesteps());
  return absl::MakeConstSpan(*storage);
}

// Every field of the response but embedding.data.
v1::EmbedResponse ResponseHead(const v1::EmbedRequest& request,
                               const Embedding& embedding) {
  v1::EmbedResponse head;
  head.set_request_id(request.request_id());
  head.set_backend(std::string(BackendKindName(embedding.backend)));
  v1::Tensor* tensor = head.mutable_embedding();
  tensor->add_shape(embedding.rows);
  tensor->add_shape(embedding.spec.dim);
  tensor->set_dtype(DTypeToProto(embedding.spec.dtype));
  return head;
}

int64_t BatchOf(const v1::EmbedRequest& request) {
  return request.timesteps_size() + request.integer_timesteps_size();
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

NativeService::NativeService(const EmbedService& core, const CallGate& gate,
                             RequestObserver* observer, Options options)
    : core_(core),
      gate_(gate),
      observer_(observer),
      info_(MakeServerInfo(core, options.max_message_bytes)) {}

grpc::ServerUnaryReactor* NativeService::Embed(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes,
    grpc::ByteBuffer* response_bytes) {
  RequestTimer timer(observer_, kEmbedMethod);
  AdmissionTicket ticket;
  v1::EmbedRequest request;
  // A unary call authenticates here; a stream did once, when it opened.
  absl::Status status = gate_.Authenticate(*context);
  if (status.ok()) status = ParseRequest(*request_bytes, &request);
  int64_t output_bytes = 0;
  if (status.ok()) {
    SliceAllocator output;
    absl::StatusOr<Embedding> embedding =
        Compute(context, request, &ticket, &output);
    status = embedding.status();
    if (status.ok()) {
      output_bytes = embedding->size_bytes;
      *response_bytes =
          EmbedResponseBytes(ResponseHead(request, *embedding), output.slice());
    }
  }
  timer.Finish(status, BatchOf(request), output_bytes, request.request_id());
  return FinishUnary(context, status, std::move(ticket));
}

grpc::ServerBidiReactor<v1::EmbedRequest, v1::EmbedStreamResponse>*
NativeService::EmbedStream(grpc::CallbackServerContext* context) {
  return OrderedStreamReactor<v1::EmbedRequest, v1::EmbedStreamResponse>::Start(
      context, gate_,
      [this](grpc::CallbackServerContext* call, const v1::EmbedRequest& request,
             AdmissionTicket* ticket, v1::EmbedStreamResponse* response) {
        return AnswerInStream(call, request, ticket, response);
      });
}

absl::Status NativeService::AnswerInStream(
    grpc::CallbackServerContext* context, const v1::EmbedRequest& request,
    AdmissionTicket* ticket, v1::EmbedStreamResponse* response) const {
  RequestTimer timer(observer_, kStreamMethod);
  absl::StatusOr<Embedding> embedding = Compute(context, request, ticket);
  const absl::Status status = embedding.status();
  timer.Finish(status, BatchOf(request),
               status.ok() ? embedding->size_bytes : 0, request.request_id());
  if (absl::IsUnavailable(status)) return status;
  if (status.ok()) {
    v1::EmbedResponse* answer = response->mutable_response();
    *answer = ResponseHead(request, *embedding);
    answer->mutable_embedding()->set_data(std::move(embedding->data));
  } else {
    v1::Error* error = response->mutable_error();
    error->set_code(static_cast<int32_t>(status.code()));
    error->set_message(std::string(status.message()));
  }
  response->set_request_id(request.request_id());
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* NativeService::GetServerInfo(
    grpc::CallbackServerContext* context,
    const v1::GetServerInfoRequest* /*request*/, v1::ServerInfo* response) {
  const absl::Status status = gate_.Enter(*context);
  if (status.ok()) *response = info_;
  return FinishUnary(context, status);
}

absl::StatusOr<Embedding> NativeService::Compute(
    grpc::CallbackServerContext* context, const v1::EmbedRequest& request,
    AdmissionTicket* ticket, OutputAllocator* output) const {
  ASSIGN_OR_RETURN(
      *ticket,
      gate_.Admit(*context, static_cast<int64_t>(request.ByteSizeLong())));
  ASSIGN_OR_RETURN(
      SpecRequest spec_request,
      SpecRequestFromProto(request.preset(), request.spec(), request.dtype()));
  std::vector<float> storage;
  ASSIGN_OR_RETURN(absl::Span<const float> timesteps,
                   Timesteps(request, &storage));
  return core_.Embed(spec_request, timesteps, ticket, output);
}

}  // namespace temb
