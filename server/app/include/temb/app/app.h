// App: temb-server assembled from its parts (backend, preset catalogue,
// service core, metrics, request log, frontends, gRPC server).  main() only
// parses flags into AppOptions; in-process tests start the same assembly.
#ifndef TEMB_APP_APP_H_
#define TEMB_APP_APP_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "temb/core/admission.h"
#include "temb/core/conditioning_service.h"
#include "temb/core/embed_service.h"
#include "temb/core/model_control.h"
#include "temb/grpc/grpc_server.h"
#include "temb/kernels/backend.h"
#include "temb/kernels/embedding_spec.h"
#include "temb/kernels/registry.h"

namespace temb {

class CallGate;
class NativeService;
class TokenVerifier;
class ObserverList;
class PrometheusMetrics;
class RequestLogger;
namespace kserve {
class KServeService;
class InferenceStatistics;
class SharedMemoryRegistry;
}  // namespace kserve
namespace rest {
class HttpServer;
class RestHandler;
}  // namespace rest

// The grpc.health.v1 entry that turns SERVING once every conditioning model
// has loaded or failed (at once without --model_repository): what a
// readiness probe asks for.
inline constexpr char kModelsHealthName[] = "temb.models";

struct AppOptions {
  // gRPC HOST:PORT; port 0 picks a free one (App::port()).
  std::string address = "0.0.0.0:50051";
  BackendChoice backend = BackendChoice::kAuto;
  BackendOptions backend_options;
  Limits limits;
  // Prometheus HOST:PORT serving /metrics; empty disables metrics.
  std::string metrics_address = "0.0.0.0:9090";
  // KServe v2 REST HOST:PORT (Triton's HTTP port is 8000); port 0 picks a
  // free one (App::http_port()); empty disables REST.
  std::string http_address;
  // A temb.v1.PresetCatalog text proto replacing the built-in catalogue.
  std::string presets_file;
  // How long in-flight calls may run on after Shutdown() starts.
  absl::Duration drain_grace = absl::Seconds(15);
  // During a drain, the server keeps answering UNAVAILABLE until no call
  // has arrived for this long (or the grace ends) before it closes the
  // listener: a call arriving after that is cancelled by gRPC.
  absl::Duration drain_quiet = absl::Milliseconds(250);
  // Serve TLS / mTLS (grpc_server.h); all empty: plaintext.
  TlsFiles tls;
  // Accepted bearer tokens (token_auth.h); empty: no authentication.
  std::string auth_token_file;
  // max_inflight, max_queued_bytes; 0 = unlimited.
  AdmissionLimits admission;
  // gRPC's memory quota (GrpcServerOptions::memory_quota_bytes); 0:
  // unlimited.  Bounds what connections hold before any handler runs, e.g.
  // a header block that never ends (docs/operations.md).
  int64_t grpc_memory_quota_bytes = int64_t{256} << 20;
  BackendFailurePolicy on_backend_failure = BackendFailurePolicy::kNotServing;
  // System shared memory regions clients may register at once (each holds
  // one descriptor).
  int64_t shm_max_regions = 64;
  // The REST port's connection limits (rest::HttpServerOptions).
  int http_max_connections = 1024;
  int http_max_header_bytes = 16 << 10;
  absl::Duration http_header_timeout = absl::Seconds(10);
  absl::Duration http_body_timeout = absl::Seconds(30);
  // A folder of diffusers model folders served as conditioning models
  // (conditioning_service.h); empty: none.
  std::string model_repository;
  // The exact row cache shared by the conditioning models; 0: none.
  int64_t conditioning_cache_bytes = int64_t{256} << 20;
  // Readiness (temb.models health, KServe server ready) while a model of the
  // repository failed: false (strict, as Triton's --strict-readiness) until
  // every model is ready; true once every model settled, serving the ready
  // ones alone.
  bool serve_ready_models = false;
  // Models loading at once (1 to 64), and how long one load may take
  // (zero: no limit): ConditioningService::Options.
  int model_load_threads = 4;
  absl::Duration model_load_timeout = absl::ZeroDuration();
  // Who changes the repository's models while the server runs
  // (temb/core/model_control.h), and how often poll mode looks.
  ModelControlMode model_control_mode = ModelControlMode::kNone;
  absl::Duration repository_poll = absl::Seconds(15);
  // Where the conditioning models' Linear layers run: kCpu, or kCuda
  // (cuBLASLt on backend_options.cuda_device); kAuto is the CPU.
  BackendChoice conditioning_device = BackendChoice::kCpu;
};

class App {
 public:
  // Starts serving.  `backend` overrides options.backend (tests inject one).
  // Errors: ValidateAppOptions', the backend's, the catalogue's
  // (INVALID_ARGUMENT for a --presets_file that defines no preset or one
  // beyond options.limits), UNAVAILABLE when an address cannot be bound.
  static absl::StatusOr<std::unique_ptr<App>> Start(
      const AppOptions& options, std::unique_ptr<Backend> backend = nullptr);
  ~App();  // Shutdown() if still serving

