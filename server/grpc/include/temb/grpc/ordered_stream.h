// The bidirectional stream both protocols serve (temb.v1 EmbedStream,
// KServe ModelStreamInfer): requests answered one at a time, in order.
//
// Exactly one read or write is outstanding at any time: answers keep the
// requests' order, a slow reader holds back only its own stream, and
// Finish() is reached from one place each.
//
// The stream is registered as a raw method (ByteBuffer in, ByteBuffer out)
// for the same reason as the unary methods (raw_messages.h): an answer is
// framed around the memory its embedding was computed in, never copied into
// a typed response.  The reactor parses each request itself, which also
// tells garbage from a half-close: gRPC reports only the latter (and a
// cancellation) as OnReadDone(false).
//
// Admission: a request holds an in-flight slot while it is computed; once
// its answer is handed to gRPC the slot is freed (AdmissionTicket::
// MarkAnswered) and only its bytes stay counted, in max_queued_bytes, until
// the answer is written.  A client that never reads therefore holds bytes,
// never a slot: streams that stopped reading cannot lock other callers out.
//
// A message that is not a valid Request ends the stream with
// INVALID_ARGUMENT (after the answers to the requests before it); a
// half-close ends it with OK.
#ifndef TEMB_GRPC_ORDERED_STREAM_H_
#define TEMB_GRPC_ORDERED_STREAM_H_

#include <cstdint>
#include <functional>
#include <new>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "temb/core/admission.h"
#include "temb/grpc/call_gate.h"
#include "temb/grpc/raw_messages.h"
#include "temb/grpc/status.h"

namespace temb {

template <typename Request>
class OrderedStreamReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Answers one request: sets `response` to the serialised answer or to an
  // in-band error for this request and returns OK, or returns the error
  // that ends the whole stream (UNAVAILABLE: the server stopped serving).
  // `ticket` receives the request's admission, held until its answer is
  // written.
  using Answer = std::function<absl::Status(
      grpc::CallbackServerContext* context, const Request& request,
      AdmissionTicket* ticket, grpc::ByteBuffer* response)>;

  // Opens the stream through `gate` (authentication, drain) and starts
  // reading.  The reactor deletes itself when gRPC is done with it.
  static OrderedStreamReactor* Start(grpc::CallbackServerContext* context,
                                     const CallGate& gate, Answer answer) {
    return new OrderedStreamReactor(context, gate, std::move(answer));
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // Half-close; after a cancellation (or a message over the size limit,
      // which gRPC fails itself) the status is ignored.
      Finish(grpc::Status::OK);
      return;
    }
    ++requests_;
    Request request;
    if (!ParseRequest(request_bytes_, &request).ok()) {
      Finish(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("message ", requests_, " of the stream is not a valid ",
                       request.GetTypeName(), "; the stream ends here (the ",
                       requests_ - 1, " before it were answered)")));
      return;
    }
    request_bytes_.Clear();
    response_bytes_.Clear();
    absl::Status status;
    try {
      status = answer_(context_, request, &ticket_, &response_bytes_);
    } catch (const std::bad_alloc&) {
      status = absl::ResourceExhaustedError(
          absl::StrCat("the server ran out of memory answering message ",
                       requests_, " of the stream"));
    }
    // Computing is over: the in-flight slot goes now, the bytes stay held
    // until the answer is written (OnWriteDone) or the stream ends.
    ticket_.MarkAnswered();
    if (!status.ok()) {
      Finish(ToGrpcStatus(status));
      return;
    }
    StartWrite(&response_bytes_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                          "the stream closed before the answer was sent"));
      return;
    }
    response_bytes_.Clear();      // lets go of the embedding's memory
    ticket_ = AdmissionTicket();  // the answer is out
    StartRead(&request_bytes_);
  }

  void OnDone() override { delete this; }

 private:
  OrderedStreamReactor(grpc::CallbackServerContext* context,
                       const CallGate& gate, Answer answer)
      : context_(context), answer_(std::move(answer)) {
    absl::StatusOr<AdmissionTicket> open = gate.OpenStream(*context);
    if (!open.ok()) {
      Finish(ToGrpcStatus(open.status()));
      return;
    }
    open_ = *std::move(open);
    StartRead(&request_bytes_);
  }

  grpc::CallbackServerContext* const context_;
  const Answer answer_;
  grpc::ByteBuffer request_bytes_;
  grpc::ByteBuffer response_bytes_;
  int64_t requests_ = 0;    // messages received
  AdmissionTicket ticket_;  // of the request being answered
  AdmissionTicket open_;    // held until the stream ends, for the drain
};

}  // namespace temb

#endif  // TEMB_GRPC_ORDERED_STREAM_H_
