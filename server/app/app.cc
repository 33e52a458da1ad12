#include "temb/app/app.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
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
#include "temb/kserve/model_statistics.h"
#include "temb/kserve/shared_memory.h"
#include "temb/metrics/prometheus_metrics.h"
#include "temb/native/native_service.h"
#include "temb/rest/http_server.h"
#include "temb/rest/rest_handler.h"
#include "temb/v1_convert/preset_catalog.h"

namespace temb {

App::App(const AppOptions& options) : options_(options) {}

App::~App() {
  if (server_ != nullptr) Shutdown();
}

int App::port() const { return server_->port(); }

int App::http_port() const { return http_ != nullptr ? http_->port() : 0; }

namespace {

// Most CPU threads one request may use: far above any machine's cores, and
// low enough that a typo does not try to start millions of threads.
constexpr int kMaxCpuThreads = 1024;
// The longest drain: beyond any termination grace an orchestrator grants.
constexpr absl::Duration kMaxDrainGrace = absl::Hours(24);
// The REST port's limits: a header must hold a request line and a bearer
// token; beyond these a flag is more likely a typo than a need.
constexpr int kMaxHttpConnections = 1 << 20;
constexpr int kMinHttpHeaderBytes = 1024;
constexpr int kMaxHttpHeaderBytes = 1 << 20;
// Below this gRPC cannot keep a few connections and their buffers.
constexpr int64_t kMinMemoryQuotaBytes = int64_t{16} << 20;

absl::Status Invalid(absl::string_view flag, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", problem));
}

// HOST:PORT, [IPV6]:PORT, optionally after an ipv4:/ipv6: scheme, with a
// port of 0..65535; `unix_ok`: also unix:PATH and unix-abstract:NAME.  gRPC
// itself takes "127.0.0.1:99999" and binds the port modulo 65536.
absl::Status CheckAddress(absl::string_view flag, absl::string_view address,
                          bool unix_ok) {
  if (unix_ok && (absl::StartsWith(address, "unix:") ||
                  absl::StartsWith(address, "unix-abstract:"))) {
    return absl::OkStatus();
  }
  absl::string_view host_port = address;
  for (absl::string_view scheme : {"ipv4:", "ipv6:"}) {
    if (unix_ok && absl::StartsWith(host_port, scheme)) {
      host_port.remove_prefix(scheme.size());
    }
  }
  const size_t colon = host_port.rfind(':');
  const absl::string_view port = colon == absl::string_view::npos
                                     ? absl::string_view()
                                     : host_port.substr(colon + 1);
  const bool digits = !port.empty() && port.size() <= 5 &&
                      std::all_of(port.begin(), port.end(), [](char c) {
                        return absl::ascii_isdigit(c);
                      });
  int number = 0;
  if (!digits || !absl::SimpleAtoi(port, &number) || number > 65535) {
    return Invalid(flag, absl::StrCat("must be HOST:PORT with a port from 0 "
                                      "to 65535 (0 picks a free one), got \"",
                                      address, "\""));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateAppOptions(const AppOptions& options) {
  const Limits& limits = options.limits;
  if (limits.max_dim < 1) {
    return Invalid("max_dim",
                   absl::StrCat("must be >= 1, got ", limits.max_dim));
  }
  if (limits.max_batch < 1 || limits.max_batch > MaxBatchForMessages()) {
    return Invalid(
        "max_batch",
        absl::StrCat("must be from 1 to ", MaxBatchForMessages(),
                     " (the most timesteps whose request fits gRPC's 2 GiB "
                     "message limit), got ",
                     limits.max_batch));
  }
  if (limits.max_output_bytes < 1 ||
      limits.max_output_bytes > MaxOutputBytesForMessages()) {
    return Invalid(
        "max_output_bytes",
        absl::StrCat("must be from 1 to ", MaxOutputBytesForMessages(),
                     " (a response must fit gRPC's 2 GiB message limit), "
                     "got ",
                     limits.max_output_bytes));
  }
  if (options.admission.max_inflight < 0) {
    return Invalid("max_inflight",
                   absl::StrCat("must be >= 0 (0: unlimited), got ",
                                options.admission.max_inflight));
  }
  if (options.admission.max_queued_bytes < 0) {
    return Invalid("max_queued_bytes",
                   absl::StrCat("must be >= 0 (0: unlimited), got ",
                                options.admission.max_queued_bytes));
  }
  if (options.conditioning_cache_bytes < 0) {
    return Invalid("conditioning_cache_bytes",
                   absl::StrCat("must be >= 0 (0: no cache), got ",
                                options.conditioning_cache_bytes));
  }
  if (options.shm_max_regions < 0) {
    return Invalid("shm_max_regions",
                   absl::StrCat("must be >= 0 (0: no registration), got ",
                                options.shm_max_regions));
  }
  if (options.http_max_connections < 1 ||
      options.http_max_connections > kMaxHttpConnections) {
    return Invalid("http_max_connections",
                   absl::StrCat("must be from 1 to ", kMaxHttpConnections,
                                ", got ", options.http_max_connections));
  }
  if (options.http_max_header_bytes < kMinHttpHeaderBytes ||
      options.http_max_header_bytes > kMaxHttpHeaderBytes) {
    return Invalid("http_max_header_bytes",
                   absl::StrCat("must be from ", kMinHttpHeaderBytes, " to ",
                                kMaxHttpHeaderBytes, ", got ",
                                options.http_max_header_bytes));
  }
  for (const auto& [flag, timeout] :
       {std::pair{"http_header_timeout", options.http_header_timeout},
        std::pair{"http_body_timeout", options.http_body_timeout}}) {
    if (timeout < absl::Milliseconds(100) || timeout > absl::Hours(1)) {
      return Invalid(flag, absl::StrCat("must be from 100ms to 1h, got ",
                                        absl::FormatDuration(timeout)));
    }
  }
  const int64_t min_quota = std::max<int64_t>(
      kMinMemoryQuotaBytes, int64_t{4} * MaxReceiveMessageBytes(limits));
  if (options.grpc_memory_quota_bytes < 0 ||
      (options.grpc_memory_quota_bytes > 0 &&
       options.grpc_memory_quota_bytes < min_quota)) {
    return Invalid(
        "grpc_memory_quota",
        absl::StrCat("must be 0 (unlimited) or at least ", min_quota,
                     " (16 MiB and four of the largest requests), got ",
                     options.grpc_memory_quota_bytes));
  }
  if (options.backend_options.cpu_threads < 0 ||
      options.backend_options.cpu_threads > kMaxCpuThreads) {
    return Invalid("cpu_threads",
                   absl::StrCat("must be from 0 (all hardware threads) to ",
                                kMaxCpuThreads, ", got ",
                                options.backend_options.cpu_threads));
  }
  if (options.backend_options.gpu_min_output_bytes < 0) {
    return Invalid("gpu_min_output_bytes",
                   absl::StrCat("must be >= 0, got ",
                                options.backend_options.gpu_min_output_bytes));
  }
  if (options.drain_grace < absl::ZeroDuration() ||
      options.drain_grace > kMaxDrainGrace) {
    return Invalid("drain_grace",
                   absl::StrCat("must be from 0s to ",
                                absl::FormatDuration(kMaxDrainGrace), ", got ",
                                absl::FormatDuration(options.drain_grace)));
  }
  if (options.model_control_mode == ModelControlMode::kPoll &&
      options.repository_poll <= absl::ZeroDuration()) {
    return Invalid("repository_poll",
                   "must be positive with --model_control_mode=poll");
  }
  if (options.model_load_threads < 1 || options.model_load_threads > 64) {
    return Invalid(
        "model_load_threads",
        absl::StrCat("must be from 1 to 64, got ", options.model_load_threads));
  }
  if (options.model_load_timeout < absl::ZeroDuration()) {
    return Invalid(
        "model_load_timeout",
        absl::StrCat("must be >= 0s (0s: no limit), got ",
                     absl::FormatDuration(options.model_load_timeout)));
  }
  if (absl::Status status = CheckAddress("address", options.address, true);
      !status.ok()) {
    return status;
  }
  if (!options.metrics_address.empty()) {
    if (absl::Status status =
            CheckAddress("metrics_address", options.metrics_address, false);
        !status.ok()) {
      return status;
    }
  }
  if (!options.http_address.empty()) {
    if (absl::Status status =
            CheckAddress("http_address", options.http_address, false);
        !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<App>> App::Start(
    const AppOptions& options, std::unique_ptr<Backend> backend) {
  RETURN_IF_ERROR(ValidateAppOptions(options));
  const Limits& limits = options.limits;
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   MakeServerCredentials(options.tls));
  std::unique_ptr<App> app(new App(options));
  if (backend == nullptr) {
    ASSIGN_OR_RETURN(backend,
                     CreateBackend(options.backend, options.backend_options));
  }
  PresetCatalog presets = BuiltInPresetCatalog();
  if (!options.presets_file.empty()) {
    // Checked against this server's limits (a preset wider than --max_dim
    // could never be served), not the defaults.
    absl::StatusOr<PresetCatalog> read =
        ReadPresetCatalog(options.presets_file, limits);
    if (!read.ok()) {
      return absl::Status(
          read.status().code(),
          absl::StrCat("--presets_file: ", read.status().message()));
    }
    if (read->presets().empty()) {
      return Invalid("presets_file",
                     absl::StrCat("\"", options.presets_file,
                                  "\" defines no preset: the server would "
                                  "serve no model"));
    }
    presets = *std::move(read);
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
  if (app->metrics_ != nullptr)
    app->metrics_->WatchAdmission(app->admission_.get());
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
  // The conditioning models load in the background: the server answers at
  // once, and each model is ready (KServe ModelReady) once loaded.
  ConditioningService::Options conditioning_options;
  conditioning_options.limits = options.limits;
  conditioning_options.threads =
      options.backend_options.cpu_threads > 0
          ? options.backend_options.cpu_threads
          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  conditioning_options.cache_bytes = options.conditioning_cache_bytes;
  conditioning_options.serve_ready_models = options.serve_ready_models;
  conditioning_options.load_threads = options.model_load_threads;
  if (options.model_load_timeout > absl::ZeroDuration()) {
    conditioning_options.load_timeout = options.model_load_timeout;
  }
  // One line per model as it settles: a model that failed to load says so,
  // with the reason, where an operator looks first.
  conditioning_options.on_settled = [](const std::string& name,
                                       ModelState state,
                                       const std::string& message) {
    if (state == ModelState::kReady) {
      LogEvent(LogLevel::kInfo, "conditioning_model_ready", {{"model", name}});
    } else if (state == ModelState::kUnloaded) {
      LogEvent(LogLevel::kInfo, "conditioning_model_unloaded",
               {{"model", name}, {"reason", message}});
    } else {
      LogEvent(LogLevel::kError, "conditioning_model_failed",
               {{"model", name}, {"reason", message}});
    }
  };
  conditioning_options.on_skipped = [](const std::string& entry,
                                       const std::string& why) {
    LogEvent(LogLevel::kWarn, "repository_entry_skipped",
             {{"entry", entry}, {"reason", why}});
  };
  if (options.conditioning_device == BackendChoice::kCuda) {
    absl::StatusOr<std::unique_ptr<LinearEngine>> engine =
        CreateGpuLinearEngine(options.backend_options.cuda_device);
    if (!engine.ok()) {
      return absl::Status(engine.status().code(),
                          absl::StrCat("--conditioning_device=cuda: ",
                                       engine.status().message()));
    }
    conditioning_options.linear_engine = *std::move(engine);
  }
  app->conditioning_ =
      std::make_unique<ConditioningService>(conditioning_options);
  if (!options.model_repository.empty()) {
    absl::Status opened =
        app->conditioning_->OpenRepository(options.model_repository);
    if (!opened.ok()) {
      return absl::Status(opened.code(), absl::StrCat("--model_repository: ",
                                                      opened.message()));
    }
    // A folder named like a preset takes the name on KServe and REST, where
    // a name is one model (docs/conditioning.md); said once, at start.
    for (const Preset& preset : app->service_->presets().presets()) {
      if (app->conditioning_->has_model(preset.name)) {
        LogEvent(LogLevel::kWarn, "conditioning_model_named_like_a_preset",
                 {{"model", preset.name},
                  {"kserve", "the model folder's"},
                  {"embed", "the preset's"}});
      }
    }
    app->control_ = std::make_unique<ModelControl>(app->conditioning_.get(),
                                                   options.model_control_mode,
                                                   options.repository_poll);
  }
  if (app->metrics_ != nullptr) {
    app->metrics_->WatchConditioning(app->conditioning_.get());
  }
  app->max_message_bytes_ = MaxSendMessageBytes(options.limits);
  app->max_receive_message_bytes_ = MaxReceiveMessageBytes(options.limits);
  app->native_ = std::make_unique<NativeService>(
      *app->service_, app->conditioning_.get(), *app->gate_,
      app->observers_.get(),
      NativeService::Options{app->max_message_bytes_,
                             app->max_receive_message_bytes_});
  app->statistics_ = std::make_unique<kserve::InferenceStatistics>(
      kserve::ServedModels{*app->service_, app->conditioning_.get()}.Names());
  kserve::SharedMemoryLimits shared_memory_limits;
  shared_memory_limits.max_regions = options.shm_max_regions;
  app->shared_memory_ =
      std::make_unique<kserve::SharedMemoryRegistry>(shared_memory_limits);
  app->kserve_ = std::make_unique<kserve::KServeService>(
      *app->service_, *app->gate_, app->observers_.get(),
      app->statistics_.get(), app->shared_memory_.get(),
      app->conditioning_.get(), app->control_.get());

  // KServe v2 over HTTP/REST: the same core, gate rules and statistics.
  // Started before gRPC, so that a port in use fails before anything serves.
  if (!options.http_address.empty()) {
    app->rest_ = std::make_unique<rest::RestHandler>(
        *app->service_, app->admission_.get(), app->tokens_.get(),
        app->observers_.get(), app->statistics_.get(),
        app->shared_memory_.get(), app->conditioning_.get(),
        app->control_.get());
    rest::HttpServerOptions http_options;
    http_options.address = options.http_address;
    http_options.tls_cert_file = options.tls.cert_file;
    http_options.tls_key_file = options.tls.key_file;
    http_options.tls_client_ca_file = options.tls.client_ca_file;
    http_options.max_connections = options.http_max_connections;
    http_options.max_header_bytes =
        static_cast<uint32_t>(options.http_max_header_bytes);
    http_options.header_timeout = options.http_header_timeout;
    http_options.body_timeout = options.http_body_timeout;
    http_options.on_error = [](absl::string_view what) {
      LogEvent(LogLevel::kError, "http_connection_failed",
               {{"error", std::string(what)}});
    };
    ASSIGN_OR_RETURN(app->http_,
                     rest::HttpServer::Start(http_options, app->rest_.get()));
  }

  GrpcServerOptions server_options;
  server_options.address = options.address;
  server_options.max_send_message_bytes = app->max_message_bytes_;
  server_options.max_receive_message_bytes = app->max_receive_message_bytes_;
  server_options.memory_quota_bytes = options.grpc_memory_quota_bytes;
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
  // Readiness waits for the conditioning models, and (strict) for each to
  // be ready: a failed model keeps the server not ready.
  server->SetServing(kModelsHealthName, false);
  const ConditioningService* conditioning = app->conditioning_.get();
  app->conditioning_->CallWhenLoaded([server, conditioning] {
    server->SetServing(kModelsHealthName, conditioning->RepositoryReady());
  });

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
       {"max_receive_message_bytes", app->max_receive_message_bytes_},
       {"grpc_memory_quota", options.grpc_memory_quota_bytes},
       {"max_inflight", options.admission.max_inflight},
       {"max_queued_bytes", options.admission.max_queued_bytes},
       {"shm_max_regions", options.shm_max_regions},
       {"http_max_connections", options.http_max_connections},
       {"tls", options.tls.cert_file.empty()
                   ? "off"
                   : (options.tls.client_ca_file.empty() ? "tls" : "mtls")},
       {"auth", app->tokens_ != nullptr},
       {"presets",
        static_cast<int64_t>(app->service_->presets().presets().size())},
       {"model_repository", options.model_repository},
       {"presets_file", options.presets_file.empty() ? std::string("built-in")
                                                     : options.presets_file},
       {"metrics_port", app->metrics_port_},
       {"http_port", app->http_port()}});
  return app;
}

void App::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    const absl::Time deadline = absl::Now() + options_.drain_grace;
    // The loading thread may touch the gRPC server's health: it ends first.
    conditioning_->StopLoading();
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
    // REST answers being sent finish and idle connections are closed at
    // once; gRPC gets what is left of the grace after.
    if (http_ != nullptr) http_->Stop();
    server_->Shutdown(std::max(deadline - absl::Now(), absl::ZeroDuration()));
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
