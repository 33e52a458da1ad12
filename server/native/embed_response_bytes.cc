#include "temb/native/embed_response_bytes.h"

#include <string>
#include <utility>

#include "temb/grpc/raw_messages.h"

namespace temb {

grpc::ByteBuffer EmbedResponseBytes(v1::EmbedResponse head,
                                    const grpc::Slice& data) {
  if (data.size() == 0) {  // proto3 leaves empty bytes out: nothing to frame
    grpc::Slice whole(head.SerializeAsString());
    return grpc::ByteBuffer(&whole, 1);
  }
  // EmbedResponse{..., embedding: Tensor{..., data}}: the Tensor's length
  // covers its other fields, the data field's header and the data.
  const std::string tensor_fields = head.embedding().SerializeAsString();
  head.clear_embedding();
  std::string prefix = head.SerializeAsString();
  AppendFieldHeader(
      v1::EmbedResponse::kEmbeddingFieldNumber,
      tensor_fields.size() +
          FieldHeaderSize(v1::Tensor::kDataFieldNumber, data.size()) +
          data.size(),
      &prefix);
  prefix += tensor_fields;
  return WithBytesField(std::move(prefix), v1::Tensor::kDataFieldNumber, data);
}

}  // namespace temb
