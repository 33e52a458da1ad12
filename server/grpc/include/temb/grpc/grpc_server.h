// GrpcServer: the gRPC server assembly every frontend registers on.
//
// It owns listening, message-size limits, credentials, grpc.health.v1,
// reflection and graceful shutdown; frontends (native temb.v1, KServe v2)
// are plain grpc::Service objects handed in by the caller, so adding one is a
// line at the call site and TLS is a different `credentials`.
#ifndef TEMB_GRPC_GRPC_SERVER_H_
#define TEMB_GRPC_GRPC_SERVER_H_

#include <cstdint>
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

// gRPC's receive limit for a server with these limits: the largest valid
// request, max_batch timesteps at the worst case of 10 bytes each (negative
// int64 varints), plus 64 KiB of headroom for framing, ids and the spec.
// gRPC buffers a whole message before any handler (or token check) runs, so
// this is what one call can make the server hold before it is refused with
// RESOURCE_EXHAUSTED.  max_batch is clamped to MaxBatchForMessages().
int MaxReceiveMessageBytes(const Limits& limits);

// gRPC's send limit: the largest response (max_output_bytes of tensor data)
// plus the same headroom.  max_output_bytes is clamped to
// MaxOutputBytesForMessages().
int MaxSendMessageBytes(const Limits& limits);

// The largest max_batch and max_output_bytes whose messages fit gRPC's
// INT32_MAX message ceiling with the headroom; App::Start refuses larger.
int64_t MaxBatchForMessages();
int64_t MaxOutputBytesForMessages();

// PEM files for serving TLS.  cert_file and key_file together enable TLS;
// client_ca_file additionally requires every client to present a certificate
// signed by that CA (mutual TLS).
struct TlsFiles {
  std::string cert_file;
  std::string key_file;
  std::string client_ca_file;
};

// Insecure credentials when `tls` names no files; TLS (or mTLS) otherwise.
// INVALID_ARGUMENT for an incomplete set (a certificate without its key, a
// client CA without a server certificate); ReadFile's code (NOT_FOUND,
// PERMISSION_DENIED, ...) for a file that cannot be read.  The PEM contents
// are checked when the server starts.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& tls);

struct GrpcServerOptions {
  // HOST:PORT; port 0 picks a free port (see GrpcServer::port()).
  std::string address = "0.0.0.0:50051";
  int max_receive_message_bytes = 4 << 20;
  int max_send_message_bytes = 4 << 20;
  // gRPC's memory quota for the whole server (grpc::ResourceQuota): what
  // connections may hold in read buffers, header blocks being parsed and
  // call arenas.  0: unlimited (gRPC's default).
  int64_t memory_quota_bytes = 0;
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

  // Sets one grpc.health.v1 entry (any name, not only a registered
  // service's).  Ignored once SetNotServing() was called.  Thread-safe.
  void SetServing(const std::string& health_name, bool serving);

  // Health turns NOT_SERVING for every entry ("" included) and stays so,
  // whatever is set later: for a drain, or a backend that failed for good.
  // Thread-safe.
  void SetNotServing();

  // Stops: SetNotServing(), then the listener closes and calls still running
  // may finish until now + grace; what remains is then cancelled.  gRPC
  // cancels calls that arrive while it shuts down, so callers drain first
  // (App::Shutdown refuses new calls and waits for in-flight ones) and come
  // here with what is left of the grace.  Returns once the server stopped.
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

#endif  // TEMB_GRPC_GRPC_SERVER_H_
