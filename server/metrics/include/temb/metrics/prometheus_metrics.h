// Prometheus metrics for temb-server, fed by the frontends through the
// RequestObserver interface and served on /metrics.
//
//   temb_requests_total{method,code}        counter
//   temb_request_latency_seconds{method}    histogram, 50 us .. 1 s
//   temb_batch_size                          histogram of successful requests
//   temb_output_bytes_total                  counter of embedding bytes
//                                            returned
//   temb_inflight_requests                   gauge
//   temb_backend_info{backend,device}        gauge, always 1
//   temb_rejected_requests_total{reason}     counter of calls refused before
//                                            any work (see RequestObserver)
//   temb_backend_failures_total{backend,action}  counter
//   temb_serving_state{state}                gauge, 1 for the current state
//                                            (serving|draining|backend_failed)
// and, read from admission when scraped:
//   temb_queued_bytes                        gauge, bytes held by admitted
//                                            calls (answers until written)
//   temb_queued_bytes_limit                  gauge, --max_queued_bytes
// and, read from the conditioning models when scraped:
//   temb_conditioning_model_state{model,state}  gauge, 1 for the model's
//                                            state (loading|ready|failed)
//   temb_conditioning_model_weight_bytes{model}  gauge, checkpoint bytes held
//   temb_conditioning_cache_hits_total       counter of rows taken from the
//   temb_conditioning_cache_misses_total     row cache / computed for it
//   temb_conditioning_cache_evictions_total  counter
//   temb_conditioning_cache_bytes            gauge, bytes held (keys+rows)
//   temb_conditioning_cache_entries          gauge
//   temb_conditioning_cache_capacity_bytes   gauge
#ifndef TEMB_METRICS_PROMETHEUS_METRICS_H_
#define TEMB_METRICS_PROMETHEUS_METRICS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "temb/core/admission.h"
#include "temb/core/conditioning_service.h"
#include "temb/core/request_observer.h"

namespace temb {

// Thread-safe.
class PrometheusMetrics final : public RequestObserver {
 public:
  PrometheusMetrics(absl::string_view backend, absl::string_view device);
  ~PrometheusMetrics() override;

  // Starts the HTTP exposer on HOST:PORT (port 0 picks one) and returns the
  // bound port.  UNAVAILABLE when the address cannot be bound.  Call once.
  absl::StatusOr<int> Serve(const std::string& address);

  // Adds the conditioning models' and row cache's metrics, read from
  // `service` (which must outlive this) at every scrape.  Call once.
  void WatchConditioning(const ConditioningService* service);
  // Adds the admission gauges, read from `admission` (which must outlive
  // this) at every scrape.  Call once.
  void WatchAdmission(const AdmissionController* admission);

  // The current metrics in the Prometheus text format (what /metrics serves).
  std::string TextExposition() const;

  void OnStart(absl::string_view method) override;
  void OnFinish(const RequestRecord& record) override;
  void OnRejected(absl::string_view reason) override;
  void OnBackendFailure(absl::string_view backend, const absl::Status& error,
                        absl::string_view action) override;
  void OnServingChanged(absl::string_view state) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace temb

#endif  // TEMB_METRICS_PROMETHEUS_METRICS_H_
