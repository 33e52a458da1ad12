#include "temb/grpc/grpc_server.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "temb/base/file_reader.h"

namespace temb {
namespace {

// Tag/length prefixes, shape, dtype, request id, spec and gRPC framing are a
// few hundred bytes in practice; 64 KiB leaves room for long request ids.
constexpr int64_t kMessageHeadroomBytes = int64_t{64} << 10;
// A negative int64 varint takes 10 bytes, the worst case per timestep.
constexpr int64_t kMaxBytesPerTimestep = 10;

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& tls) {
  if (tls.cert_file.empty() && tls.key_file.empty() &&
      tls.client_ca_file.empty()) {
    return grpc::InsecureServerCredentials();
  }
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs both tls_cert and tls_key (tls_client_ca alone cannot "
        "serve TLS)");
  }
  absl::StatusOr<std::string> cert = ReadFile(tls.cert_file, "--tls_cert file");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFile(tls.key_file, "--tls_key file");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options(
      tls.client_ca_file.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!tls.client_ca_file.empty()) {
    absl::StatusOr<std::string> ca =
        ReadFile(tls.client_ca_file, "--tls_client_ca file");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
  }
  options.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  return grpc::SslServerCredentials(options);
}

int64_t MaxBatchForMessages() {
  return (std::numeric_limits<int32_t>::max() - kMessageHeadroomBytes) /
         kMaxBytesPerTimestep;
}

int64_t MaxOutputBytesForMessages() {
  return std::numeric_limits<int32_t>::max() - kMessageHeadroomBytes;
}

int MaxReceiveMessageBytes(const Limits& limits) {
  const int64_t batch =
      std::clamp<int64_t>(limits.max_batch, 0, MaxBatchForMessages());
  return static_cast<int>(batch * kMaxBytesPerTimestep + kMessageHeadroomBytes);
}

int MaxSendMessageBytes(const Limits& limits) {
  const int64_t output = std::clamp<int64_t>(limits.max_output_bytes, 0,
                                             MaxOutputBytesForMessages());
  return static_cast<int>(output + kMessageHeadroomBytes);
}

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(
    const GrpcServerOptions& options,
    const std::vector<ServiceRegistration>& services) {
  // Both are process-wide switches that take effect for servers built later.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.address,
                           options.credentials
                               ? options.credentials
                               : grpc::InsecureServerCredentials(),
                           &port);
  // gRPC sets SO_REUSEPORT by default: a second server on a busy port would
  // start "successfully" and share it.  Fail instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Separate limits: a request is at most max_batch timesteps (well under
  // 1 MiB by default) and gRPC buffers a message whole before any handler
  // sees it, so the receive limit bounds what an unauthenticated caller can
  // make the server hold; only responses need the large one.
  builder.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  builder.SetMaxSendMessageSize(options.max_send_message_bytes);
  if (options.memory_quota_bytes > 0) {
    // Everything gRPC allocates for connections (read buffers, header
    // parsing, call arenas) is charged to this quota; past it gRPC stops
    // reading and closes the connections holding the memory.  It is what
    // bounds a header block that never ends (CVE-2023-33953 in gRPC 1.51)
    // when no hardened front stops it first (docs/operations.md).
    grpc::ResourceQuota quota("temb-server");
    quota.Resize(static_cast<size_t>(options.memory_quota_bytes));
    builder.SetResourceQuota(quota);
  }
  for (const ServiceRegistration& registration : services) {
    builder.RegisterService(registration.service);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    if (server != nullptr) server->Shutdown();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on \"", options.address,
                     "\" (address in use or invalid, or an unusable TLS "
                     "certificate or key?)"));
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  health->SetServingStatus(true);  // the overall "" entry
  for (const ServiceRegistration& registration : services) {
    health->SetServingStatus(registration.health_name, true);
  }
  return std::unique_ptr<GrpcServer>(new GrpcServer(std::move(server), port));
}

GrpcServer::GrpcServer(std::unique_ptr<grpc::Server> server, int port)
    : server_(std::move(server)), port_(port) {}

GrpcServer::~GrpcServer() { Shutdown(absl::ZeroDuration()); }

void GrpcServer::SetServing(const std::string& health_name, bool serving) {
  // After SetNotServing the health service ignores updates itself.
  server_->GetHealthCheckService()->SetServingStatus(health_name, serving);
}

void GrpcServer::SetNotServing() {
  // NOT_SERVING for every entry, and later updates are ignored, so watchers
  // and load balancers see it before the listener closes.  Idempotent.
  server_->GetHealthCheckService()->Shutdown();
}

void GrpcServer::Shutdown(absl::Duration grace) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (shut_down_) return;
  shut_down_ = true;
  SetNotServing();
  const auto deadline =
      std::chrono::system_clock::now() + absl::ToChronoNanoseconds(grace);
  server_->Shutdown(deadline);
  server_->Wait();
}

}  // namespace temb
