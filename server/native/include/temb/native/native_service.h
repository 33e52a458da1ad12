// The native temb.v1.EmbeddingService frontend: protocol only.  Each call
// converts the proto to core types, runs EmbedService (or, for Condition,
// ConditioningService) and converts back; the numbers and rules live in the
// core.
#ifndef TEMB_NATIVE_NATIVE_SERVICE_H_
#define TEMB_NATIVE_NATIVE_SERVICE_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "temb/core/conditioning_service.h"
#include "temb/core/embed_service.h"
#include "temb/core/request_observer.h"
#include "temb/grpc/call_gate.h"
#include "temb/v1/temb.grpc.pb.h"

namespace temb {

// Embed is registered as a raw method: its request is parsed here and its
// response is framed around the embedding bytes without copying them
// (embed_response_bytes.h).  GetServerInfo is raw too, so that bytes that
// are not a request get INVALID_ARGUMENT as on Embed (a typed method answers
// them UNIMPLEMENTED with no message).  EmbedStream is raw too: each answer
// is framed like Embed's, inside its EmbedStreamResponse.  (All three are
// raw, so the chain starts from the plain Service: a raw stream method
// cannot sit on top of its typed link.)  Condition and ConditionStream are
// raw for the same two reasons: garbage gets INVALID_ARGUMENT, and the
// stream shares OrderedStreamReactor with EmbedStream.
class NativeService final
    : public v1::EmbeddingService::WithRawCallbackMethod_GetServerInfo<
          v1::EmbeddingService::WithRawCallbackMethod_Embed<
              v1::EmbeddingService::WithRawCallbackMethod_EmbedStream<
                  v1::EmbeddingService::WithRawCallbackMethod_Condition<
                      v1::EmbeddingService::
                          WithRawCallbackMethod_ConditionStream<
                              v1::EmbeddingService::Service>>>>> {
 public:
  struct Options {
    // The server's gRPC message limits, reported in ServerInfo.limits.
    int max_message_bytes = 0;
    int max_request_bytes = 0;
  };

  // `core`, `conditioning` (null: no conditioning models, every Condition
  // is NOT_FOUND), `gate` and `observer` (may be null) must outlive the
  // service.  Every call passes `gate` first (see call_gate.h).
  NativeService(const EmbedService& core,
                const ConditioningService* conditioning, const CallGate& gate,
                RequestObserver* observer, Options options);

  // A call whose deadline has passed or that was cancelled before the
  // computation starts ends with DEADLINE_EXCEEDED / CANCELLED, uncomputed.
  // UNAUTHENTICATED, UNAVAILABLE (draining) and RESOURCE_EXHAUSTED
  // (overload) come from the gate, before any work; bytes that are not an
  // EmbedRequest get INVALID_ARGUMENT.
  grpc::ServerUnaryReactor* Embed(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request_bytes,
                                  grpc::ByteBuffer* response_bytes) override;

  // One response per request, in order; one request is processed at a time.
  // A failed request yields an `error` entry and the stream goes on, except
  // UNAVAILABLE (the server drains or its backend failed): the stream then
  // ends with that status, so that the client reconnects elsewhere.  The
  // call ends OK when the client half-closes.
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* EmbedStream(
      grpc::CallbackServerContext* context) override;

  // A conditioning model's outputs (ConditioningService::Serve), through
  // the gate like Embed: authentication, then admission with the request's
  // bytes, then the answer's bytes and working memory reserved by the core
  // before it computes.
  grpc::ServerUnaryReactor* Condition(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request_bytes,
      grpc::ByteBuffer* response_bytes) override;

  // As EmbedStream, for ConditionRequests.
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ConditionStream(
      grpc::CallbackServerContext* context) override;

  // The version, limits and presets fixed at construction, and the
  // conditioning models' states and the row cache's counters as they are
  // at the call.
  grpc::ServerUnaryReactor* GetServerInfo(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request_bytes,
      grpc::ByteBuffer* response_bytes) override;

 private:
  // One request of EmbedStream (OrderedStreamReactor::Answer).
  absl::Status AnswerInStream(grpc::CallbackServerContext* context,
                              const v1::EmbedRequest& request,
                              AdmissionTicket* ticket,
                              grpc::ByteBuffer* response_bytes) const;

  // What one request computed: the response (for a single-part request
  // everything but embedding.data, which is in the allocator's memory) and
  // the bytes of all its embeddings.
  struct Answer {
    v1::EmbedResponse response;
    int64_t output_bytes = 0;
  };

  // Admits one request (into `ticket`, which the caller holds until the
  // answer is sent) and computes it; a single-part request's embedding goes
  // into `output`.
  absl::StatusOr<Answer> Compute(grpc::CallbackServerContext* context,
                                 const v1::EmbedRequest& request,
                                 AdmissionTicket* ticket,
                                 OutputAllocator* output) const;

  // Admits and serves one ConditionRequest.
  absl::StatusOr<v1::ConditionResponse> ComputeCondition(
      grpc::CallbackServerContext* context, const v1::ConditionRequest& request,
      AdmissionTicket* ticket) const;
  absl::Status AnswerConditionInStream(grpc::CallbackServerContext* context,
                                       const v1::ConditionRequest& request,
                                       AdmissionTicket* ticket,
                                       grpc::ByteBuffer* response_bytes) const;

  const EmbedService& core_;
  const ConditioningService* const conditioning_;
  const CallGate& gate_;
  RequestObserver* const observer_;
  v1::ServerInfo info_;  // immutable after construction
};

}  // namespace temb

#endif  // TEMB_NATIVE_NATIVE_SERVICE_H_
