// temb-server: parses flags into AppOptions (App::Start refuses bad ones
// with a message naming the flag, exit 1), serves until SIGTERM, SIGINT or
// SIGHUP, then drains and exits 0.
#include <malloc.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "temb/app/app.h"
#include "temb/app/logging.h"
#include "temb/app/signals.h"

ABSL_FLAG(std::string, address, "0.0.0.0:50051",
          "gRPC listen address HOST:PORT; port 0 picks a free port");
ABSL_FLAG(std::string, port_file, "",
          "write the bound gRPC port to this file once serving");
ABSL_FLAG(std::string, backend, "auto",
          "auto (the GPU when one works, with the CPU for small requests) | "
          "cpu | cuda (every request on the GPU)");
ABSL_FLAG(int64_t, gpu_min_output_bytes,
          temb::BackendOptions().gpu_min_output_bytes,
          "with --backend=auto and a GPU: responses of at least this many "
          "bytes are computed on the GPU, smaller ones on the CPU; 0: all on "
          "the GPU");
ABSL_FLAG(int, cpu_threads, 0,
          "CPU backend threads per request (0: all hardware threads)");
ABSL_FLAG(int64_t, max_batch, temb::Limits().max_batch,
          "most timesteps per request");
ABSL_FLAG(int, max_dim, temb::Limits().max_dim, "widest embedding");
ABSL_FLAG(int64_t, max_output_bytes, temb::Limits().max_output_bytes,
          "largest embedding tensor in bytes; gRPC message limits follow "
          "from this and max_batch");
ABSL_FLAG(std::string, metrics_address, "0.0.0.0:9090",
          "Prometheus /metrics HOST:PORT; empty disables metrics");
ABSL_FLAG(std::string, metrics_port_file, "",
          "write the bound metrics port to this file once serving");
ABSL_FLAG(std::string, http_address, "",
          "KServe v2 REST (HTTP/JSON, Triton's HTTP API) HOST:PORT, e.g. "
          "0.0.0.0:8000 as Triton; port 0 picks a free port; empty (the "
          "default) disables REST. TLS and tokens as for gRPC");
ABSL_FLAG(std::string, http_port_file, "",
          "write the bound REST port to this file once serving");
ABSL_FLAG(int, http_max_connections, temb::AppOptions().http_max_connections,
          "REST connections open at once; more are closed as soon as they "
          "are accepted");
ABSL_FLAG(int, http_max_header_bytes, temb::AppOptions().http_max_header_bytes,
          "largest REST request header (request line and fields); beyond it "
          "431 and the connection is closed");
ABSL_FLAG(absl::Duration, http_header_timeout,
          temb::AppOptions().http_header_timeout,
          "time a REST connection has, from its start or its previous answer, "
          "to send a whole request header; idle keep-alive connections close "
          "then too");
ABSL_FLAG(absl::Duration, http_body_timeout,
          temb::AppOptions().http_body_timeout,
          "time a REST request body has to arrive once its header has, and a "
          "response to be taken by the client");
ABSL_FLAG(std::string, log_level, "info",
          "trace | debug | info | warn | error");
ABSL_FLAG(std::string, log_format, "text", "text (key=value) | json");
ABSL_FLAG(std::string, model_repository, "",
          "folder of diffusers model folders (config.json and "
          "diffusion_pytorch_model*.safetensors) served as conditioning "
          "models, each named after its folder (docs/conditioning.md)");
ABSL_FLAG(int64_t, conditioning_cache_bytes,
          temb::AppOptions().conditioning_cache_bytes,
          "bytes of the exact cache of conditioning rows shared by the "
          "models (LRU). 0: no cache");
ABSL_FLAG(bool, serve_ready_models, false,
          "readiness (the temb.models health entry, KServe server ready) "
          "once every model of --model_repository settled, though some "
          "failed; by default (strict) it waits for every one to be ready");
ABSL_FLAG(int, model_load_threads, temb::AppOptions().model_load_threads,
          "models of --model_repository loading at once (1 to 64): a slow "
          "folder holds one, the others load beside it");
ABSL_FLAG(absl::Duration, model_load_timeout, absl::ZeroDuration(),
          "how long one model's load may take before it fails (it stops "
          "before its next tensor); 0s: no limit");
