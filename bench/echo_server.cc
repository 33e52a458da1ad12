// temb-echo-server: the transport baseline of the benchmark suite.
//
// It serves temb.v1 Embed and EmbedStream on the same gRPC stack as
// temb-server, so that `temb bench` drives both unchanged, but computes
// nothing: every answer is a zero tensor of the size the real server would
// send (rows x dim x dtype size).  Responses are serialised once per shape and
// kept as a reference-counted slice, and each call replies with a ByteBuffer
// that points at it, so the measured cost is gRPC's own (HTTP/2 framing, the
// kernel's socket copies, the client's parse), with no copy of the payload in
// the handler.  The ratio temb-server / echo is then the cost of the service
// itself.
//
// Dim comes from spec.dim, else --dim (the preset's width: the echo knows no
// presets); dtype from the request, fp32 when unspecified.
//
//   temb-echo-server --address=127.0.0.1:0 --port_file=/tmp/port

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/byte_buffer.h"
#include "temb/v1/temb.grpc.pb.h"

ABSL_FLAG(std::string, address, "127.0.0.1:0", "HOST:PORT; port 0 picks one");
ABSL_FLAG(std::string, port_file, "", "write the bound port here");
ABSL_FLAG(int, dim, 320, "width when the request names a preset, not a dim");
ABSL_FLAG(int, max_message_bytes, (256 << 20) + (1 << 20),
          "gRPC send/receive limit");

namespace temb {
namespace {

int DTypeBytes(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP16:
    case v1::DTYPE_BF16:
      return 2;
    case v1::DTYPE_FP64:
      return 8;
    default:
      return 4;
  }
}

// A raw stream method cannot sit on top of its typed link (they differ only
// in return type), so the chain starts from the plain Service.
using Base = v1::EmbeddingService::WithRawCallbackMethod_Embed<
    v1::EmbeddingService::WithRawCallbackMethod_EmbedStream<
        v1::EmbeddingService::WithCallbackMethod_GetServerInfo<
            v1::EmbeddingService::Service>>>;

// The tag and length of a length-delimited field, for framing a cached
// EmbedResponse inside an EmbedStreamResponse.
std::string FieldHeader(int field_number, uint64_t length) {
  std::string header;
  google::protobuf::io::StringOutputStream out(&header);
  google::protobuf::io::CodedOutputStream coded(&out);
  coded.WriteTag(static_cast<uint32_t>(field_number) << 3 | 2);
  coded.WriteVarint64(length);
  coded.Trim();
  return header;
}

class EchoService final : public Base {
 public:
  explicit EchoService(int default_dim) : default_dim_(default_dim) {}

  grpc::ServerUnaryReactor* Embed(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request_bytes,
                                  grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    v1::EmbedRequest request;
    if (!Parse(*request_bytes, &request)) {
      reactor->Finish(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad request"));
      return reactor;
    }
    *response = grpc::ByteBuffer(&CachedFor(request), 1);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  // The stream answers each request with the cached response inside an
  // EmbedStreamResponse carrying the request's id: a few framing bytes
  // per message, as temb-server writes them.
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* EmbedStream(
      grpc::CallbackServerContext* /*context*/) override {
    return new StreamReactor(this);
  }

 private:
  class StreamReactor final
      : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
   public:
    explicit StreamReactor(EchoService* echo) : echo_(echo) {
      StartRead(&request_bytes_);
    }
    void OnReadDone(bool ok) override {
      v1::EmbedRequest request;
      if (!ok) {
        Finish(grpc::Status::OK);
        return;
      }
      if (!Parse(request_bytes_, &request)) {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad request"));
        return;
      }
      const grpc::Slice& answer = echo_->CachedFor(request);
      v1::EmbedStreamResponse head;
      head.set_request_id(request.request_id());
      const grpc::Slice slices[2] = {
          grpc::Slice(head.SerializeAsString() +
                      FieldHeader(v1::EmbedStreamResponse::kResponseFieldNumber,
                                  answer.size())),
          answer};
      response_bytes_ = grpc::ByteBuffer(slices, 2);
      StartWrite(&response_bytes_);
    }
    void OnWriteDone(bool ok) override {
      if (!ok) {
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
        return;
      }
      StartRead(&request_bytes_);
    }
    void OnDone() override { delete this; }

   private:
    EchoService* const echo_;
    grpc::ByteBuffer request_bytes_;
    grpc::ByteBuffer response_bytes_;
  };

  static bool Parse(const grpc::ByteBuffer& bytes, v1::EmbedRequest* request) {
    grpc::ByteBuffer copy(bytes);  // Deserialize consumes its input
    return grpc::SerializationTraits<v1::EmbedRequest>::Deserialize(&copy,
                                                                    request)
        .ok();
  }

  const grpc::Slice& CachedFor(const v1::EmbedRequest& request) {
    const int64_t rows =
        request.timesteps_size() + request.integer_timesteps_size();
    const int dim =
        request.spec().has_dim() ? request.spec().dim() : default_dim_;
    const v1::DType dtype = request.dtype() == v1::DTYPE_UNSPECIFIED
                                ? v1::DTYPE_FP32
                                : request.dtype();
    return Cached(rows, dim, dtype);
  }

  // The serialised response for a shape, built on first use.  Slices are
  // reference counted: the ByteBuffer of each call shares the bytes.
  const grpc::Slice& Cached(int64_t rows, int dim, v1::DType dtype) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto key = std::make_tuple(rows, dim, dtype);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    v1::EmbedResponse response;
    response.set_backend("echo");
    v1::Tensor* tensor = response.mutable_embedding();
    tensor->add_shape(rows);
    tensor->add_shape(dim);
    tensor->set_dtype(dtype);
    tensor->mutable_data()->assign(
        static_cast<size_t>(rows) * dim * DTypeBytes(dtype), '\0');
    return cache_.emplace(key, grpc::Slice(response.SerializeAsString()))
        .first->second;
  }

  const int default_dim_;
  std::mutex mu_;
  std::map<std::tuple<int64_t, int, v1::DType>, grpc::Slice> cache_;
};

}  // namespace
}  // namespace temb

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // As temb-server does (server/main.cc), so that the transport limit and
  // the server run the same gRPC locking.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  temb::EchoService service(absl::GetFlag(FLAGS_dim));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_address),
                           grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(absl::GetFlag(FLAGS_max_message_bytes));
  builder.SetMaxSendMessageSize(absl::GetFlag(FLAGS_max_message_bytes));
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "cannot listen on %s\n",
                 absl::GetFlag(FLAGS_address).c_str());
    return 1;
  }
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    // Written through a rename so a poller never reads half a number.
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << port << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }
  std::fprintf(stderr, "echo server listening on port %d\n", port);
  server->Wait();  // until killed
  return 0;
}
