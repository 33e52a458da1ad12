// RequestObserver: how frontends report finished requests to metrics and
// request logs without the core (or the frontends) knowing about Prometheus
// or the logger.  Frontends time requests themselves with RequestTimer, so the
// latency covers conversion and serialisation preparation too.
#ifndef TEMB_CORE_REQUEST_OBSERVER_H_
#define TEMB_CORE_REQUEST_OBSERVER_H_

#include <chrono>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace temb {

// One finished request.  The views are valid only during OnFinish().
struct RequestRecord {
  absl::string_view method;  // e.g. "Embed", "EmbedStream", "ModelInfer"
  absl::string_view request_id;
  const absl::Status* status = nullptr;  // never null in OnFinish()
  double latency_seconds = 0;
  int64_t batch = 0;         // timesteps in the request (0 if unknown)
  int64_t output_bytes = 0;  // bytes of the embedding returned (0 on error)
};

// Implementations must be thread-safe: frontends call them from any thread.
class RequestObserver {
 public:
  virtual ~RequestObserver() = default;
  virtual void OnStart(absl::string_view method) = 0;
  virtual void OnFinish(const RequestRecord& record) = 0;

  // Server events, for alerting; ignored unless overridden.
  // A call refused before any work: "unauthenticated", "draining",
  // "backend_failed", "deadline_exceeded", "max_inflight", "max_queued_bytes".
  virtual void OnRejected(absl::string_view /*reason*/) {}
  // The backend failed a computation; `action` is what the server did about
  // it ("not_serving" or "fallback_cpu").
  virtual void OnBackendFailure(absl::string_view /*backend*/,
                                const absl::Status& /*error*/,
                                absl::string_view /*action*/) {}
  // "serving", "draining" or "backend_failed".
  virtual void OnServingChanged(absl::string_view /*state*/) {}
};

// Forwards to several observers, in order.  Not owning.
class ObserverList final : public RequestObserver {
 public:
  explicit ObserverList(std::vector<RequestObserver*> observers)
      : observers_(std::move(observers)) {}
  void OnStart(absl::string_view method) override {
    for (RequestObserver* o : observers_) o->OnStart(method);
  }
  void OnFinish(const RequestRecord& record) override {
    for (RequestObserver* o : observers_) o->OnFinish(record);
  }
  void OnRejected(absl::string_view reason) override {
    for (RequestObserver* o : observers_) o->OnRejected(reason);
  }
  void OnBackendFailure(absl::string_view backend, const absl::Status& error,
                        absl::string_view action) override {
    for (RequestObserver* o : observers_) {
      o->OnBackendFailure(backend, error, action);
    }
  }
  void OnServingChanged(absl::string_view state) override {
    for (RequestObserver* o : observers_) o->OnServingChanged(state);
  }

 private:
  std::vector<RequestObserver*> observers_;
};

// Reports OnStart on construction and OnFinish exactly once: from Finish(),
// or from the destructor with UNKNOWN if Finish() was never called.  A null
// observer makes it a no-op.  Not thread-safe (one request, one owner).
class RequestTimer {
 public:
  RequestTimer(RequestObserver* observer, absl::string_view method)
      : observer_(observer),
        method_(method),
        start_(std::chrono::steady_clock::now()) {
    if (observer_ != nullptr) observer_->OnStart(method_);
  }
  RequestTimer(const RequestTimer&) = delete;
  RequestTimer& operator=(const RequestTimer&) = delete;
  ~RequestTimer() {
    if (observer_ != nullptr) Finish(absl::UnknownError("request abandoned"));
  }

  void Finish(const absl::Status& status, int64_t batch = 0,
              int64_t output_bytes = 0, absl::string_view request_id = {}) {
    if (observer_ == nullptr) return;
    RequestRecord record;
    record.method = method_;
    record.request_id = request_id;
    record.status = &status;
    record.latency_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
            .count();
    record.batch = batch;
    record.output_bytes = output_bytes;
    RequestObserver* observer = observer_;
    observer_ = nullptr;
    observer->OnFinish(record);
  }

 private:
  RequestObserver* observer_;
  absl::string_view method_;  // a literal owned by the caller
  std::chrono::steady_clock::time_point start_;
};

}  // namespace temb

#endif  // TEMB_CORE_REQUEST_OBSERVER_H_