ABSL_FLAG(std::string, model_control_mode, "none",
          "who changes --model_repository's models while the server runs: "
          "none (read at start), poll (every --repository_poll_secs a "
          "folder added loads, a changed one reloads, a removed one leaves "
          "service) or explicit (the KServe repository API's load and "
          "unload)");
ABSL_FLAG(int, repository_poll_secs, 15,
          "seconds between two looks at --model_repository with "
          "--model_control_mode=poll");
ABSL_FLAG(std::string, conditioning_device, "cpu",
          "where the conditioning models' Linear layers run: cpu | cuda "
          "(cuBLASLt on the first GPU; rows differ from the CPU's by "
          "summation order, docs/conditioning.md)");
ABSL_FLAG(std::string, presets_file, "",
          "temb.v1.PresetCatalog text proto replacing the built-in presets");
ABSL_FLAG(absl::Duration, drain_grace, absl::Seconds(15),
          "on SIGTERM/SIGINT/SIGHUP, how long in-flight calls may finish "
          "(0s to 24h)");
ABSL_FLAG(int64_t, max_inflight, 1024,
          "most calls being validated or computed at once (answers being "
          "sent count only in --max_queued_bytes); "
          "beyond it RESOURCE_EXHAUSTED at once. 0: unlimited");
ABSL_FLAG(int64_t, max_queued_bytes, int64_t{512} << 20,
          "most bytes of requests plus responses held by admitted calls; "
          "beyond it RESOURCE_EXHAUSTED at once. 0: unlimited");
ABSL_FLAG(int64_t, shm_max_regions, temb::AppOptions().shm_max_regions,
          "system shared memory regions clients may register at once (each "
          "holds one descriptor); beyond it RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, grpc_memory_quota,
          temb::AppOptions().grpc_memory_quota_bytes,
          "bytes gRPC may hold for connections before any handler runs "
          "(read buffers, header blocks, call arenas); beyond it gRPC stops "
          "reading and closes the connections holding memory. Bounds an "
          "endless HTTP/2 header block (CVE-2023-33953). 0: unlimited");
ABSL_FLAG(std::string, on_backend_failure, "not_serving",
          "when the backend fails a computation: not_serving (UNAVAILABLE and "
          "health NOT_SERVING until restarted) | fallback_cpu (recompute on "
          "a CPU backend from then on)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM server certificate chain; with --tls_key, serve TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle; require client certificates signed by it (mTLS)");
ABSL_FLAG(std::string, auth_token_file, "",
          "file of accepted bearer tokens, one per line; temb.v1 and "
          "inference calls without one get UNAUTHENTICATED (health and "
          "reflection stay open)");

