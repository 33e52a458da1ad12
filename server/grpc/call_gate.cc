#include "temb/grpc/call_gate.h"

#include <chrono>
#include <utility>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "temb/grpc/status.h"

namespace temb {
namespace {

// A reactor owning the call's admission ticket until the call is done.
class TicketReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit TicketReactor(AdmissionTicket ticket) : ticket_(std::move(ticket)) {}
  void OnDone() override { delete this; }

 private:
  AdmissionTicket ticket_;
};

absl::Time Deadline(const grpc::CallbackServerContext& context) {
  const auto deadline = context.deadline();
  // gRPC reports "no deadline" as the largest time point, which
  // absl::FromChrono cannot represent.
  if (deadline == std::chrono::system_clock::time_point::max()) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

}  // namespace

CallGate::CallGate(AdmissionController* admission, const TokenVerifier* tokens,
                   RequestObserver* observer)
    : admission_(admission), tokens_(tokens), observer_(observer) {}

absl::Status CallGate::Authenticate(
    const grpc::CallbackServerContext& context) const {
  // A call its client already gave up is a cancellation, not a bad request
  // or a token failure, and is answered and counted as one.
  if (context.IsCancelled()) {
    return absl::CancelledError(
        "the client cancelled the call before its request was read");
  }
  if (tokens_ == nullptr) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  const auto header = metadata.find("authorization");
  const absl::Status status = tokens_->Verify(
      header == metadata.end()
          ? absl::string_view()
          : absl::string_view(header->second.data(), header->second.size()));
  if (!status.ok() && observer_ != nullptr) {
    observer_->OnRejected("unauthenticated");
  }
  return status;
}

absl::Status CallGate::Enter(const grpc::CallbackServerContext& context) const {
  if (absl::Status status = Authenticate(context); !status.ok()) return status;
  return admission_->CheckServing();
}

absl::StatusOr<AdmissionTicket> CallGate::OpenStream(
    const grpc::CallbackServerContext& context) const {
  if (absl::Status status = Authenticate(context); !status.ok()) return status;
  return admission_->OpenStream();
}

absl::StatusOr<AdmissionTicket> CallGate::Admit(
    const grpc::CallbackServerContext& context, int64_t request_bytes) const {
  absl::StatusOr<AdmissionTicket> ticket =
      admission_->Admit(request_bytes, Deadline(context));
  if (!ticket.ok()) return ticket;
  // A client that gave up while the call waited to be admitted gets nothing
  // computed for it.
  if (context.IsCancelled()) {
    return absl::CancelledError("the call was cancelled before computing");
  }
  if (context.deadline() <= std::chrono::system_clock::now()) {
    // Worded as gRPC words its own expiry, so that a client sees one message
    // whichever side noticed first.
    return absl::DeadlineExceededError(
        "Deadline Exceeded before computing; nothing was computed");
  }
  return ticket;
}

absl::Status CheckRequestArrived(const grpc::ByteBuffer& request) {
  if (request.Valid()) return absl::OkStatus();
  return absl::CancelledError(
      "the call ended before its request message arrived");
}

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                      const absl::Status& status,
                                      AdmissionTicket ticket) {
  ticket.MarkAnswered();  // computing is over; the bytes stay until sent
  grpc::ServerUnaryReactor* reactor =
      ticket.empty() ? context->DefaultReactor()
                     : new TicketReactor(std::move(ticket));
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace temb
