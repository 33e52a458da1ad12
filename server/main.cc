// temb-server: parses flags into AppOptions, serves until SIGTERM/SIGINT,
// then drains and exits 0.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "server/app/app.h"
#include "server/app/logging.h"
#include "server/app/signals.h"

ABSL_FLAG(std::string, address, "0.0.0.0:50051",
          "gRPC listen address HOST:PORT; port 0 picks a free port");
ABSL_FLAG(std::string, port_file, "",
          "write the bound gRPC port to this file once serving");
ABSL_FLAG(std::string, backend, "auto", "auto | cpu | cuda");
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
ABSL_FLAG(std::string, log_level, "info",
          "trace | debug | info | warn | error");
ABSL_FLAG(std::string, log_format, "text", "text (key=value) | json");
ABSL_FLAG(std::string, presets_file, "",
          "temb.v1.PresetCatalog text proto replacing the built-in presets");
ABSL_FLAG(absl::Duration, drain_grace, absl::Seconds(15),
          "on SIGTERM/SIGINT, how long in-flight calls may finish");

namespace {

int Fail(const absl::Status& status) {
  temb::LogEvent(temb::LogLevel::kError, "startup_failed",
                 {{"error", status.ToString()}});
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  temb::BlockTerminationSignals();  // before gRPC starts any thread
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

  temb::AppOptions options;
  options.address = absl::GetFlag(FLAGS_address);
  options.backend = *backend;
  options.backend_options.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  options.limits.max_batch = absl::GetFlag(FLAGS_max_batch);
  options.limits.max_dim = absl::GetFlag(FLAGS_max_dim);
  options.limits.max_output_bytes = absl::GetFlag(FLAGS_max_output_bytes);
  options.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  options.presets_file = absl::GetFlag(FLAGS_presets_file);
  options.drain_grace = absl::GetFlag(FLAGS_drain_grace);

  auto app = temb::App::Start(options);
  if (!app.ok()) return Fail(app.status());
  for (const auto& [path, port] :
       {std::pair{absl::GetFlag(FLAGS_port_file), (*app)->port()},
        std::pair{absl::GetFlag(FLAGS_metrics_port_file),
                  (*app)->metrics_port()}}) {
    if (path.empty() || port == 0) continue;  // 0: metrics disabled
    if (absl::Status status =
            temb::WriteFileAtomically(path, absl::StrCat(port, "\n"));
        !status.ok()) {
      return Fail(status);
    }
  }

  const int signal_number = temb::WaitForTerminationSignal();
  temb::LogEvent(temb::LogLevel::kInfo, "signal",
                 {{"signal", strsignal(signal_number)}});
  (*app)->Shutdown();
  return 0;
}
