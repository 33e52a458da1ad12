#include "temb/kserve/kserve_service.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "temb/base/status_macros.h"
#include "temb/core/version.h"
#include "temb/grpc/ordered_stream.h"
#include "temb/grpc/raw_messages.h"
#include "temb/grpc/status.h"
#include "temb/kserve/conditioning_convert.h"
#include "temb/kserve/inference.h"
#include "temb/kserve/kserve_convert.h"

namespace temb::kserve {
namespace {

constexpr absl::string_view kInferMethod = "ModelInfer";
constexpr absl::string_view kStreamMethod = "ModelStreamInfer";

grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context,
                                     const absl::Status& status) {
  return FinishUnary(context, status);
}

// The embedding bytes of an answer: in the response, or in `output`.
int64_t OutputBytesOf(const inference::ModelInferResponse& response,
                      const SliceAllocator& output) {
  int64_t bytes = static_cast<int64_t>(output.slice().size());
  for (const std::string& raw : response.raw_output_contents()) {
    bytes += static_cast<int64_t>(raw.size());
  }
  return bytes;
}

// The wire form of a computed response (see Infer): a single output
// computed into `output` becomes the one raw_output_contents entry, framed
// around that memory; several outputs (or outputs written to shared memory)
// are in the message itself.
absl::StatusOr<grpc::ByteBuffer> InferResponseBytes(
    const inference::ModelInferResponse& head, const SliceAllocator& output) {
  if (head.raw_output_contents_size() > 0) return SerializedBytes(head);
  return WithBytesField(
      head.SerializeAsString(),
      inference::ModelInferResponse::kRawOutputContentsFieldNumber,
      output.slice());
}

}  // namespace

KServeService::KServeService(const EmbedService& core, const CallGate& gate,
                             RequestObserver* observer,
                             InferenceStatistics* statistics,
                             SharedMemoryRegistry* shared_memory,
                             const ConditioningService* conditioning,
                             ModelControl* control)
    : models_{core, conditioning},
      gate_(gate),
      observer_(observer),
      own_statistics_(
          statistics == nullptr
              ? std::make_unique<InferenceStatistics>(models_.Names())
              : nullptr),
      statistics_(statistics == nullptr ? own_statistics_.get() : statistics),
      own_shared_memory_(shared_memory == nullptr
                             ? std::make_unique<SharedMemoryRegistry>()
                             : nullptr),
      shared_memory_(shared_memory == nullptr ? own_shared_memory_.get()
                                              : shared_memory),
      control_(control) {}

absl::Status KServeService::Compute(const grpc::CallbackServerContext& context,
                                    const inference::ModelInferRequest& request,
                                    inference::ModelInferResponse* response,
                                    AdmissionTicket* ticket,
                                    InferStatsTimer* stats,
                                    OutputAllocator* output) const {
  absl::StatusOr<AdmissionTicket> admitted =
      gate_.Admit(context, static_cast<int64_t>(request.ByteSizeLong()));
  stats->Lap(InferPhase::kQueue);
  if (!admitted.ok()) return admitted.status();
  *ticket = std::move(*admitted);
  const absl::Status status =
      RunInference(models_, shared_memory_, request, response, ticket, output);
  stats->Lap(InferPhase::kComputeInfer);
  return status;
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
  // Ready once every conditioning model has loaded (strict, the default),
  // or has loaded or failed with --serve_ready_models (a failed one is then
  // not ready itself, ModelReady, and does not hold the others back).
  response->set_ready(status.ok() && gate_.serving() &&
                      models_.RepositoryReady());
  return FinishWith(context, status);
}

grpc::ServerUnaryReactor* KServeService::ModelReady(
    grpc::CallbackServerContext* context,
    const inference::ModelReadyRequest* request,
    inference::ModelReadyResponse* response) {
  const absl::Status status = gate_.Authenticate(*context);
  response->set_ready(status.ok() && gate_.serving() &&
                      models_.Ready(request->name(), request->version()));
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
  absl::Status status = gate_.Enter(*context);
  if (status.ok()) {
    status =
        models_.FillMetadata(request->name(), request->version(), response);
  }
  return FinishWith(context, status);
}

grpc::ServerUnaryReactor* KServeService::ModelConfig(
    grpc::CallbackServerContext* context,
    const inference::ModelConfigRequest* request,
    inference::ModelConfigResponse* response) {
  absl::Status status = gate_.Enter(*context);
  if (status.ok()) {
    status = models_.FillConfig(request->name(), request->version(),
                                response->mutable_config());
  }
  return FinishWith(context, status);
}

grpc::ServerUnaryReactor* KServeService::ModelStatistics(
    grpc::CallbackServerContext* context,
    const inference::ModelStatisticsRequest* request,
    inference::ModelStatisticsResponse* response) {
  if (absl::Status status = gate_.Enter(*context); !status.ok()) {
    return FinishWith(context, status);
  }
  return FinishWith(context, statistics_->Fill(request->name(),
                                               request->version(), response));
}

