// The wire form of an EmbedResponse, framed around the embedding bytes
// instead of copying them.
//
// A typed handler would move the bytes into the message and protobuf would
// then copy them into gRPC's buffers: for a 5 MiB response that copy (and the
// page faults of its fresh buffer) is a large share of the server's work.
// Here every field but embedding.data is serialised into one small slice, and
// the embedding is a second slice: the memory the backend computed into.  Fields may come
// in any order on the wire, and the bytes are identical to what
// SerializeAsString() gives for the same message apart from that order.
#ifndef TEMB_SERVER_NATIVE_EMBED_RESPONSE_BYTES_H_
#define TEMB_SERVER_NATIVE_EMBED_RESPONSE_BYTES_H_

#include <cstdint>

#include "absl/types/span.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "server/core/embed_service.h"
#include "temb/v1/temb.pb.h"

namespace temb {

// Gives the core gRPC slice memory to compute an embedding into.
class SliceAllocator final : public OutputAllocator {
 public:
  absl::Span<uint8_t> Allocate(size_t bytes) override;
  const grpc::Slice& slice() const { return slice_; }

 private:
  grpc::Slice slice_;
};

// `head` must have an empty embedding.data; `data` becomes its value and is
// shared (reference counted), not copied.
grpc::ByteBuffer EmbedResponseBytes(const v1::EmbedResponse& head,
                                    const grpc::Slice& data);

}  // namespace temb

#endif  // TEMB_SERVER_NATIVE_EMBED_RESPONSE_BYTES_H_
