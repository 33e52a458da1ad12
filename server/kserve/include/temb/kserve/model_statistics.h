// Triton's statistics extension for the KServe v2 frontends (gRPC
// ModelStatistics, REST GET /v2/models/{m}/stats): per model, cumulative
// counts and durations of inference requests, as Triton reports them.
//
// Phases of one request, in temb's terms (Triton's names):
//   queue           from receipt until admitted (AdmissionController)
//   compute_input   reading the wire format into a ModelInferRequest
//                   (protobuf parse; JSON and binary tensor data for REST)
//   compute_infer   kserve::Infer: checking the tensors, computing the
//                   embedding, filling the response message
//   compute_output  framing the response for the wire (gRPC message, JSON)
//   success / fail  from receipt until the response is ready to send
// The parts of `success` that are none of the four (authentication, for
// instance) are what perf_analyzer prints as "overhead".
//
// No gRPC and no HTTP types: both frontends record through
// InferStatsTimer.  Thread-safe and lock-free: the models are the preset
// catalogue, fixed when the server starts, and each counter is an atomic.
#ifndef TEMB_KSERVE_MODEL_STATISTICS_H_
#define TEMB_KSERVE_MODEL_STATISTICS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "inference/grpc_service.pb.h"

namespace temb::kserve {

enum class InferPhase { kQueue, kComputeInput, kComputeInfer, kComputeOutput };

class InferenceStatistics {
 public:
  // One entry per model name (ServedModels::Names()), all zero.
  explicit InferenceStatistics(const std::vector<std::string>& models);
  ~InferenceStatistics();
  InferenceStatistics(const InferenceStatistics&) = delete;
  InferenceStatistics& operator=(const InferenceStatistics&) = delete;

  // One finished request for `model` (ignored for a name that is not a
  // model).  `phase_ns` is indexed by InferPhase.  A successful request adds
  // `batch` inferences and one execution.
  void Record(absl::string_view model, bool success, int64_t batch,
              int64_t total_ns, const int64_t (&phase_ns)[4]);

  // The statistics of model `name` at `version` ("" or "1"); an empty name
  // means every model, in catalogue order.  NOT_FOUND for an unknown model
  // or version.
  absl::Status Fill(absl::string_view name, absl::string_view version,
                    inference::ModelStatisticsResponse* response) const;

 private:
  struct Entry;
  Entry* Find(absl::string_view name) const;

  // In catalogue order; few enough (tens) that a scan beats hashing.
  std::vector<std::unique_ptr<Entry>> entries_;
};

// Times one inference request.  Construct it when the request arrives, call
// Lap() at the end of each phase (the time since the previous lap, or since
// construction, goes to that phase), then Finish() once.  A null
// `statistics` makes it a no-op.  Not thread-safe (one request, one owner).
class InferStatsTimer {
 public:
  explicit InferStatsTimer(InferenceStatistics* statistics)
      : statistics_(statistics), start_(Clock::now()), last_(start_) {}

  void Lap(InferPhase phase) {
    const Clock::time_point now = Clock::now();
    phase_ns_[static_cast<int>(phase)] += Nanoseconds(now - last_);
    last_ = now;
  }

  // `model` is the request's model name (requests for unknown models are
  // not counted); `batch` the timesteps answered.
  void Finish(const absl::Status& status, absl::string_view model,
              int64_t batch) {
    if (statistics_ == nullptr) return;
    statistics_->Record(model, status.ok(), batch,
                        Nanoseconds(Clock::now() - start_), phase_ns_);
    statistics_ = nullptr;
  }

 private:
  using Clock = std::chrono::steady_clock;
  static int64_t Nanoseconds(Clock::duration d) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  }

  InferenceStatistics* statistics_;
  Clock::time_point start_;
  Clock::time_point last_;
  int64_t phase_ns_[4] = {0, 0, 0, 0};
};

}  // namespace temb::kserve

#endif  // TEMB_KSERVE_MODEL_STATISTICS_H_
