// temb bench: load test of a server, with a latency report.
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "temb/cli/commands.h"
#include "temb/cli/common.h"
#include "temb/cli/load_generator.h"
#include "temb/client/temb_client.h"

namespace temb::cli {
namespace {

std::vector<FlagSpec> BenchFlags() {
  std::vector<FlagSpec> specs = ConnectionFlags();
  std::vector<FlagSpec> spec_flags = SpecFlags();
  specs.insert(specs.end(), spec_flags.begin(), spec_flags.end());
  const std::vector<FlagSpec> own = {
      {"mode", FlagType::kString, "unary | stream (default unary)"},
      {"concurrency", FlagType::kInt,
       "closed loop: calls in flight; stream mode: streams (default 8)"},
      {"rate", FlagType::kDouble,
       "open loop: calls per second (default 0 = closed loop)"},
      {"arrivals", FlagType::kString, "open loop: poisson | uniform"},
      {"duration", FlagType::kDuration, "measured time (default 10s)"},
      {"requests", FlagType::kInt, "measured calls (instead of --duration)"},
      {"warmup", FlagType::kDuration, "unrecorded lead-in (default 1s)"},
      {"batch", FlagType::kInt, "timesteps per call (default 1)"},
      {"part", FlagType::kStrings,
       "NAME:TIMESTEPS: call with parts instead of --batch timesteps "
       "(repeatable), e.g. --preset=flux --part=timestep:0.5 "
       "--part=guidance:3.5"},
      {"model", FlagType::kString,
       "a conditioning model of the server: Condition calls of --batch "
       "timesteps instead of Embed calls (unary mode)"},
      {"guidance", FlagType::kDouble,
       "with --model: the guidance scale each call gives"},
      {"json", FlagType::kBool, "print the report as JSON"},
      {"allow_errors", FlagType::kBool, "exit 0 even when calls failed"},
      {"help", FlagType::kBool, "show this help"},
  };
  specs.insert(specs.end(), own.begin(), own.end());
  return specs;
}

// A `\r` progress line once a second, only for a person at a terminal.
class ProgressLine {
 public:
  explicit ProgressLine(const LoadProgress& progress) {
    if (!isatty(STDERR_FILENO)) return;
    thread_ = std::thread([this, &progress] {
      const auto start = std::chrono::steady_clock::now();
      int64_t last = 0;
      std::unique_lock<std::mutex> lock(mu_);
      while (!cv_.wait_for(lock, std::chrono::seconds(1),
                           [this] { return done_; })) {
        const int64_t done = progress.completed.load() + progress.failed.load();
        std::fprintf(stderr, "\r%6.0fs  %10lld calls  %8lld/s  %lld failed   ",
                     std::chrono::duration<double>(
                         std::chrono::steady_clock::now() - start)
                         .count(),
                     static_cast<long long>(done),
                     static_cast<long long>(done - last),
                     static_cast<long long>(progress.failed.load()));
        last = done;
      }
      std::fprintf(stderr, "\r%70s\r", "");
    });
  }
  ~ProgressLine() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

std::string Report(const LoadResult& r, const LoadOptions& o, int64_t batch,
                   bool json) {
  const double seconds = r.seconds > 0 ? r.seconds : 0;
  const double rps = seconds > 0 ? r.requests() / seconds : 0;
  const double eps = seconds > 0 ? r.ok * batch / seconds : 0;
  double mean_ns = 0;
  for (int64_t v : r.latencies_ns) mean_ns += static_cast<double>(v);
  if (!r.latencies_ns.empty()) mean_ns /= r.latencies_ns.size();
  const auto us = [&](double q) { return r.LatencyQuantileNs(q) / 1e3; };
  const std::string mode =
      o.mode == LoadOptions::Mode::kStream ? "stream" : "unary";
  if (json) {
    std::vector<std::string> errors;
    for (const auto& [code, count] : r.errors) {
      errors.push_back(
          absl::StrFormat("\"%s\": %d", StatusCodeName(code), count));
    }
    return absl::StrFormat(
        "{\"requests\": %d, \"ok\": %d, \"errors\": {%s}, "
        "\"throughput_rps\": %.3f, \"embeddings_per_s\": %.3f, "
        "\"latency_us\": {\"min\": %.3f, \"mean\": %.3f, \"p50\": %.3f, "
        "\"p90\": %.3f, \"p95\": %.3f, \"p99\": %.3f, \"p999\": %.3f, "
        "\"max\": %.3f}, \"duration_s\": %.6f, \"mode\": \"%s\", "
        "\"concurrency\": %d, \"rate\": %.3f, \"batch\": %d}\n",
        r.requests(), r.ok, absl::StrJoin(errors, ", "), rps, eps, us(0),
        mean_ns / 1e3, us(0.5), us(0.9), us(0.95), us(0.99), us(0.999), us(1),
        seconds, mode, o.concurrency, o.rate, batch);
  }
  std::string out = absl::StrFormat(
      "mode %s, %s, batch %d\n"
      "requests      %d (%d ok)\n",
      mode,
      o.rate > 0
          ? absl::StrFormat("open loop %.1f/s (%s)", o.rate,
                            o.poisson ? "poisson" : "uniform")
          : absl::StrFormat("closed loop, concurrency %d", o.concurrency),
      batch, r.requests(), r.ok);
  for (const auto& [code, count] : r.errors) {
    absl::StrAppendFormat(&out, "  %-20s %d\n", StatusCodeName(code), count);
  }
  absl::StrAppendFormat(
      &out,
      "duration      %.3f s\n"
      "throughput    %.1f requests/s, %.1f embeddings/s\n"
      "latency (us)  min %.1f  mean %.1f  p50 %.1f  p90 %.1f  "
      "p95 %.1f  p99 %.1f  p999 %.1f  max %.1f\n",
      seconds, rps, eps, us(0), mean_ns / 1e3, us(0.5), us(0.9), us(0.95),
      us(0.99), us(0.999), us(1));
  return out;
}

}  // namespace

int RunBench(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> specs = BenchFlags();
  absl::StatusOr<Args> args = Args::Parse(specs, argv);
  if (!args.ok()) {
    return PrintUsage("bench", std::string(args.status().message()), specs);
  }
  if (args->Bool("help").value_or(false)) {
    std::cout << "usage: temb bench [flags]\n" << FlagHelp(specs);
    return kExitOk;
  }
  absl::StatusOr<ClientOptions> client_options = ClientOptionsFromArgs(*args);
  absl::StatusOr<SpecRequest> spec = SpecRequestFromArgs(*args);
  for (const absl::Status& s : {client_options.status(), spec.status()}) {
    if (!s.ok()) return PrintUsage("bench", std::string(s.message()), specs);
  }
  LoadOptions load;
  const std::string mode = args->String("mode").value_or("unary");
  const std::string arrivals = args->String("arrivals").value_or("poisson");
  load.concurrency = static_cast<int>(args->Int("concurrency").value_or(8));
  load.rate = args->Double("rate").value_or(0);
  load.duration = args->Duration("duration").value_or(absl::Seconds(10));
  load.requests = args->Int("requests").value_or(0);
  load.warmup = args->Duration("warmup").value_or(absl::Seconds(1));
  absl::StatusOr<std::vector<PartArgs>> parts =
      ParseParts(args->Strings("part"));
  if (!parts.ok())
    return PrintUsage("bench", std::string(parts.status().message()), specs);
  int64_t batch = args->Int("batch").value_or(1);
  std::string problem;
  if (mode != "unary" && mode != "stream")
    problem = "--mode must be unary or stream";
  if (arrivals != "poisson" && arrivals != "uniform") {
    problem = "--arrivals must be poisson or uniform";
  }
  if (load.concurrency < 1 || load.concurrency > 100000) {
    problem = "--concurrency must be in [1, 100000]";
  }
  if (load.rate < 0) problem = "--rate must be >= 0";
  if (load.duration <= absl::ZeroDuration())
    problem = "--duration must be positive";
  if (load.warmup < absl::ZeroDuration()) problem = "--warmup must be >= 0";
  if (load.requests < 0) problem = "--requests must be >= 0";
  if (batch < 0) problem = "--batch must be >= 0";
  if (!parts->empty() && args->Has("batch")) {
    problem = "give --batch or --part, not both";
  }
  const bool conditioning = args->Has("model");
  if (conditioning && (mode == "stream" || !parts->empty() || batch < 1)) {
    problem = "--model takes unary calls of --batch (>= 1) timesteps";
  }
  if (!conditioning && args->Has("guidance")) {
    problem = "--guidance goes with --model";
  }
  if (!problem.empty()) return PrintUsage("bench", problem, specs);
  load.mode =
      mode == "stream" ? LoadOptions::Mode::kStream : LoadOptions::Mode::kUnary;
  load.poisson = arrivals == "poisson";
  // Without any convention the server would refuse every call.
  if (spec->preset.empty() && !spec->dim) spec->preset = "sdxl";

  // Spread over a diffusion schedule, so that the angles cover a real range.
  std::vector<float> timesteps(static_cast<size_t>(batch));
  for (size_t i = 0; i < timesteps.size(); ++i) {
    timesteps[i] = static_cast<float>((i * 37) % 1000);
  }
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Create(*client_options);
  if (!client.ok()) return PrintError(client.status());
  v1::EmbedRequest request = EmbedRequestFor(*spec, timesteps);
  if (!parts->empty()) {
    request = PartsRequestFor(*spec, *parts);
    batch = 0;  // embeddings per call: every part's timesteps
    for (const PartArgs& part : *parts) {
      batch += static_cast<int64_t>(part.timesteps.size());
    }
  }
  // A conditioning model's rows of the same timesteps (and guidance).
  v1::ConditionRequest condition;
  if (conditioning) {
    condition.set_model(*args->String("model"));
    *condition.add_inputs() = Float32Input(
        "timesteps", timesteps, {static_cast<int64_t>(timesteps.size())});
    if (args->Has("guidance")) {
      *condition.add_inputs() = Float32Input(
          "guidance", {static_cast<float>(*args->Double("guidance"))}, {1});
    }
  }
  const std::unique_ptr<LoadGenerator> generator =
      conditioning
          ? std::make_unique<LoadGenerator>(client->get(), condition, load)
          : std::make_unique<LoadGenerator>(client->get(), request, load);
  LoadResult result;
  {
    ProgressLine progress(generator->progress());
    result = generator->Run();
  }
  std::cout << Report(result, load, batch, args->Bool("json").value_or(false))
            << std::flush;
  if (!result.errors.empty() && !args->Bool("allow_errors").value_or(false)) {
    std::cerr << "error: " << result.requests() - result.ok
              << " calls failed (--allow_errors to accept)" << std::endl;
    return kExitError;
  }
  return kExitOk;
}

}  // namespace temb::cli
