// temb::Client: a thin absl::Status API over the temb.v1 gRPC stubs.
//
// The client owns a small pool of channels to one target.  One channel is
// enough for small requests, but many concurrent multi-megabyte messages on
// a single HTTP/2 connection lose much of their throughput, so callers that
// move large tensors ask for a few channels and the client hands them out
// round-robin.  Every channel carries the same service config: `round_robin`
// load balancing (so a target listing several addresses spreads the load)
// and a retry policy for UNAVAILABLE and CANCELLED on the idempotent
// methods.  Transport security (TLS, mTLS) and the bearer token come from
// ClientOptions.
//
// Thread-safe: one Client may be shared by any number of threads.
#ifndef TEMB_CLIENT_TEMB_CLIENT_H_
#define TEMB_CLIENT_TEMB_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "temb/v1/temb.grpc.pb.h"

namespace temb {

struct ClientOptions {
  // Any gRPC target URI: "localhost:50051", "dns:///svc:50051",
  // "ipv4:127.0.0.1:7001,127.0.0.1:7002", "unix:///tmp/temb.sock".
  std::string target;
  // Per-call deadline, covering every retry attempt.
  absl::Duration deadline = absl::Seconds(30);
  // Channels in the pool (>= 1).
  int channels = 1;
  // Send and receive limit.  gRPC's 4 MiB default is too small for large
  // batches; this matches the server's default 256 MiB output limit plus
  // room for the message framing.
  int max_message_bytes = (256 << 20) + (1 << 20);
  // Attempts per call (1 disables retries; gRPC caps it at 5).  UNAVAILABLE
  // and CANCELLED from the server are retried (see ServiceConfigJson).
  int max_attempts = 4;
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(1);

  // TLS.  `tls` or any of the files below turns it on.  tls_ca_file: PEM
  // roots to verify the server with (empty: gRPC's default roots);
  // tls_cert_file + tls_key_file: this client's certificate for mutual TLS;
  // tls_server_name: the name to expect in the server's certificate when
  // it differs from the target's host.
  bool tls = false;
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_server_name;
  // Sent as "authorization: Bearer <auth_token>" on every call; empty: none.
  std::string auth_token;
};

// The channel credentials `options` ask for: insecure, or TLS with the given
// roots and client certificate.  INVALID_ARGUMENT for a certificate without
// its key (or the reverse); ReadFile's code (NOT_FOUND, ...) for an unreadable
// file.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const ClientOptions& options);

// The service config JSON the client installs on every channel: round_robin
// load balancing plus the retry policy of `options`.
std::string ServiceConfigJson(const ClientOptions& options);

// Creates one channel to options.target.  The one place that builds
// channels, so that transport security is a matter of passing credentials
// (grpc::InsecureChannelCredentials() or grpc::SslCredentials(...)).
// `pool_index` makes each channel of a pool use its own connections.
std::shared_ptr<grpc::Channel> CreateTembChannel(
    const ClientOptions& options,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    int pool_index = 0);

// grpc::Status -> absl::Status: the code numbers are identical.
absl::Status ToAbslStatus(const grpc::Status& status);

// "INVALID_ARGUMENT", "UNAVAILABLE", ... for a grpc::StatusCode value.
std::string StatusCodeName(int code);

// A synchronous EmbedStream: write requests, read the answers in order.
// Not thread-safe: one writer and one reader thread at most (gRPC allows a
// concurrent Write and Read).
class EmbedStream {
 public:
  EmbedStream(std::unique_ptr<grpc::ClientContext> context,
              v1::EmbeddingService::Stub* stub);

  // False when the stream is broken; Finish() then tells why.
  bool Write(const v1::EmbedRequest& request);
  // Signals that no more requests follow.
  bool WritesDone();
  // The next answer (it may itself carry an error for its request).
  // OUT_OF_RANGE at the end of the stream; the stream's own error otherwise.
  absl::StatusOr<v1::EmbedStreamResponse> Read();
  // The final status of the stream.  Call once, after reading to the end.
  absl::Status Finish();

 private:
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::EmbedRequest, v1::EmbedStreamResponse>>
      stream_;
};

class Client {
 public:
  // INVALID_ARGUMENT for an empty target or channels < 1.  Does not connect:
  // gRPC connects lazily, so an unreachable server shows up as UNAVAILABLE
  // (or DEADLINE_EXCEEDED) on the first call.  Null `credentials`: those of
  // ChannelCredentials(options).
  static absl::StatusOr<std::unique_ptr<Client>> Create(
      const ClientOptions& options,
      std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

  // One Embed call.  The status codes are the server's (see temb.proto).
  absl::StatusOr<v1::EmbedResponse> Embed(const v1::EmbedRequest& request);

  absl::StatusOr<v1::ServerInfo> GetServerInfo();

  // One Condition call: a conditioning model's outputs (see temb.proto).
  absl::StatusOr<v1::ConditionResponse> Condition(
      const v1::ConditionRequest& request);

  // grpc.health.v1 Check for `service` ("" is the server as a whole).
  // An RPC failure is an error; NOT_SERVING is a successful answer.
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> Health(
      const std::string& service);

  // Opens an EmbedStream on the next channel of the pool.  The deadline
  // covers the whole stream.
  std::unique_ptr<EmbedStream> OpenStream();

  // For asynchronous callers (the benchmark): the next stub of the pool and
  // a context configured like the synchronous calls' (deadline set).
  v1::EmbeddingService::Stub* NextStub();
  // Sets the deadline and AddCallMetadata.
  void ConfigureContext(grpc::ClientContext* context) const;
  // The per-call metadata (the bearer token), for calls with their own
  // deadline such as long-lived streams.
  void AddCallMetadata(grpc::ClientContext* context) const;

  const ClientOptions& options() const { return options_; }

 private:
  explicit Client(const ClientOptions& options);

  ClientOptions options_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::EmbeddingService::Stub>> stubs_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_stub_;
  std::atomic<uint64_t> next_{0};
};

}  // namespace temb

#endif  // TEMB_CLIENT_TEMB_CLIENT_H_
