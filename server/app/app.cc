#include "server/app/app.h"

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/app/logging.h"
#include "server/core/embed_service.h"
#include "server/core/presets.h"
#include "server/core/request_observer.h"
#include "server/grpc/grpc_server.h"
#include "server/kserve/kserve_service.h"
#include "server/metrics/prometheus_metrics.h"
#include "server/native/native_service.h"
#include "temb/kernels/status_macros.h"

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
  std::unique_ptr<App> app(new App(options));
  if (backend == nullptr) {
    ASSIGN_OR_RETURN(backend,
                     CreateBackend(options.backend, options.backend_options));
  }
  PresetCatalog presets = PresetCatalog::BuiltIn();
  if (!options.presets_file.empty()) {
    ASSIGN_OR_RETURN(presets, PresetCatalog::FromFile(options.presets_file));
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

  app->service_ =
      std::make_unique<EmbedService>(std::move(backend), std::move(presets),
                                     EmbedService::Options{options.limits});
  app->max_message_bytes_ = MaxMessageBytes(options.limits);
  app->native_ = std::make_unique<NativeService>(
      *app->service_, app->observers_.get(),
      NativeService::Options{app->max_message_bytes_});
  app->kserve_ = std::make_unique<kserve::KServeService>(*app->service_,
                                                         app->observers_.get());

  GrpcServerOptions server_options;
  server_options.address = options.address;
  server_options.max_message_bytes = app->max_message_bytes_;
  ASSIGN_OR_RETURN(
      app->server_,
      GrpcServer::Start(
          server_options,
          {{app->native_.get(), v1::EmbeddingService::service_full_name()},
           {app->kserve_.get(),
            inference::GRPCInferenceService::service_full_name()}}));

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
       {"presets",
        static_cast<int64_t>(app->service_->presets().presets().size())},
       {"presets_file", options.presets_file.empty() ? std::string("built-in")
                                                     : options.presets_file},
       {"metrics_port", app->metrics_port_}});
  return app;
}

void App::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    LogEvent(LogLevel::kInfo, "draining",
             {{"grace_seconds", absl::ToDoubleSeconds(options_.drain_grace)}});
    server_->Shutdown(options_.drain_grace);
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
