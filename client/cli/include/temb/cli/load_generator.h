// LoadGenerator: drives Embed calls against a server and records what
// happened, for `temb bench`.
//
// Two loops:
//   * closed (rate == 0): `concurrency` workers, each issuing its next call
//     when the previous one completes;
//   * open (rate > 0): calls start on a schedule (uniform or Poisson
//     arrivals) whether or not earlier calls have completed.  Latency is
//     measured from the scheduled start, so a stalled server shows up in the
//     percentiles instead of silently slowing the schedule down
//     ("coordinated omission").
// Calls use gRPC's callback API: outstanding calls cost no threads.  In
// stream mode the calls are spread over `concurrency` EmbedStream streams
// (round-robin in the open loop), each answering in order.
//
// Calls whose scheduled start falls in the warm-up period are made but not
// recorded.
#ifndef TEMB_CLI_LOAD_GENERATOR_H_
#define TEMB_CLI_LOAD_GENERATOR_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "temb/client/temb_client.h"
#include "temb/v1/temb.pb.h"

namespace temb::cli {

struct LoadOptions {
  enum class Mode { kUnary, kStream };
  Mode mode = Mode::kUnary;
  int concurrency = 8;
  double rate = 0;  // calls per second; 0 = closed loop
  bool poisson = true;
  absl::Duration warmup = absl::Seconds(1);
  // After the warm-up: run for `duration`, or make exactly `requests`
  // recorded calls when requests > 0.
  absl::Duration duration = absl::Seconds(10);
  int64_t requests = 0;
};

struct LoadResult {
  int64_t ok = 0;
  std::map<int, int64_t> errors;  // grpc status code -> count
  // From the end of the warm-up to the last recorded completion.
  double seconds = 0;
  std::vector<int64_t> latencies_ns;  // successful calls, sorted

  int64_t requests() const;
  // Exact quantile (nearest rank) of the latencies, q in [0, 1]; 0 if empty.
  int64_t LatencyQuantileNs(double q) const;
};

// Live counters for a progress display; safe to read from any thread.
struct LoadProgress {
  std::atomic<int64_t> completed{0};
  std::atomic<int64_t> failed{0};
};

class LoadGenerator {
 public:
  LoadGenerator(Client* client, v1::EmbedRequest request, LoadOptions options);
  // Condition calls of a conditioning model instead of Embed calls (unary
  // mode only).
  LoadGenerator(Client* client, v1::ConditionRequest request,
                LoadOptions options);
  ~LoadGenerator();

  LoadGenerator(const LoadGenerator&) = delete;
  LoadGenerator& operator=(const LoadGenerator&) = delete;

  // Blocks until the run is over and every call has completed.  Call once.
  LoadResult Run();

  const LoadProgress& progress() const { return progress_; }

 private:
  using Clock = std::chrono::steady_clock;
  LoadGenerator(Client* client, v1::EmbedRequest request,
                std::optional<v1::ConditionRequest> condition,
                LoadOptions options);
  class StreamReactor;
  struct StreamSlot;

  // Starts one call scheduled at `intended` on stream slot `slot` (stream
  // mode) and calls OnComplete when it ends.
  void Issue(Clock::time_point intended, int slot);
  void OnComplete(Clock::time_point intended, int slot, int code);
  // Whether a call scheduled at `intended` should still be made; counts it.
  bool Admit(Clock::time_point intended);
  void RunOpenLoop();
  void CloseStreams();

  Client* client_;
  const v1::EmbedRequest request_;
  const std::optional<v1::ConditionRequest> condition_;
  const LoadOptions options_;
  Clock::time_point measure_start_;
  Clock::time_point end_;  // only without options_.requests

  std::atomic<int64_t> admitted_{0};
  std::vector<std::unique_ptr<StreamSlot>> slots_;

  std::mutex mu_;
  std::condition_variable cv_;
  int64_t outstanding_ = 0;            // guarded by mu_
  int live_streams_ = 0;               // guarded by mu_
  LoadResult result_;                  // guarded by mu_
  Clock::time_point last_completion_;  // guarded by mu_
  LoadProgress progress_;
};

}  // namespace temb::cli

#endif  // TEMB_CLI_LOAD_GENERATOR_H_