grpc::ServerUnaryReactor* KServeService::SystemSharedMemoryStatus(
    grpc::CallbackServerContext* context,
    const inference::SystemSharedMemoryStatusRequest* request,
    inference::SystemSharedMemoryStatusResponse* response) {
  if (absl::Status status = gate_.Enter(*context); !status.ok()) {
    return FinishWith(context, status);
  }
  auto regions = shared_memory_->Status(request->name());
  if (regions.ok()) {
    for (const auto& region : *regions) {
      auto& entry = (*response->mutable_regions())[region->name()];
      entry.set_name(region->name());
      entry.set_key(region->key());
      entry.set_offset(region->offset());
      entry.set_byte_size(region->byte_size());
    }
  }
  return FinishWith(context, regions.status());
}

grpc::ServerUnaryReactor* KServeService::SystemSharedMemoryRegister(
    grpc::CallbackServerContext* context,
    const inference::SystemSharedMemoryRegisterRequest* request,
    inference::SystemSharedMemoryRegisterResponse* /*response*/) {
  absl::Status status = gate_.Enter(*context);
  if (status.ok()) {
    status = shared_memory_->Register(request->name(), request->key(),
                                      request->offset(), request->byte_size());
  }
  return FinishWith(context, status);
}

grpc::ServerUnaryReactor* KServeService::SystemSharedMemoryUnregister(
    grpc::CallbackServerContext* context,
    const inference::SystemSharedMemoryUnregisterRequest* request,
    inference::SystemSharedMemoryUnregisterResponse* /*response*/) {
  absl::Status status = gate_.Enter(*context);
  if (status.ok()) status = shared_memory_->Unregister(request->name());
  return FinishWith(context, status);
}

grpc::ServerUnaryReactor* KServeService::CudaSharedMemoryStatus(
    grpc::CallbackServerContext* context,
    const inference::CudaSharedMemoryStatusRequest* request,
    inference::CudaSharedMemoryStatusResponse* /*response*/) {
  return FinishWith(context, NoCudaRegion(*context, request->name()));
}

grpc::ServerUnaryReactor* KServeService::CudaSharedMemoryRegister(
    grpc::CallbackServerContext* context,
    const inference::CudaSharedMemoryRegisterRequest* /*request*/,
    inference::CudaSharedMemoryRegisterResponse* /*response*/) {
  absl::Status status = gate_.Enter(*context);
  if (status.ok()) {
    status = absl::InvalidArgumentError(
        "CUDA shared memory is not supported; use system shared memory");
  }
  return FinishWith(context, status);
}

grpc::ServerUnaryReactor* KServeService::CudaSharedMemoryUnregister(
    grpc::CallbackServerContext* context,
    const inference::CudaSharedMemoryUnregisterRequest* request,
    inference::CudaSharedMemoryUnregisterResponse* /*response*/) {
  return FinishWith(context, NoCudaRegion(*context, request->name()));
}

namespace {

// The repository calls' common checks: a repository, this server's one
// (its name is not kept: any name but "" is another), and no parameters
// but Triton's unload_dependents, which has nothing to act on here.
constexpr absl::string_view kUnloadDependents = "unload_dependents";

absl::Status CheckRepositoryCall(
    const ModelControl* control, absl::string_view repository_name,
    const google::protobuf::Map<
        std::string, inference::ModelRepositoryParameter>& parameters) {
  if (control == nullptr) {
    return absl::FailedPreconditionError(
        "the server has no model repository (--model_repository)");
  }
  if (!repository_name.empty()) {
    return absl::NotFoundError(
        absl::StrCat("repository_name: \"", repository_name.substr(0, 128),
                     "\" is not known; leave it empty for the server's one"));
  }
  for (const auto& [key, value] : parameters) {
    // tritonclient's unload_model always sends it; a conditioning model
    // has no dependents (no ensembles).
    if (key == kUnloadDependents) continue;
    return absl::InvalidArgumentError(
        absl::StrCat("parameters: none are taken but ", kUnloadDependents,
                     " (got \"", key.substr(0, 128), "\")"));
  }
  return absl::OkStatus();
}

}  // namespace

grpc::ServerUnaryReactor* KServeService::RepositoryIndex(
    grpc::CallbackServerContext* context,
    const inference::RepositoryIndexRequest* request,
    inference::RepositoryIndexResponse* response) {
  absl::Status status = gate_.Enter(*context);
  if (status.ok()) {
    status = CheckRepositoryCall(control_, request->repository_name(), {});
  }
  if (status.ok()) {
    for (const auto& entry : control_->Index(request->ready())) {
      FillModelIndex(entry, response->add_models());
    }
  }
  return FinishWith(context, status);
}

grpc::ServerUnaryReactor* KServeService::RepositoryModelLoad(
    grpc::CallbackServerContext* context,
    const inference::RepositoryModelLoadRequest* request,
    inference::RepositoryModelLoadResponse* /*response*/) {
  absl::Status status = gate_.Enter(*context);
  if (status.ok()) {
    status = CheckRepositoryCall(control_, request->repository_name(),
                                 request->parameters());
  }
  // Returns once the folder has loaded: an operator's rare call, which
  // holds one of gRPC's callback threads for that long.
  if (status.ok()) status = control_->Load(request->model_name());
  return FinishWith(context, status);
}

