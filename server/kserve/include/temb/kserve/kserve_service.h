// The KServe v2 / Triton-compatible gRPC frontend: inference.
// GRPCInferenceService on top of the service core, one model per preset
// (see kserve_convert.h for the model signature and docs/kserve.md for the
// user's view).  Protocol only: every request goes through EmbedService,
// and every call through the CallGate first (authentication, admission).
// While the server drains, ServerReady and ModelReady answer false and the
// other calls are refused with UNAVAILABLE.
#ifndef TEMB_KSERVE_KSERVE_SERVICE_H_
#define TEMB_KSERVE_KSERVE_SERVICE_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "inference/grpc_service.grpc.pb.h"
#include "temb/core/embed_service.h"
#include "temb/core/model_control.h"
#include "temb/core/request_observer.h"
#include "temb/grpc/call_gate.h"
#include "temb/kserve/inference.h"
#include "temb/kserve/model_statistics.h"
#include "temb/kserve/shared_memory.h"

namespace temb::kserve {

namespace internal {
// gRPC's CallbackService chain with the ModelInfer and ModelStreamInfer
// links raw, spelled out because a raw stream method cannot sit on top of
// its typed link (the two differ only in return type).  Built from the last
// link up.
using Grpc = inference::GRPCInferenceService;
using RepositoryLinks = Grpc::WithCallbackMethod_RepositoryIndex<
    Grpc::WithCallbackMethod_RepositoryModelLoad<
        Grpc::WithCallbackMethod_RepositoryModelUnload<Grpc::Service>>>;
using CudaSharedMemoryLinks = Grpc::WithCallbackMethod_CudaSharedMemoryStatus<
    Grpc::WithCallbackMethod_CudaSharedMemoryRegister<
        Grpc::WithCallbackMethod_CudaSharedMemoryUnregister<RepositoryLinks>>>;
using SystemSharedMemoryLinks =
    Grpc::WithCallbackMethod_SystemSharedMemoryStatus<
        Grpc::WithCallbackMethod_SystemSharedMemoryRegister<
            Grpc::WithCallbackMethod_SystemSharedMemoryUnregister<
                CudaSharedMemoryLinks>>>;
using InferLinks = Grpc::WithRawCallbackMethod_ModelInfer<
    Grpc::WithRawCallbackMethod_ModelStreamInfer<
        Grpc::WithCallbackMethod_ModelConfig<
            Grpc::WithCallbackMethod_ModelStatistics<
                SystemSharedMemoryLinks>>>>;
using KServeServiceBase = Grpc::WithCallbackMethod_ServerLive<
    Grpc::WithCallbackMethod_ServerReady<Grpc::WithCallbackMethod_ModelReady<
        Grpc::WithCallbackMethod_ServerMetadata<
            Grpc::WithCallbackMethod_ModelMetadata<InferLinks>>>>>;
}  // namespace internal

// ModelInfer and ModelStreamInfer are registered as raw methods: their
// requests are parsed here and their responses are framed around the
// embedding bytes without copying them (server/grpc/raw_messages.h).  The
// other methods are typed.
class KServeService final : public internal::KServeServiceBase {
 public:
  // `core` and `observer` (may be null) must outlive the service.  Handlers
  // run on gRPC's callback threads and compute inline (the core is
  // thread-safe).  ModelInfer and each ModelStreamInfer request are reported
  // to `observer` (metrics, request log) and to `statistics`; tensors in
  // shared memory name regions of `shared_memory`.  Both are shared with the
  // REST frontend (null: the service keeps its own).
  KServeService(const EmbedService& core, const CallGate& gate,
                RequestObserver* observer,
                InferenceStatistics* statistics = nullptr,
                SharedMemoryRegistry* shared_memory = nullptr,
                const ConditioningService* conditioning = nullptr,
                ModelControl* control = nullptr);

