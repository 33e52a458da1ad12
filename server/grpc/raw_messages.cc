#include "temb/grpc/raw_messages.h"

#include <vector>

#include "google/protobuf/io/coded_stream.h"
#include "grpc/slice.h"

namespace temb {
namespace {

using google::protobuf::io::CodedOutputStream;

uint32_t LengthDelimitedTag(int field_number) {
  return static_cast<uint32_t>(field_number) << 3 | 2;
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

void SliceAllocator::Adopt(std::unique_ptr<HostBuffer> buffer) {
  const absl::Span<uint8_t> bytes = buffer->bytes();
  // gRPC calls the destroyer once the last reference to the slice is gone
  // (the response has been written or the call abandoned).
  grpc_slice memory = grpc_slice_new_with_user_data(
      bytes.data(), bytes.size(),
      [](void* lent) { delete static_cast<HostBuffer*>(lent); },
      buffer.release());
  slice_ = grpc::Slice(memory, grpc::Slice::STEAL_REF);
}

void AppendFieldHeader(int field_number, uint64_t length, std::string* out) {
  uint8_t buffer[2 * 10];  // two varints of at most 10 bytes
  uint8_t* end = CodedOutputStream::WriteVarint32ToArray(
      LengthDelimitedTag(field_number), buffer);
  end = CodedOutputStream::WriteVarint64ToArray(length, end);
  out->append(reinterpret_cast<const char*>(buffer), end - buffer);
}

size_t FieldHeaderSize(int field_number, uint64_t length) {
  return CodedOutputStream::VarintSize32(LengthDelimitedTag(field_number)) +
         CodedOutputStream::VarintSize64(length);
}

grpc::ByteBuffer WithBytesField(std::string prefix, int field_number,
                                const grpc::Slice& payload) {
  AppendFieldHeader(field_number, payload.size(), &prefix);
  const grpc::Slice slices[2] = {grpc::Slice(prefix), payload};
  return grpc::ByteBuffer(slices, 2);
}

grpc::ByteBuffer WithMessageField(std::string prefix, int field_number,
                                  const grpc::ByteBuffer& inner) {
  AppendFieldHeader(field_number, inner.Length(), &prefix);
  std::vector<grpc::Slice> slices;
  // Dump shares the slices (it fails only on an invalid buffer, which then
  // has no slices to share).
  (void)inner.Dump(&slices);
  slices.insert(slices.begin(), grpc::Slice(prefix));
  return grpc::ByteBuffer(slices.data(), slices.size());
}

}  // namespace temb