  int port() const;
  int metrics_port() const { return metrics_port_; }  // 0: metrics disabled
  int http_port() const;                              // 0: REST disabled
  // gRPC's send limit (reported in ServerInfo.limits.max_message_bytes) and
  // receive limit (grpc_server.h).
  int max_message_bytes() const { return max_message_bytes_; }
  int max_receive_message_bytes() const { return max_receive_message_bytes_; }
  const EmbedService& service() const { return *service_; }
  const ConditioningService& conditioning() const { return *conditioning_; }
  const AdmissionController& admission() const { return *admission_; }
  // Null when metrics are disabled.
  const PrometheusMetrics* metrics() const { return metrics_.get(); }

  // Drains, within options.drain_grace: health NOT_SERVING and new calls
  // refused with UNAVAILABLE "server is draining" (KServe readiness false);
  // then waits until no call is in flight and clients stopped calling
  // (options.drain_quiet); only then stops gRPC with what is left of the
  // grace.  Returns when stopped; thread-safe.
  void Shutdown();

 private:
  explicit App(const AppOptions& options);

  AppOptions options_;
  std::once_flag shutdown_once_;
  int max_message_bytes_ = 0;
  int max_receive_message_bytes_ = 0;
  int metrics_port_ = 0;
  std::unique_ptr<PrometheusMetrics> metrics_;
  std::unique_ptr<RequestLogger> request_logger_;
  std::unique_ptr<ObserverList> observers_;
  std::unique_ptr<AdmissionController> admission_;
  std::unique_ptr<TokenVerifier> tokens_;
  std::unique_ptr<CallGate> gate_;
  std::unique_ptr<EmbedService> service_;
  std::unique_ptr<ConditioningService> conditioning_;
  std::unique_ptr<ModelControl> control_;  // with a repository
  std::unique_ptr<NativeService> native_;
  std::unique_ptr<kserve::KServeService> kserve_;
  std::unique_ptr<kserve::InferenceStatistics> statistics_;
  std::unique_ptr<kserve::SharedMemoryRegistry> shared_memory_;
  std::unique_ptr<rest::RestHandler> rest_;
  std::unique_ptr<rest::HttpServer> http_;  // stops before rest_ goes
  std::unique_ptr<GrpcServer> server_;      // last: stops before the rest goes
};

// INVALID_ARGUMENT naming the flag (as --name) for configuration the server
// must not start with: limits below 1 or beyond what fits gRPC's 2 GiB
// messages, negative counts or durations, an absurd --cpu_threads, an
// address whose port is not 0..65535.  App::Start calls it first.
absl::Status ValidateAppOptions(const AppOptions& options);

// Writes `contents` to `path` through a temporary file and a rename, so a
// reader polling for the file never sees it half-written.
absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& contents);

}  // namespace temb

#endif  // TEMB_APP_APP_H_
