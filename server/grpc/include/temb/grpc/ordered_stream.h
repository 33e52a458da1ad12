// The bidirectional stream both protocols serve (temb.v1 EmbedStream,
// KServe ModelStreamInfer): requests answered one at a time, in order.
//
// Exactly one read or write is outstanding at any time: answers keep the
// requests' order, a slow reader holds back only its own stream, and
// Finish() is reached from one place each.
#ifndef TEMB_GRPC_ORDERED_STREAM_H_
#define TEMB_GRPC_ORDERED_STREAM_H_

#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_callback.h"
#include "temb/core/admission.h"
#include "temb/grpc/call_gate.h"
#include "temb/grpc/status.h"

namespace temb {

template <typename Request, typename Response>
class OrderedStreamReactor final
    : public grpc::ServerBidiReactor<Request, Response> {
 public:
  // Answers one request: fills `response` with the answer or with an in-band
  // error for this request and returns OK, or returns the error that ends
  // the whole stream (UNAVAILABLE: the server stopped serving).  `ticket`
  // receives the request's admission, held until its answer is written.
  using Answer = std::function<absl::Status(
      grpc::CallbackServerContext* context, const Request& request,
      AdmissionTicket* ticket, Response* response)>;

  // Opens the stream through `gate` (authentication, drain) and starts
  // reading.  The reactor deletes itself when gRPC is done with it.
  static OrderedStreamReactor* Start(grpc::CallbackServerContext* context,
                                     const CallGate& gate, Answer answer) {
    return new OrderedStreamReactor(context, gate, std::move(answer));
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // half-close; after a cancellation the status is ignored
      this->Finish(grpc::Status::OK);
      return;
    }
    response_.Clear();
    const absl::Status status =
        answer_(context_, request_, &ticket_, &response_);
    if (!status.ok()) {
      this->Finish(ToGrpcStatus(status));
      return;
    }
    this->StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      this->Finish(
          grpc::Status(grpc::StatusCode::CANCELLED,
                       "the stream closed before the answer was sent"));
      return;
    }
    ticket_ = AdmissionTicket();  // the answer is out
    request_.Clear();
    this->StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  OrderedStreamReactor(grpc::CallbackServerContext* context,
                       const CallGate& gate, Answer answer)
      : context_(context), answer_(std::move(answer)) {
    absl::StatusOr<AdmissionTicket> open = gate.OpenStream(*context);
    if (!open.ok()) {
      this->Finish(ToGrpcStatus(open.status()));
      return;
    }
    open_ = *std::move(open);
    this->StartRead(&request_);
  }

  grpc::CallbackServerContext* const context_;
  const Answer answer_;
  Request request_;
  Response response_;
  AdmissionTicket ticket_;  // of the request being answered
  AdmissionTicket open_;    // held until the stream ends, for the drain
};

}  // namespace temb

#endif  // TEMB_GRPC_ORDERED_STREAM_H_
