#include "temb/app/app.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "temb/app/logging.h"
#include "temb/base/status_macros.h"
#include "temb/core/embed_service.h"
#include "temb/core/presets.h"
#include "temb/core/request_observer.h"
#include "temb/core/token_auth.h"
#include "temb/grpc/call_gate.h"
#include "temb/grpc/grpc_server.h"
#include "temb/kserve/kserve_service.h"
#include "temb/metrics/prometheus_metrics.h"
#include "temb/native/native_service.h"
#include "temb/v1_convert/preset_catalog.h"

namespace temb {

App::App(const AppOptions& options) : options_(options) {}

App::~App() {
  if (server_ != nullptr) Shutdown();
}

int App::port() const { return server_->port(); }

absl::StatusOr<std::unique_ptr<App>> App::Start(
    const AppOptions& options, std::unique_ptr<Backend> backend) {
  const Limits& limits = options.limits;
  if (limits.max_dim < 1 || limits.max_batch < 1 ||
      limits.max_output_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_dim, max_batch and max_output_bytes must be >= 1, got ",
        limits.max_dim, ", ", limits.max_batch, ", ", limits.max_output_bytes));
  }
  if (options.admission.max_inflight < 0 ||
      options.admission.max_queued_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_inflight and max_queued_bytes must be >= 0 (0: unlimited), got ",
        options.admission.max_inflight, ", ",
        options.admission.max_queued_bytes));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   MakeServerCredentials(options.tls));
  std::unique_ptr<App> app(new App(options));
  if (backend == nullptr) {
    ASSIGN_OR_RETURN(backend,
                     CreateBackend(options.backend, options.backend_options));
  }
  PresetCatalog presets = BuiltInPresetCatalog();
  if (!options.presets_file.empty()) {
    ASSIGN_OR_RETURN(presets, ReadPresetCatalog(options.presets_file));
  }
  const std::string backend_name(BackendKindName(backend->kind()));
  const std::string device = backend->device();

  std::vector<RequestObserver*> observers;
  if (!options.metrics_address.empty()) {
    app->metrics_ = std::make_unique<PrometheusMetrics>(backend_name, device);
    ASSIGN_OR_RETURN(app->metrics_port_,
                     app->metrics_->Serve(options.metrics_address));
    observers.push_back(app->metrics_.get());
  }
  app->request_logger_ = std::make_unique<RequestLogger>();
  observers.push_back(app->request_logger_.get());
  app->observers_ = std::make_unique<ObserverList>(std::move(observers));

  if (!options.auth_token_file.empty()) {
    ASSIGN_OR_RETURN(TokenVerifier tokens,
                     TokenVerifier::FromFile(options.auth_token_file));
    app->tokens_ = std::make_unique<TokenVerifier>(std::move(tokens));
  }
  app->admission_ = std::make_unique<AdmissionController>(
      options.admission, app->observers_.get());
  app->gate_ = std::make_unique<CallGate>(
      app->admission_.get(), app->tokens_.get(), app->observers_.get());

  EmbedService::Options service_options;
  service_options.limits = options.limits;
  service_options.on_backend_failure = options.on_backend_failure;
  service_options.admission = app->admission_.get();
  service_options.observer = app->observers_.get();
  service_options.fallback_options = options.backend_options;
  app->service_ = std::make_unique<EmbedService>(
      std::move(backend), std::move(presets), service_options);
  app->max_message_bytes_ = MaxMessageBytes(options.limits);
  app->native_ = std::make_unique<NativeService>(
      *app->service_, *app->gate_, app->observers_.get(),
      NativeService::Options{app->max_message_bytes_});
  app->kserve_ = std::make_unique<kserve::KServeService>(
      *app->service_, *app->gate_, app->observers_.get());

  GrpcServerOptions server_options;
  server_options.address = options.address;
  server_options.max_message_bytes = app->max_message_bytes_;
  server_options.credentials = std::move(credentials);
  ASSIGN_OR_RETURN(
      app->server_,
      GrpcServer::Start(
          server_options,
          {{app->native_.get(), v1::EmbeddingService::service_full_name()},
           {app->kserve_.get(),
            inference::GRPCInferenceService::service_full_name()}}));
  // Draining or a failed backend: probes and load balancers learn at once.
  // (Set after Start: no call can change the state before the server runs.)
  GrpcServer* server = app->server_.get();
  app->admission_->SetNotServingListener(
      [server](AdmissionController::State) { server->SetNotServing(); });

  LogEvent(
      LogLevel::kInfo, "serving",
      {{"address", options.address},
       {"port", app->port()},
       {"backend", backend_name},
       {"device", device},
       {"max_dim", limits.max_dim},
       {"max_batch", limits.max_batch},
       {"max_output_bytes", limits.max_output_bytes},
       {"max_message_bytes", app->max_message_bytes_},
       {"max_inflight", options.admission.max_inflight},
       {"max_queued_bytes", options.admission.max_queued_bytes},
       {"tls", options.tls.cert_file.empty()
                   ? "off"
                   : (options.tls.client_ca_file.empty() ? "tls" : "mtls")},
       {"auth", app->tokens_ != nullptr},
       {"presets",
        static_cast<int64_t>(app->service_->presets().presets().size())},
       {"presets_file", options.presets_file.empty() ? std::string("built-in")
                                                     : options.presets_file},
       {"metrics_port", app->metrics_port_}});
  return app;
}

void App::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    const absl::Time deadline = absl::Now() + options_.drain_grace;
    LogEvent(LogLevel::kInfo, "draining",
             {{"grace_seconds", absl::ToDoubleSeconds(options_.drain_grace)},
              {"inflight", admission_->inflight()}});
    // gRPC cancels calls that reach it after its own Shutdown begins, so
    // the gate refuses new calls (UNAVAILABLE, which clients retry
    // elsewhere) and in-flight ones finish before gRPC stops.
    admission_->StartDraining();
    const bool idle = admission_->WaitUntilIdle(deadline, options_.drain_quiet);
    const absl::Duration left =
        std::max(deadline - absl::Now(), absl::ZeroDuration());
    LogEvent(idle ? LogLevel::kInfo : LogLevel::kWarn, "drained",
             {{"idle", idle},
              {"inflight", admission_->inflight()},
              {"grace_left_seconds", absl::ToDoubleSeconds(left)}});
    server_->Shutdown(left);
    LogEvent(LogLevel::kInfo, "stopped");
  });
}

absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& contents) {
  const std::string temporary = path + ".tmp";
  std::FILE* file = std::fopen(temporary.c_str(), "wb");
  if (file == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot write \"", path, "\""));
  }
  const bool written =
      std::fwrite(contents.data(), 1, contents.size(), file) == contents.size();
  if (std::fclose(file) != 0 || !written ||
      std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    return absl::UnavailableError(absl::StrCat("cannot write \"", path, "\""));
  }
  return absl::OkStatus();
}

}  // namespace temb