grpc::ServerUnaryReactor* KServeService::RepositoryModelUnload(
    grpc::CallbackServerContext* context,
    const inference::RepositoryModelUnloadRequest* request,
    inference::RepositoryModelUnloadResponse* /*response*/) {
  absl::Status status = gate_.Enter(*context);
  if (status.ok()) {
    status = CheckRepositoryCall(control_, request->repository_name(),
                                 request->parameters());
  }
  if (status.ok()) status = control_->Unload(request->model_name());
  return FinishWith(context, status);
}

absl::Status KServeService::NoCudaRegion(
    const grpc::CallbackServerContext& context, absl::string_view name) const {
  RETURN_IF_ERROR(gate_.Enter(context));
  // No CUDA region is ever registered: naming one is NOT_FOUND, naming none
  // (all of them) is an empty answer.
  if (name.empty()) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("no CUDA shared memory region \"",
                                          name, "\" is registered"));
}

grpc::ServerUnaryReactor* KServeService::ModelInfer(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes,
    grpc::ByteBuffer* response_bytes) {
  RequestTimer timer(observer_, kInferMethod);
  InferStatsTimer stats(statistics_);
  AdmissionTicket ticket;
  inference::ModelInferRequest request;
  // A unary call authenticates here; a stream did once, when it opened.
  absl::Status status = gate_.Authenticate(*context);
  // A call reset before its message arrived is a cancellation, not garbage.
  if (status.ok()) status = CheckRequestArrived(*request_bytes);
  if (status.ok()) status = ParseRequest(*request_bytes, &request);
  stats.Lap(InferPhase::kComputeInput);
  inference::ModelInferResponse head;
  SliceAllocator output;
  if (status.ok()) {
    status = Compute(*context, request, &head, &ticket, &stats, &output);
  }
  if (status.ok()) {
    absl::StatusOr<grpc::ByteBuffer> bytes = InferResponseBytes(head, output);
    status = bytes.status();
    if (status.ok()) *response_bytes = *std::move(bytes);
  }
  if (status.ok()) {
    stats.Lap(InferPhase::kComputeOutput);
    stats.Finish(status, request.model_name(),
                 TimestepsAnswered(models_, head));
    timer.Finish(status, TimestepsAnswered(models_, head),
                 OutputBytesOf(head, output), request.id());
  } else {
    stats.Finish(status, request.model_name(), 0);
    timer.Finish(status, 0, 0, request.id());
  }
  return FinishUnary(context, status, std::move(ticket));
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
KServeService::ModelStreamInfer(grpc::CallbackServerContext* context) {
  return OrderedStreamReactor<inference::ModelInferRequest>::Start(
      context, gate_,
      [this](grpc::CallbackServerContext* call,
             const inference::ModelInferRequest& request,
             AdmissionTicket* ticket, grpc::ByteBuffer* response_bytes) {
        return AnswerInStream(*call, request, ticket, response_bytes);
      });
}

absl::Status KServeService::AnswerInStream(
    const grpc::CallbackServerContext& context,
    const inference::ModelInferRequest& request, AdmissionTicket* ticket,
    grpc::ByteBuffer* response_bytes) const {
  RequestTimer timer(observer_, kStreamMethod);
  InferStatsTimer stats(statistics_);
  inference::ModelInferResponse head;
  SliceAllocator output;
  absl::Status status =
      Compute(context, request, &head, ticket, &stats, &output);
  absl::StatusOr<grpc::ByteBuffer> bytes =
      status.ok() ? InferResponseBytes(head, output) : status;
  status = bytes.status();
  if (status.ok()) {
    stats.Lap(InferPhase::kComputeOutput);
    stats.Finish(status, request.model_name(),
                 TimestepsAnswered(models_, head));
    timer.Finish(status, TimestepsAnswered(models_, head),
                 OutputBytesOf(head, output), request.id());
  } else {
    stats.Finish(status, request.model_name(), 0);
    timer.Finish(status, 0, 0, request.id());
  }
  if (absl::IsUnavailable(status)) return status;
  if (status.ok()) {
    // ModelStreamInferResponse{infer_response: the unary answer's bytes}.
    *response_bytes = WithMessageField(
        std::string(),
        inference::ModelStreamInferResponse::kInferResponseFieldNumber, *bytes);
    return absl::OkStatus();
  }
  // Only the request's identity, so that clients can match the error.
  inference::ModelStreamInferResponse response;
  inference::ModelInferResponse* answer = response.mutable_infer_response();
  answer->set_model_name(request.model_name());
  answer->set_model_version(request.model_version());
  answer->set_id(request.id());
  response.set_error_message(std::string(status.message()));
  ASSIGN_OR_RETURN(*response_bytes, SerializedBytes(response));
  return absl::OkStatus();
}

}  // namespace temb::kserve
