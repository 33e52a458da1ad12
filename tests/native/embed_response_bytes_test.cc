// The hand-framed EmbedResponse must parse to exactly the message a typed
// handler would have sent, and must carry the computed bytes without a copy.
#include "temb/native/embed_response_bytes.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "temb/grpc/raw_messages.h"

namespace temb {
namespace {

v1::EmbedResponse Head(const std::string& request_id) {
  v1::EmbedResponse head;
  head.set_request_id(request_id);
  head.set_backend("cpu");
  head.mutable_embedding()->add_shape(3);
  head.mutable_embedding()->add_shape(7);
  head.mutable_embedding()->set_dtype(v1::DTYPE_FP16);
  return head;
}

TEST(EmbedResponseBytesTest, ParsesToTheTypedMessageWithoutCopyingTheData) {
  // Sizes around the varint boundaries of the two length prefixes.
  for (size_t size : {size_t{0}, size_t{1}, size_t{127}, size_t{128},
                      size_t{16383}, size_t{16384}, size_t{5} << 20}) {
    for (const std::string& request_id : {std::string(), std::string("r-1")}) {
      SliceAllocator allocator;
      const absl::Span<uint8_t> memory = allocator.Allocate(size);
      ASSERT_EQ(memory.size(), size);
      for (size_t i = 0; i < size; ++i) memory[i] = static_cast<uint8_t>(i * 7);

      const grpc::ByteBuffer bytes =
          EmbedResponseBytes(Head(request_id), allocator.slice());

      std::vector<grpc::Slice> slices;
      ASSERT_TRUE(bytes.Dump(&slices).ok());
      std::string wire;
      for (const grpc::Slice& slice : slices) {
        wire.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
      }
      v1::EmbedResponse parsed;
      ASSERT_TRUE(parsed.ParseFromString(wire)) << size;

      v1::EmbedResponse expected = Head(request_id);
      expected.mutable_embedding()->set_data(
          std::string(reinterpret_cast<const char*>(memory.data()), size));
      EXPECT_EQ(parsed.SerializeAsString(), expected.SerializeAsString())
          << "size " << size << " request_id '" << request_id << "'";
      EXPECT_EQ(wire.size(), expected.ByteSizeLong());

      if (size > 0) {  // the last slice is the computed memory itself
        ASSERT_EQ(slices.size(), 2u);
        EXPECT_EQ(slices[1].begin(), memory.data());
      }
    }
  }
}

}  // namespace
}  // namespace temb
