#include "temb/native/native_service.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "temb/base/quoted.h"
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

// A view of the float timesteps of `message` (an EmbedRequest or an
// EmbedPart), or its integer ones converted into `storage`.
template <typename Message>
absl::StatusOr<absl::Span<const float>> Timesteps(const Message& message,
                                                  std::vector<float>* storage) {
  if (message.integer_timesteps_size() == 0) {
    return absl::MakeConstSpan(message.timesteps().data(),
                               message.timesteps_size());
  }
  if (message.timesteps_size() > 0) {
    return absl::InvalidArgumentError(
        "set either timesteps or integer_timesteps, not both");
  }
  *storage = TimestepsAsFloat32(message.integer_timesteps());
  return absl::MakeConstSpan(*storage);
}

// The tensor's shape and dtype; its data is the caller's business.
void FillTensorHead(const Embedding& embedding,
                    const std::vector<int64_t>& shape, v1::Tensor* tensor) {
  tensor->mutable_shape()->Add(shape.begin(), shape.end());
  tensor->set_dtype(DTypeToProto(embedding.spec.dtype));
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
    absl::StatusOr<grpc::ByteBuffer> bytes = SerializedBytes(info_);
    status = bytes.status();
    if (status.ok()) *response_bytes = *std::move(bytes);
  }
  return FinishUnary(context, status);
}

absl::StatusOr<NativeService::Answer> NativeService::Compute(
    grpc::CallbackServerContext* context, const v1::EmbedRequest& request,
    AdmissionTicket* ticket, OutputAllocator* output) const {
  ASSIGN_OR_RETURN(
      *ticket,
      gate_.Admit(*context, static_cast<int64_t>(request.ByteSizeLong())));
  ASSIGN_OR_RETURN(
      SpecRequest whole,
      SpecRequestFromProto(request.preset(), request.spec(), request.dtype()));
  if (request.request_id().size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id must be at most ", kMaxRequestIdBytes,
                     " bytes, got ", request.request_id().size()));
  }
  Answer answer;
  answer.response.set_request_id(request.request_id());
  if (request.parts_size() == 0) {
    std::vector<float> storage;
    ASSIGN_OR_RETURN(absl::Span<const float> timesteps,
                     Timesteps(request, &storage));
    // The shape is checked before computing; its last extent is the dim.
    RETURN_IF_ERROR(
        EmbeddingShape(request.timesteps_shape(), timesteps.size(), 0)
            .status());
    ASSIGN_OR_RETURN(Embedding embedding,
                     core_.Embed(whole, timesteps, ticket, output));
    ASSIGN_OR_RETURN(std::vector<int64_t> shape,
                     EmbeddingShape(request.timesteps_shape(), embedding.rows,
                                    embedding.spec.dim));
    answer.output_bytes = embedding.size_bytes;
    answer.response.set_backend(
        std::string(BackendKindName(embedding.backend)));
    v1::Tensor* tensor = answer.response.mutable_embedding();
    FillTensorHead(embedding, shape, tensor);
    return answer;  // the bytes are in `output`
  }
  if (request.timesteps_size() > 0 || request.integer_timesteps_size() > 0 ||
      !request.timesteps_shape().empty()) {
    return absl::InvalidArgumentError(
        "a request with parts carries its timesteps in each part: leave "
        "timesteps, integer_timesteps and timesteps_shape empty");
  }
  if (request.parts_size() > kMaxParts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parts must hold at most ", kMaxParts, ", got ", request.parts_size()));
  }
  for (int i = 0; i < request.parts_size(); ++i) {
    const v1::EmbedPart& part = request.parts(i);
    const std::string field = absl::StrCat("parts[", i, "]");
    if (part.name().size() > kMaxPartNameBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".name must be at most ", kMaxPartNameBytes,
                       " bytes, got ", part.name().size()));
    }
    ASSIGN_OR_RETURN(
        SpecRequest own,
        SpecRequestFromProto(part.preset(), part.spec(), part.dtype()));
    ASSIGN_OR_RETURN(SpecRequest spec,
                     PartSpecRequest(whole, part.name(), own, core_.presets()));
    std::vector<float> storage;
    ASSIGN_OR_RETURN(absl::Span<const float> timesteps,
                     Timesteps(part, &storage));
    const std::string shape_field = absl::StrCat(field, ".timesteps_shape");
    RETURN_IF_ERROR(
        EmbeddingShape(part.timesteps_shape(), timesteps.size(), 0, shape_field)
            .status());
    absl::StatusOr<Embedding> embedding = core_.Embed(spec, timesteps, ticket);
    if (!embedding.ok()) {
      // Name the part, keep the code.
      return absl::Status(embedding.status().code(),
                          absl::StrCat(field, " (", Quoted(part.name()),
                                       "): ", embedding.status().message()));
    }
    ASSIGN_OR_RETURN(std::vector<int64_t> shape,
                     EmbeddingShape(part.timesteps_shape(), embedding->rows,
                                    embedding->spec.dim, shape_field));
    answer.output_bytes += embedding->size_bytes;
    // Each part passed max_output_bytes; the answer as a whole must too.
    if (answer.output_bytes > core_.limits().max_output_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the parts' outputs together must be <= ",
          core_.limits().max_output_bytes, " bytes (max_output_bytes), got ",
          answer.output_bytes, " up to ", field));
    }
    answer.response.set_backend(
        std::string(BackendKindName(embedding->backend)));
    v1::NamedTensor* named = answer.response.add_parts();
    named->set_name(part.name());
    FillTensorHead(*embedding, shape, named->mutable_tensor());
    named->mutable_tensor()->set_data(std::move(embedding->data));
  }
  return answer;
}

}  // namespace temb
