#include "server/native/embed_response_bytes.h"

#include <cstdint>
#include <utility>

#include <string>

#include "google/protobuf/io/coded_stream.h"
#include "grpc/slice.h"

namespace temb {
namespace {

using google::protobuf::io::CodedOutputStream;

// The tag of a length-delimited field (wire type 2), then the length.
void AppendLengthDelimited(int field_number, uint64_t length, std::string* out) {
  uint8_t buffer[2 * 10];  // two varints of at most 10 bytes
  uint8_t* end = CodedOutputStream::WriteVarint32ToArray(
      static_cast<uint32_t>(field_number) << 3 | 2, buffer);
  end = CodedOutputStream::WriteVarint64ToArray(length, end);
  out->append(reinterpret_cast<const char*>(buffer), end - buffer);
}

}  // namespace

absl::Span<uint8_t> SliceAllocator::Allocate(size_t bytes) {
  // Uninitialised heap memory: grpc_slice_malloc would keep a few bytes
  // inline in the slice object itself, where a pointer does not stay valid.
  grpc_slice memory = grpc_slice_malloc_large(bytes);
  uint8_t* start = GRPC_SLICE_START_PTR(memory);
  slice_ = grpc::Slice(memory, grpc::Slice::STEAL_REF);
  return absl::MakeSpan(start, bytes);
}

grpc::ByteBuffer EmbedResponseBytes(const v1::EmbedResponse& head,
                                    const grpc::Slice& data) {
  if (data.size() == 0) {  // proto3 leaves empty bytes out: nothing to frame
    grpc::Slice whole(head.SerializeAsString());
    return grpc::ByteBuffer(&whole, 1);
  }
  // EmbedResponse{..., embedding: Tensor{..., data}}: the Tensor's length
  // covers its other fields, the data field's tag and length, and the data.
  const std::string tensor_fields = head.embedding().SerializeAsString();
  std::string data_prefix;
  AppendLengthDelimited(v1::Tensor::kDataFieldNumber, data.size(), &data_prefix);

  v1::EmbedResponse outer = head;  // small: ids and names
  outer.clear_embedding();
  std::string header = outer.SerializeAsString();
  AppendLengthDelimited(
      v1::EmbedResponse::kEmbeddingFieldNumber,
      tensor_fields.size() + data_prefix.size() + data.size(), &header);
  header += tensor_fields;
  header += data_prefix;

  const grpc::Slice slices[2] = {grpc::Slice(header), data};
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace temb
