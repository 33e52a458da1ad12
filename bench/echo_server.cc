// temb-echo-server: the transport baseline of the benchmark suite.
//
// It serves temb.v1 Embed on the same gRPC stack as temb-server, so that
// `temb bench` drives both unchanged, but computes nothing: every answer is a
// zero tensor of the size the real server would send (rows x dim x dtype
// size).  Responses are serialised once per shape and kept as a
// reference-counted slice, and each call replies with a ByteBuffer that
// points at it, so the measured cost is gRPC's own (HTTP/2 framing, the
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

using Base = v1::EmbeddingService::WithRawCallbackMethod_Embed<
    v1::EmbeddingService::CallbackService>;

class EchoService final : public Base {
 public:
  explicit EchoService(int default_dim) : default_dim_(default_dim) {}

  grpc::ServerUnaryReactor* Embed(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request_bytes,
                                  grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    v1::EmbedRequest request;
    grpc::ByteBuffer copy(*request_bytes);  // Deserialize consumes its input
    if (!grpc::SerializationTraits<v1::EmbedRequest>::Deserialize(&copy,
                                                                  &request)
             .ok()) {
      reactor->Finish(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad request"));
      return reactor;
    }
    const int64_t rows =
        request.timesteps_size() + request.integer_timesteps_size();
    const int dim =
        request.spec().has_dim() ? request.spec().dim() : default_dim_;
    const v1::DType dtype = request.dtype() == v1::DTYPE_UNSPECIFIED
                                ? v1::DTYPE_FP32
                                : request.dtype();
    *response = grpc::ByteBuffer(&Cached(rows, dim, dtype), 1);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
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
