// GrpcServer: the gRPC server assembly every frontend registers on.
//
// It owns listening, message-size limits, credentials, grpc.health.v1,
// reflection and graceful shutdown; frontends (native temb.v1, KServe v2)
// are plain grpc::Service objects handed in by the caller, so adding one is a
// line at the call site and TLS is a different `credentials`.
#ifndef TEMB_SERVER_GRPC_GRPC_SERVER_H_
#define TEMB_SERVER_GRPC_GRPC_SERVER_H_

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "temb/kernels/embedding_spec.h"

namespace grpc {
class Server;
class ServerCredentials;
class Service;
}  // namespace grpc

namespace temb {

// The gRPC send/receive limit for a server with these limits: the largest
// response (max_output_bytes of tensor data) or request (max_batch timesteps
// as int64 varints, up to 10 bytes each), plus headroom for framing, ids and
// the spec.  Capped at INT32_MAX, gRPC's own ceiling.
int MaxMessageBytes(const Limits& limits);

struct GrpcServerOptions {
  // HOST:PORT; port 0 picks a free port (see GrpcServer::port()).
  std::string address = "0.0.0.0:50051";
  int max_message_bytes = 4 << 20;
  // Null: insecure (plaintext).
  std::shared_ptr<grpc::ServerCredentials> credentials;
};

struct ServiceRegistration {
  grpc::Service* service;  // not owned; must outlive the server
  // The name reported by grpc.health.v1, e.g. "temb.v1.EmbeddingService".
  std::string health_name;
};

class GrpcServer {
 public:
  // Builds and starts the server; every registered service and the overall
  // "" health entry report SERVING.  UNAVAILABLE when the address cannot be
  // bound.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(
      const GrpcServerOptions& options,
      const std::vector<ServiceRegistration>& services);
  ~GrpcServer();  // Shutdown(absl::ZeroDuration()) if still running

  // The port actually bound.
  int port() const { return port_; }

  // Drains: health turns NOT_SERVING for every service, new calls are
  // refused with UNAVAILABLE, in-flight calls may finish until now + grace,
  // and what remains is then cancelled.  Returns once the server stopped.
  // Thread-safe; a later call waits for the first to finish.
  void Shutdown(absl::Duration grace);

 private:
  GrpcServer(std::unique_ptr<grpc::Server> server, int port);

  std::unique_ptr<grpc::Server> server_;
  int port_;
  std::mutex mutex_;
  bool shut_down_ = false;  // guarded by mutex_
};

}  // namespace temb

#endif  // TEMB_SERVER_GRPC_GRPC_SERVER_H_
