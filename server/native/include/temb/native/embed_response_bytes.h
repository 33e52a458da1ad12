// The wire form of an EmbedResponse whose embedding bytes were computed into
// a gRPC slice: framed around them, not copied (see
// server/grpc/raw_messages.h).
#ifndef TEMB_NATIVE_EMBED_RESPONSE_BYTES_H_
#define TEMB_NATIVE_EMBED_RESPONSE_BYTES_H_

#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "temb/v1/temb.pb.h"

namespace temb {

// `head` must have an empty embedding.data; `data` becomes its value and is
// shared (reference counted), not copied.
// Taken by value: its embedding is cleared to serialise the other fields.
grpc::ByteBuffer EmbedResponseBytes(v1::EmbedResponse head,
                                    const grpc::Slice& data);

}  // namespace temb

#endif  // TEMB_NATIVE_EMBED_RESPONSE_BYTES_H_
