// The bidirectional stream both protocols serve (temb.v1 EmbedStream,
// KServe ModelStreamInfer): requests answered one at a time, in order.
//
// Exactly one read or write is outstanding at any time: answers keep the
// requests' order, a slow reader holds back only its own stream, and
// Finish() is reached from one place each.
//
// Admission: a request holds an in-flight slot while it is computed; once
// its answer is handed to gRPC the slot is freed (AdmissionTicket::
// MarkAnswered) and only its bytes stay counted, in max_queued_bytes, until
// the answer is written.  A client that never reads therefore holds bytes,
// never a slot: streams that stopped reading cannot lock other callers out.
//
// A message that is not a valid Request ends the stream with
// INVALID_ARGUMENT (after the answers to the requests before it); a
// half-close ends it with OK.  gRPC 1.51's typed reactor reports both as
// OnReadDone(false), so the reactor tells them apart with a mark in the
// request's unknown fields, set before every read: protobuf clears the
// message before parsing, so a mark that is gone means gRPC received a
// message and failed to parse it.
#ifndef TEMB_GRPC_ORDERED_STREAM_H_
#define TEMB_GRPC_ORDERED_STREAM_H_

#include <cstdint>
#include <functional>
#include <new>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/message.h"
#include "google/protobuf/unknown_field_set.h"
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
    if (!ok) {
      if (!Marked()) {
        this->Finish(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("message ", requests_ + 1,
                         " of the stream is not a valid ",
                         request_.GetTypeName(), "; the stream ends here (the ",
                         requests_, " before it were answered)")));
        return;
      }
      // Half-close; after a cancellation (or a message over the size limit,
      // which gRPC fails itself) the status is ignored.
      this->Finish(grpc::Status::OK);
      return;
    }
    ++requests_;
    response_.Clear();
    absl::Status status;
    try {
      status = answer_(context_, request_, &ticket_, &response_);
    } catch (const std::bad_alloc&) {
      status = absl::ResourceExhaustedError(
          absl::StrCat("the server ran out of memory answering message ",
                       requests_, " of the stream"));
    }
    // Computing is over: the in-flight slot goes now, the bytes stay held
    // until the answer is written (OnWriteDone) or the stream ends.
    ticket_.MarkAnswered();
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
    StartMarkedRead();
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
    StartMarkedRead();
  }

  // An unknown field no request message defines (the largest field number).
  static constexpr int kMarkField = 536870911;

  void StartMarkedRead() {
    request_.Clear();
    request_.GetReflection()->MutableUnknownFields(&request_)->AddVarint(
        kMarkField, 1);
    this->StartRead(&request_);
  }

  // True while the mark set before the read is still there: nothing was
  // parsed into request_.
  bool Marked() const {
    const google::protobuf::UnknownFieldSet& fields =
        request_.GetReflection()->GetUnknownFields(request_);
    return fields.field_count() == 1 && fields.field(0).number() == kMarkField;
  }

  grpc::CallbackServerContext* const context_;
  const Answer answer_;
  Request request_;
  Response response_;
  int64_t requests_ = 0;    // messages received
  AdmissionTicket ticket_;  // of the request being answered
  AdmissionTicket open_;    // held until the stream ends, for the drain
};

}  // namespace temb

#endif  // TEMB_GRPC_ORDERED_STREAM_H_