  grpc::ServerUnaryReactor* ServerLive(
      grpc::CallbackServerContext* context,
      const inference::ServerLiveRequest* request,
      inference::ServerLiveResponse* response) override;
  grpc::ServerUnaryReactor* ServerReady(
      grpc::CallbackServerContext* context,
      const inference::ServerReadyRequest* request,
      inference::ServerReadyResponse* response) override;
  // Unknown models are simply not ready (as in Triton), not an error.
  grpc::ServerUnaryReactor* ModelReady(
      grpc::CallbackServerContext* context,
      const inference::ModelReadyRequest* request,
      inference::ModelReadyResponse* response) override;
  grpc::ServerUnaryReactor* ServerMetadata(
      grpc::CallbackServerContext* context,
      const inference::ServerMetadataRequest* request,
      inference::ServerMetadataResponse* response) override;
  // NOT_FOUND for an unknown model or version.
  grpc::ServerUnaryReactor* ModelMetadata(
      grpc::CallbackServerContext* context,
      const inference::ModelMetadataRequest* request,
      inference::ModelMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelConfig(
      grpc::CallbackServerContext* context,
      const inference::ModelConfigRequest* request,
      inference::ModelConfigResponse* response) override;
  // Triton's statistics extension; an empty name means every model.
  // NOT_FOUND for an unknown model or version.
  grpc::ServerUnaryReactor* ModelStatistics(
      grpc::CallbackServerContext* context,
      const inference::ModelStatisticsRequest* request,
      inference::ModelStatisticsResponse* response) override;
  // Triton's system shared memory extension (shared_memory.h).  Register:
  // ALREADY_EXISTS, INVALID_ARGUMENT, NOT_FOUND (no such object);
  // Unregister and Status: NOT_FOUND for an unknown region.
  grpc::ServerUnaryReactor* SystemSharedMemoryStatus(
      grpc::CallbackServerContext* context,
      const inference::SystemSharedMemoryStatusRequest* request,
      inference::SystemSharedMemoryStatusResponse* response) override;
  grpc::ServerUnaryReactor* SystemSharedMemoryRegister(
      grpc::CallbackServerContext* context,
      const inference::SystemSharedMemoryRegisterRequest* request,
      inference::SystemSharedMemoryRegisterResponse* response) override;
  grpc::ServerUnaryReactor* SystemSharedMemoryUnregister(
      grpc::CallbackServerContext* context,
      const inference::SystemSharedMemoryUnregisterRequest* request,
      inference::SystemSharedMemoryUnregisterResponse* response) override;
  // No CUDA shared memory: Register is INVALID_ARGUMENT, Status empty,
  // Unregister of every region ("") OK and of a name NOT_FOUND.
  grpc::ServerUnaryReactor* CudaSharedMemoryStatus(
      grpc::CallbackServerContext* context,
      const inference::CudaSharedMemoryStatusRequest* request,
      inference::CudaSharedMemoryStatusResponse* response) override;
  grpc::ServerUnaryReactor* CudaSharedMemoryRegister(
      grpc::CallbackServerContext* context,
      const inference::CudaSharedMemoryRegisterRequest* request,
      inference::CudaSharedMemoryRegisterResponse* response) override;
  grpc::ServerUnaryReactor* CudaSharedMemoryUnregister(
      grpc::CallbackServerContext* context,
      const inference::CudaSharedMemoryUnregisterRequest* request,
      inference::CudaSharedMemoryUnregisterResponse* response) override;
  // Triton's model repository extension over the conditioning models
  // (`control`, temb/core/model_control.h): the index; Load returns once
  // the folder loaded (or why not), Unload at once.  FAILED_PRECONDITION
  // without a repository or outside --model_control_mode=explicit,
  // INVALID_ARGUMENT for parameters (none are taken).
  grpc::ServerUnaryReactor* RepositoryIndex(
      grpc::CallbackServerContext* context,
      const inference::RepositoryIndexRequest* request,
      inference::RepositoryIndexResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryModelLoad(
      grpc::CallbackServerContext* context,
      const inference::RepositoryModelLoadRequest* request,
      inference::RepositoryModelLoadResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryModelUnload(
      grpc::CallbackServerContext* context,
      const inference::RepositoryModelUnloadRequest* request,
      inference::RepositoryModelUnloadResponse* response) override;
  // Codes as kserve::Infer; CANCELLED / DEADLINE_EXCEEDED, uncomputed, for a
  // call already abandoned by its client; INVALID_ARGUMENT for bytes that
  // are not a ModelInferRequest.
  grpc::ServerUnaryReactor* ModelInfer(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request_bytes,
      grpc::ByteBuffer* response_bytes) override;
  // Requests are answered one at a time, in order; a failed one gets
  // error_message (and its id) and the stream goes on, except UNAVAILABLE
  // (draining, failed backend), which ends the stream with that status.
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ModelStreamInfer(
      grpc::CallbackServerContext* context) override;

 private:
  // Authenticates, then NOT_FOUND for a named CUDA region (none is ever
  // registered), OK for none.
  absl::Status NoCudaRegion(const grpc::CallbackServerContext& context,
                            absl::string_view name) const;
  // One request of ModelStreamInfer (OrderedStreamReactor::Answer).
  absl::Status AnswerInStream(const grpc::CallbackServerContext& context,
                              const inference::ModelInferRequest& request,
                              AdmissionTicket* ticket,
                              grpc::ByteBuffer* response_bytes) const;

  // Admits (into `ticket`, held by the caller until the answer is sent) and
  // computes one request; the embedding goes to `output` when one is given
  // (see kserve::Infer).  `stats` gets the queue and compute_infer laps.
  absl::Status Compute(const grpc::CallbackServerContext& context,
                       const inference::ModelInferRequest& request,
                       inference::ModelInferResponse* response,
                       AdmissionTicket* ticket, InferStatsTimer* stats,
                       OutputAllocator* output = nullptr) const;

  const ServedModels models_;
  const CallGate& gate_;
  RequestObserver* const observer_;
  std::unique_ptr<InferenceStatistics> own_statistics_;  // when none given
  InferenceStatistics* const statistics_;
  std::unique_ptr<SharedMemoryRegistry> own_shared_memory_;  // likewise
  SharedMemoryRegistry* const shared_memory_;
  ModelControl* const control_;
};

}  // namespace temb::kserve

#endif  // TEMB_KSERVE_KSERVE_SERVICE_H_
