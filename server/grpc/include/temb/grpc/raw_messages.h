// Helpers for methods registered as raw (ByteBuffer) methods, so that a large
// output is sent from the memory it was computed in.
//
// A typed handler would move the output into the response message, and
// protobuf would then copy it into gRPC's buffers: for a response of several
// MiB that copy, and the zero fill of the buffer before it, are a large share
// of the server's work.  Instead the core computes into a gRPC slice
// (SliceAllocator), every other field is serialised into a small prefix, and
// the slice follows as the last field (WithBytesField).  Fields may come in
// any order on the wire, so the result parses to the same message.
#ifndef TEMB_GRPC_RAW_MESSAGES_H_
#define TEMB_GRPC_RAW_MESSAGES_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/slice.h"
#include "temb/core/embed_service.h"

namespace temb {

// Gives the core gRPC slice memory to compute an embedding into, or wraps
// the memory the backend lent in a slice that gives it back once sent.
class SliceAllocator final : public OutputAllocator {
 public:
  absl::Span<uint8_t> Allocate(size_t bytes) override;
  void Adopt(std::unique_ptr<HostBuffer> buffer) override;
  const grpc::Slice& slice() const { return slice_; }

 private:
  grpc::Slice slice_;
};

// The tag and length of a length-delimited field (wire type 2), appended to
// `out`; FieldHeaderSize is their size.
void AppendFieldHeader(int field_number, uint64_t length, std::string* out);
size_t FieldHeaderSize(int field_number, uint64_t length);

// `prefix` (serialised fields of a message) followed by field `field_number`
// holding `payload`, which the buffer shares rather than copies.
grpc::ByteBuffer WithBytesField(std::string prefix, int field_number,
                                const grpc::Slice& payload);

// `prefix` followed by field `field_number` holding the message `inner`
// (already serialised), whose slices the buffer shares: how an answer framed
// by WithBytesField goes inside a stream's response message.
grpc::ByteBuffer WithMessageField(std::string prefix, int field_number,
                                  const grpc::ByteBuffer& inner);

// `message` serialised straight into gRPC slices.  INTERNAL if it cannot be.
template <typename Message>
absl::StatusOr<grpc::ByteBuffer> SerializedBytes(const Message& message) {
  grpc::ByteBuffer bytes;
  bool own_buffer = false;
  const grpc::Status status = grpc::SerializationTraits<Message>::Serialize(
      message, &bytes, &own_buffer);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("cannot serialise a ",
                                            message.GetTypeName(), ": ",
                                            status.error_message()));
  }
  return bytes;
}

// Parses a raw request.  INVALID_ARGUMENT when the bytes are not a `Message`.
template <typename Message>
absl::Status ParseRequest(const grpc::ByteBuffer& bytes, Message* message) {
  grpc::ByteBuffer copy(bytes);  // shares the slices; parsing consumes them
  if (!grpc::SerializationTraits<Message>::Deserialize(&copy, message).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request is not a valid ", message->GetTypeName(), " message"));
  }
  return absl::OkStatus();
}

}  // namespace temb

#endif  // TEMB_GRPC_RAW_MESSAGES_H_