namespace {

int Fail(const absl::Status& status) {
  temb::LogEvent(temb::LogLevel::kError, "startup_failed",
                 {{"error", status.ToString()}});
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  temb::BlockTerminationSignals();  // before gRPC starts any thread
  // Large responses allocate and free buffers of several MiB per call.  With
  // glibc's defaults they go back to the kernel (mmap, heap trimming) and the
  // next call faults every page in again: 14% of the server's CPU on 5 MiB
  // responses.  Keeping up to 64 MiB of free heap per arena raised 5 MiB
  // response throughput by ~40% (docs/benchmarks.md).  32 MiB is the largest
  // mmap threshold glibc accepts.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
  // Debian's Abseil is built without NDEBUG, so every absl::Mutex (gRPC's
  // too) records a lock-order graph for deadlock detection: about 6% of the
  // server's CPU on small requests.  A debugging aid the tests keep and a
  // serving process does without.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage(
      "Serves sinusoidal timestep embeddings over gRPC.");
  absl::ParseCommandLine(argc, argv);
  if (absl::Status status = temb::ConfigureLogging(
          absl::GetFlag(FLAGS_log_level), absl::GetFlag(FLAGS_log_format));
      !status.ok()) {
    std::fprintf(stderr, "%s\n", std::string(status.message()).c_str());
    return 2;
  }
  auto backend = temb::ParseBackendChoice(absl::GetFlag(FLAGS_backend));
  if (!backend.ok()) return Fail(backend.status());
  auto on_backend_failure =
      temb::ParseBackendFailurePolicy(absl::GetFlag(FLAGS_on_backend_failure));
  if (!on_backend_failure.ok()) return Fail(on_backend_failure.status());
  const std::string conditioning_device =
      absl::GetFlag(FLAGS_conditioning_device);
  if (conditioning_device != "cpu" && conditioning_device != "cuda") {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--conditioning_device must be cpu or cuda, got \"",
                     conditioning_device, "\"")));
  }

  const absl::StatusOr<temb::ModelControlMode> control_mode =
      temb::ParseModelControlMode(absl::GetFlag(FLAGS_model_control_mode));
  if (!control_mode.ok()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--model_control_mode ", control_mode.status().message())));
  }

  temb::AppOptions options;
  options.address = absl::GetFlag(FLAGS_address);
  options.backend = *backend;
  options.backend_options.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  options.backend_options.gpu_min_output_bytes =
      absl::GetFlag(FLAGS_gpu_min_output_bytes);
  options.limits.max_batch = absl::GetFlag(FLAGS_max_batch);
  options.limits.max_dim = absl::GetFlag(FLAGS_max_dim);
  options.limits.max_output_bytes = absl::GetFlag(FLAGS_max_output_bytes);
  options.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  options.http_address = absl::GetFlag(FLAGS_http_address);
  options.presets_file = absl::GetFlag(FLAGS_presets_file);
  options.model_repository = absl::GetFlag(FLAGS_model_repository);
  options.conditioning_cache_bytes =
      absl::GetFlag(FLAGS_conditioning_cache_bytes);
  options.serve_ready_models = absl::GetFlag(FLAGS_serve_ready_models);
  options.model_load_threads = absl::GetFlag(FLAGS_model_load_threads);
  options.model_load_timeout = absl::GetFlag(FLAGS_model_load_timeout);
  options.model_control_mode = *control_mode;
  options.repository_poll =
      absl::Seconds(absl::GetFlag(FLAGS_repository_poll_secs));
  options.conditioning_device = conditioning_device == "cuda"
                                    ? temb::BackendChoice::kCuda
                                    : temb::BackendChoice::kCpu;
  options.drain_grace = absl::GetFlag(FLAGS_drain_grace);
  options.admission.max_inflight = absl::GetFlag(FLAGS_max_inflight);
  options.admission.max_queued_bytes = absl::GetFlag(FLAGS_max_queued_bytes);
  options.grpc_memory_quota_bytes = absl::GetFlag(FLAGS_grpc_memory_quota);
  options.shm_max_regions = absl::GetFlag(FLAGS_shm_max_regions);
  options.http_max_connections = absl::GetFlag(FLAGS_http_max_connections);
  options.http_max_header_bytes = absl::GetFlag(FLAGS_http_max_header_bytes);
  options.http_header_timeout = absl::GetFlag(FLAGS_http_header_timeout);
  options.http_body_timeout = absl::GetFlag(FLAGS_http_body_timeout);
  options.on_backend_failure = *on_backend_failure;
  options.tls = {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                 absl::GetFlag(FLAGS_tls_client_ca)};
  options.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);

  auto app = temb::App::Start(options);
  if (!app.ok()) return Fail(app.status());
  for (const auto& [path, port] :
       {std::pair{absl::GetFlag(FLAGS_port_file), (*app)->port()},
        std::pair{absl::GetFlag(FLAGS_metrics_port_file),
                  (*app)->metrics_port()},
        std::pair{absl::GetFlag(FLAGS_http_port_file), (*app)->http_port()}}) {
    if (path.empty() || port == 0) continue;  // 0: metrics or REST disabled
    if (absl::Status status =
            temb::WriteFileAtomically(path, absl::StrCat(port, "\n"));
        !status.ok()) {
      return Fail(status);
    }
  }

  // SIGHUP (a closed terminal, or a supervisor's "reload") drains like
  // SIGTERM: the server has nothing to reload, and dying at once would drop
  // every call in flight.
  const int signal_number = temb::WaitForTerminationSignal();
  temb::LogEvent(temb::LogLevel::kInfo, "signal",
                 {{"signal", strsignal(signal_number)},
                  {"number", signal_number},
                  {"action", "drain"}});
  (*app)->Shutdown();
  return 0;
}
