// CallGate: what every temb.v1 and inference call passes before any work,
// for both frontends: bearer-token authentication (when configured), then
// the core's admission control (draining, failed backend, expired deadline,
// max_inflight, max_queued_bytes).  grpc.health.v1 and reflection never see
// it, so probes and tooling work without a token and during a drain.
//
// Why handlers call it rather than an interceptor or an AuthMetadataProcessor:
// in gRPC 1.51 a server interceptor cannot end a call with a status (Hijack
// is client-only), and an AuthMetadataProcessor runs only on secure
// credentials, so a plaintext server (e.g. behind a TLS-terminating proxy)
// would skip it.  A call every handler makes first works on both, and
// tests/reliability walks every method of both services to prove none skips
// it.
#ifndef TEMB_GRPC_CALL_GATE_H_
#define TEMB_GRPC_CALL_GATE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "temb/core/admission.h"
#include "temb/core/request_observer.h"
#include "temb/core/token_auth.h"

namespace temb {

class CallGate {
 public:
  // `tokens` null: no authentication.  All three must outlive the gate;
  // `observer` (may be null) hears OnRejected("unauthenticated").
  CallGate(AdmissionController* admission, const TokenVerifier* tokens,
           RequestObserver* observer);

  // CANCELLED when the client already cancelled the call; else
  // UNAUTHENTICATED without an accepted bearer token.  Every unary handler
  // calls it first (Enter does); probes (KServe
  // ServerLive/ServerReady/ModelReady) call it alone, as they answer while
  // draining.
  absl::Status Authenticate(const grpc::CallbackServerContext& context) const;

  // Authenticate, then UNAVAILABLE unless serving.  For calls that compute
  // nothing (metadata).
  absl::Status Enter(const grpc::CallbackServerContext& context) const;

  // Enter, for opening a stream: the ticket is held for as long as the
  // stream is open (AdmissionController::OpenStream).
  absl::StatusOr<AdmissionTicket> OpenStream(
      const grpc::CallbackServerContext& context) const;

  // Admission of one computation carrying `request_bytes` (authentication is
  // separate: a stream authenticates once, when it opens).  Codes as
  // AdmissionController::Admit, then CANCELLED / DEADLINE_EXCEEDED when the
  // client gave up meanwhile: an OK ticket means "compute now".
  absl::StatusOr<AdmissionTicket> Admit(
      const grpc::CallbackServerContext& context, int64_t request_bytes) const;

  bool serving() const { return admission_->serving(); }

 private:
  AdmissionController* const admission_;
  const TokenVerifier* const tokens_;
  RequestObserver* const observer_;
};

// For raw unary handlers, before parsing: CANCELLED when gRPC handed the
// handler no message at all, which is what a call reset by its client
// before its message arrived looks like (the handler still runs, and at that
// moment context.IsCancelled() is not yet true).  Counting those as
// INVALID_ARGUMENT made a burst of resets look like a burst of bad
// requests.  A client that sent an empty message gets a valid, empty buffer.
absl::Status CheckRequestArrived(const grpc::ByteBuffer& request);

// Finishes a unary call with `status`.  The ticket's in-flight slot is freed
// now (the answer is computed); its bytes only when gRPC is done with the
// call, after the response was sent, so that max_queued_bytes counts
// responses waiting to be written.
grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                      const absl::Status& status,
                                      AdmissionTicket ticket = {});

}  // namespace temb

#endif  // TEMB_GRPC_CALL_GATE_H_
