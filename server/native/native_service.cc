#include "temb/native/native_service.h"

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "temb/base/quoted.h"
#include "temb/base/status_macros.h"
#include "temb/grpc/ordered_stream.h"
#include "temb/grpc/raw_messages.h"
#include "temb/grpc/status.h"
#include "temb/native/embed_response_bytes.h"
#include "temb/v1_convert/condition_convert.h"
#include "temb/v1_convert/conversions.h"

namespace temb {
namespace {

constexpr absl::string_view kEmbedMethod = "Embed";
constexpr absl::string_view kStreamMethod = "EmbedStream";
constexpr absl::string_view kConditionMethod = "Condition";
constexpr absl::string_view kConditionStreamMethod = "ConditionStream";

// The tensor's shape and dtype; its data is the caller's business.
void FillTensorHead(const ResponsePart& part, v1::Tensor* tensor) {
  tensor->mutable_shape()->Add(part.shape.begin(), part.shape.end());
  tensor->set_dtype(DTypeToProto(part.embedding.spec.dtype));
}

// The wire form of a computed EmbedResponse: a single embedding is framed
// around `output`'s slice, the memory it was computed in; a request with
// parts has its tensors in the message itself.
absl::StatusOr<grpc::ByteBuffer> ResponseBytes(v1::EmbedResponse response,
                                               const SliceAllocator& output) {
  if (response.parts_size() > 0) return SerializedBytes(response);
  return EmbedResponseBytes(std::move(response), output.slice());
}

int64_t BatchOf(const v1::EmbedRequest& request) {
  int64_t batch = request.timesteps_size() + request.integer_timesteps_size();
  for (const v1::EmbedPart& part : request.parts()) {
    batch += part.timesteps_size() + part.integer_timesteps_size();
  }
  return batch;
}

// The timesteps a Condition request carries, in either form (its batch in
// metrics and logs): the product of the shape the caller claims, 0 where
// that is negative or overflows (the request is refused then anyway).
int64_t ConditionBatchOf(const v1::ConditionRequest& request) {
  for (const v1::NamedTensor& input : request.inputs()) {
    if (input.name() != kConditionTimesteps &&
        input.name() != kConditionForwardTimestep &&
        input.name() != kConditionEmbedderTimestep) {
      continue;
    }
    if (input.tensor().shape_size() == 0) return 0;
    int64_t count = 1;
    for (const int64_t extent : input.tensor().shape()) {
      if (extent < 0 ||
          (extent > 0 &&
           count > std::numeric_limits<int64_t>::max() / extent)) {
        return 0;
      }
      count *= extent;
    }
    return count;
  }
  return 0;
}

int64_t ConditionOutputBytes(const v1::ConditionResponse& response) {
  int64_t bytes = 0;
  for (const v1::NamedTensor& output : response.outputs()) {
    bytes += static_cast<int64_t>(output.tensor().data().size());
  }
  return bytes;
}

v1::ServerInfo InfoWithLimits(const EmbedService& core,
                              const NativeService::Options& options) {
  v1::ServerInfo info = ServerInfoProto(core, options.max_message_bytes);
  info.mutable_limits()->set_max_request_bytes(options.max_request_bytes);
  return info;
}

}  // namespace

NativeService::NativeService(const EmbedService& core,
                             const ConditioningService* conditioning,
                             const CallGate& gate, RequestObserver* observer,
                             Options options)
    : core_(core),
      conditioning_(conditioning),
      gate_(gate),
      observer_(observer),
      info_(InfoWithLimits(core, options)) {}

grpc::ServerUnaryReactor* NativeService::Embed(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes,
    grpc::ByteBuffer* response_bytes) {
  RequestTimer timer(observer_, kEmbedMethod);
  AdmissionTicket ticket;
  v1::EmbedRequest request;
  // A unary call authenticates here; a stream did once, when it opened.
  absl::Status status = gate_.Authenticate(*context);
  // A call reset before its message arrived is a cancellation, not garbage.
  if (status.ok()) status = CheckRequestArrived(*request_bytes);
  if (status.ok()) status = ParseRequest(*request_bytes, &request);
  int64_t output_bytes = 0;
  if (status.ok()) {
    SliceAllocator output;
    absl::StatusOr<Answer> answer = Compute(context, request, &ticket, &output);
    absl::StatusOr<grpc::ByteBuffer> bytes =
        answer.ok() ? ResponseBytes(std::move(answer->response), output)
                    : answer.status();
    status = bytes.status();
    if (status.ok()) {
      output_bytes = answer->output_bytes;
      *response_bytes = *std::move(bytes);
    }
  }
  timer.Finish(status, BatchOf(request), output_bytes, request.request_id());
  return FinishUnary(context, status, std::move(ticket));
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
NativeService::EmbedStream(grpc::CallbackServerContext* context) {
  return OrderedStreamReactor<v1::EmbedRequest>::Start(
      context, gate_,
      [this](grpc::CallbackServerContext* call, const v1::EmbedRequest& request,
             AdmissionTicket* ticket, grpc::ByteBuffer* response_bytes) {
        return AnswerInStream(call, request, ticket, response_bytes);
      });
}

absl::Status NativeService::AnswerInStream(
    grpc::CallbackServerContext* context, const v1::EmbedRequest& request,
    AdmissionTicket* ticket, grpc::ByteBuffer* response_bytes) const {
  RequestTimer timer(observer_, kStreamMethod);
  SliceAllocator output;
  absl::StatusOr<Answer> answer = Compute(context, request, ticket, &output);
  absl::StatusOr<grpc::ByteBuffer> bytes =
      answer.ok() ? ResponseBytes(std::move(answer->response), output)
                  : answer.status();
  const absl::Status status = bytes.status();
  timer.Finish(status, BatchOf(request), status.ok() ? answer->output_bytes : 0,
               request.request_id());
  if (absl::IsUnavailable(status)) return status;
  v1::EmbedStreamResponse head;
  head.set_request_id(request.request_id());
  if (status.ok()) {
    // EmbedStreamResponse{request_id, response: the unary answer's bytes}.
    *response_bytes =
        WithMessageField(head.SerializeAsString(),
                         v1::EmbedStreamResponse::kResponseFieldNumber, *bytes);
    return absl::OkStatus();
  }
  v1::Error* error = head.mutable_error();
  error->set_code(static_cast<int32_t>(status.code()));
  error->set_message(std::string(status.message()));
  ASSIGN_OR_RETURN(*response_bytes, SerializedBytes(head));
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* NativeService::GetServerInfo(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes,
    grpc::ByteBuffer* response_bytes) {
  absl::Status status = gate_.Enter(*context);
  v1::GetServerInfoRequest request;
  if (status.ok()) status = ParseRequest(*request_bytes, &request);
  if (status.ok()) {
    // The models' states change as they load; the rest is fixed.
    v1::ServerInfo info = info_;
    if (conditioning_ != nullptr) {
      AddConditioningToServerInfo(*conditioning_, &info);
    }
    absl::StatusOr<grpc::ByteBuffer> bytes = SerializedBytes(info);
    status = bytes.status();
    if (status.ok()) *response_bytes = *std::move(bytes);
  }
  return FinishUnary(context, status);
}

grpc::ServerUnaryReactor* NativeService::Condition(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes,
    grpc::ByteBuffer* response_bytes) {
  RequestTimer timer(observer_, kConditionMethod);
  AdmissionTicket ticket;
  v1::ConditionRequest request;
  absl::Status status = gate_.Authenticate(*context);
  if (status.ok()) status = CheckRequestArrived(*request_bytes);
  if (status.ok()) status = ParseRequest(*request_bytes, &request);
  int64_t output_bytes = 0;
  if (status.ok()) {
    absl::StatusOr<v1::ConditionResponse> response =
        ComputeCondition(context, request, &ticket);
    absl::StatusOr<grpc::ByteBuffer> bytes =
        response.ok() ? SerializedBytes(*response) : response.status();
    status = bytes.status();
    if (status.ok()) {
      output_bytes = ConditionOutputBytes(*response);
      *response_bytes = *std::move(bytes);
    }
  }
  timer.Finish(status, ConditionBatchOf(request), output_bytes,
               request.request_id());
  return FinishUnary(context, status, std::move(ticket));
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
NativeService::ConditionStream(grpc::CallbackServerContext* context) {
  return OrderedStreamReactor<v1::ConditionRequest>::Start(
      context, gate_,
      [this](grpc::CallbackServerContext* call,
             const v1::ConditionRequest& request, AdmissionTicket* ticket,
             grpc::ByteBuffer* response_bytes) {
        return AnswerConditionInStream(call, request, ticket, response_bytes);
      });
}

absl::Status NativeService::AnswerConditionInStream(
    grpc::CallbackServerContext* context, const v1::ConditionRequest& request,
    AdmissionTicket* ticket, grpc::ByteBuffer* response_bytes) const {
  RequestTimer timer(observer_, kConditionStreamMethod);
  absl::StatusOr<v1::ConditionResponse> response =
      ComputeCondition(context, request, ticket);
  const absl::Status status = response.status();
  timer.Finish(status, ConditionBatchOf(request),
               status.ok() ? ConditionOutputBytes(*response) : 0,
               request.request_id());
  if (absl::IsUnavailable(status)) return status;
  v1::ConditionStreamResponse answer;
  answer.set_request_id(request.request_id());
  if (status.ok()) {
    *answer.mutable_response() = *std::move(response);
  } else {
    v1::Error* error = answer.mutable_error();
    error->set_code(static_cast<int32_t>(status.code()));
    error->set_message(std::string(status.message()));
  }
  ASSIGN_OR_RETURN(*response_bytes, SerializedBytes(answer));
  return absl::OkStatus();
}

absl::StatusOr<v1::ConditionResponse> NativeService::ComputeCondition(
    grpc::CallbackServerContext* context, const v1::ConditionRequest& request,
    AdmissionTicket* ticket) const {
  ASSIGN_OR_RETURN(
      *ticket,
      gate_.Admit(*context, static_cast<int64_t>(request.ByteSizeLong())));
  if (conditioning_ == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("model: ", Quoted(request.model()),
                     ": this server has no conditioning models "
                     "(temb-server --model_repository)"));
  }
  std::vector<std::vector<float>> storage;
  ASSIGN_OR_RETURN(const ConditionRequest call,
                   ConditionRequestFromProto(request, &storage));
  ASSIGN_OR_RETURN(ConditionResponse served,
                   conditioning_->Serve(call, ticket));
  return ConditionResponseToProto(std::move(served), request.request_id());
}

absl::StatusOr<NativeService::Answer> NativeService::Compute(
    grpc::CallbackServerContext* context, const v1::EmbedRequest& request,
    AdmissionTicket* ticket, OutputAllocator* output) const {
  ASSIGN_OR_RETURN(
      *ticket,
      gate_.Admit(*context, static_cast<int64_t>(request.ByteSizeLong())));
  std::vector<std::vector<float>> storage;
  ASSIGN_OR_RETURN(const Request call, RequestFromProto(request, &storage));
  // One embedding is computed into `output` (sent without a copy); parts
  // travel in the message.
  OutputAllocator* const into_output[] = {output};
  ASSIGN_OR_RETURN(
      Response served,
      core_.Serve(call, ticket,
                  call.named_parts ? absl::Span<OutputAllocator* const>()
                                   : absl::MakeConstSpan(into_output)));
  Answer answer;
  answer.output_bytes = served.output_bytes;
  answer.response.set_request_id(request.request_id());
  answer.response.set_backend(
      std::string(BackendKindName(served.parts.back().embedding.backend)));
  if (!call.named_parts) {
    // The bytes are in `output`.
    FillTensorHead(served.parts[0], answer.response.mutable_embedding());
    return answer;
  }
  for (ResponsePart& part : served.parts) {
    v1::NamedTensor* named = answer.response.add_parts();
    named->set_name(std::move(part.name));
    FillTensorHead(part, named->mutable_tensor());
    named->mutable_tensor()->set_data(std::move(part.embedding.data));
  }
  return answer;
}

}  // namespace temb
