#include "temb/metrics/prometheus_metrics.h"

#include <array>
#include <exception>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace temb {
namespace {

constexpr int kStatusCodes = 17;  // absl::StatusCode OK .. UNAUTHENTICATED

// From a small cached CPU request (~50 us) to a large GPU batch (~1 s).
const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* const buckets =
      new prometheus::Histogram::BucketBoundaries{
          50e-6, 100e-6, 250e-6, 500e-6, 1e-3,   2.5e-3, 5e-3,
          10e-3, 25e-3,  50e-3,  100e-3, 250e-3, 500e-3, 1.0};
  return *buckets;
}

// Powers of two up to the default max_batch.
prometheus::Histogram::BucketBoundaries BatchBuckets() {
  prometheus::Histogram::BucketBoundaries buckets;
  for (double b = 1; b <= 65536; b *= 2) buckets.push_back(b);
  return buckets;
}

// The conditioning models' state and the row cache's counters, as the
// service holds them at the moment of a scrape (nothing to keep in step).
class ConditioningCollectable final : public prometheus::Collectable {
 public:
  explicit ConditioningCollectable(const ConditioningService* service)
      : service_(service) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> families;
    prometheus::MetricFamily state =
        Family("temb_conditioning_model_state",
               "1 for each conditioning model's state (loading, ready, failed, "
               "unloaded)",
               prometheus::MetricType::Gauge);
    prometheus::MetricFamily weights =
        Family("temb_conditioning_model_weight_bytes",
               "Checkpoint bytes a conditioning model holds",
               prometheus::MetricType::Gauge);
    for (const ConditioningModelInfo& model : service_->Models()) {
      for (const ModelState each :
           {ModelState::kLoading, ModelState::kReady, ModelState::kFailed,
            ModelState::kUnloaded}) {
        prometheus::ClientMetric metric;
        metric.label = {{"model", model.name},
                        {"state", std::string(ModelStateName(each))}};
        metric.gauge.value = model.state == each ? 1 : 0;
        state.metric.push_back(std::move(metric));
      }
      prometheus::ClientMetric metric;
      metric.label = {{"model", model.name}};
      metric.gauge.value = static_cast<double>(model.weight_bytes);
      weights.metric.push_back(std::move(metric));
    }
    families.push_back(std::move(state));
    families.push_back(std::move(weights));
    const models::RowCacheStats cache = service_->cache_stats();
    families.push_back(One("temb_conditioning_cache_hits_total",
                           "Conditioning rows taken from the row cache",
                           prometheus::MetricType::Counter, cache.hits));
    families.push_back(One("temb_conditioning_cache_misses_total",
                           "Conditioning rows computed (not in the cache)",
                           prometheus::MetricType::Counter, cache.misses));
    families.push_back(One("temb_conditioning_cache_evictions_total",
                           "Rows evicted from the row cache",
                           prometheus::MetricType::Counter, cache.evictions));
    families.push_back(One("temb_conditioning_cache_bytes",
                           "Bytes the row cache holds (keys and rows)",
                           prometheus::MetricType::Gauge, cache.bytes));
    families.push_back(One("temb_conditioning_cache_entries",
                           "Rows the row cache holds",
                           prometheus::MetricType::Gauge, cache.entries));
    families.push_back(One("temb_conditioning_cache_capacity_bytes",
                           "The row cache's bound (--conditioning_cache_bytes)",
                           prometheus::MetricType::Gauge,
                           cache.capacity_bytes));
    return families;
  }

 private:
  static prometheus::MetricFamily Family(std::string name, std::string help,
                                         prometheus::MetricType type) {
    prometheus::MetricFamily family;
    family.name = std::move(name);
    family.help = std::move(help);
    family.type = type;
    return family;
  }

  static prometheus::MetricFamily One(std::string name, std::string help,
                                      prometheus::MetricType type,
                                      int64_t value) {
    prometheus::MetricFamily family =
        Family(std::move(name), std::move(help), type);
    prometheus::ClientMetric metric;
    if (type == prometheus::MetricType::Counter) {
      metric.counter.value = static_cast<double>(value);
    } else {
      metric.gauge.value = static_cast<double>(value);
    }
    family.metric.push_back(std::move(metric));
    return family;
  }

  const ConditioningService* const service_;
};

// What admission holds at the moment of a scrape: the bytes of admitted
// calls (their requests, and their answers until gRPC or the HTTP server has
// written them) against --max_queued_bytes.  A client that stops reading
// shows here, not in temb_inflight_requests.
class AdmissionCollectable final : public prometheus::Collectable {
 public:
  explicit AdmissionCollectable(const AdmissionController* admission)
      : admission_(admission) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    return {
        Gauge("temb_queued_bytes",
              "Bytes held by admitted calls: requests, and answers not yet "
              "written to the client",
              admission_->held_bytes()),
        Gauge("temb_queued_bytes_limit", "--max_queued_bytes (0: unlimited)",
              admission_->limits().max_queued_bytes),
    };
  }

 private:
  static prometheus::MetricFamily Gauge(std::string name, std::string help,
                                        int64_t value) {
    prometheus::MetricFamily family;
    family.name = std::move(name);
    family.help = std::move(help);
    family.type = prometheus::MetricType::Gauge;
    prometheus::ClientMetric metric;
    metric.gauge.value = static_cast<double>(value);
    family.metric.push_back(std::move(metric));
    return family;
  }

  const AdmissionController* const admission_;
};

}  // namespace

struct PrometheusMetrics::Impl {
  // Read at every scrape: the conditioning models, admission.
  std::vector<std::shared_ptr<prometheus::Collectable>> watched;
  std::shared_ptr<prometheus::Registry> registry =
      std::make_shared<prometheus::Registry>();
  prometheus::Family<prometheus::Counter>& requests =
      prometheus::BuildCounter()
          .Name("temb_requests_total")
          .Help("Finished requests by method and gRPC status code")
          .Register(*registry);
  prometheus::Family<prometheus::Histogram>& latency =
      prometheus::BuildHistogram()
          .Name("temb_request_latency_seconds")
          .Help("Server-side request latency by method")
          .Register(*registry);
  prometheus::Histogram& batch = prometheus::BuildHistogram()
                                     .Name("temb_batch_size")
                                     .Help("Timesteps per successful request")
                                     .Register(*registry)
                                     .Add({}, BatchBuckets());
  prometheus::Counter& output_bytes =
      prometheus::BuildCounter()
          .Name("temb_output_bytes_total")
          .Help("Embedding bytes returned to clients")
          .Register(*registry)
          .Add({});
  prometheus::Gauge& inflight = prometheus::BuildGauge()
                                    .Name("temb_inflight_requests")
                                    .Help("Requests being processed")
                                    .Register(*registry)
                                    .Add({});
  prometheus::Family<prometheus::Gauge>& backend_info =
      prometheus::BuildGauge()
          .Name("temb_backend_info")
          .Help("The backend computing embeddings (always 1)")
          .Register(*registry);
  prometheus::Family<prometheus::Counter>& rejected =
      prometheus::BuildCounter()
          .Name("temb_rejected_requests_total")
          .Help("Calls refused before any work, by reason")
          .Register(*registry);
  prometheus::Family<prometheus::Counter>& backend_failures =
      prometheus::BuildCounter()
          .Name("temb_backend_failures_total")
          .Help("Backend computation failures, by backend and the action taken")
          .Register(*registry);
  prometheus::Family<prometheus::Gauge>& serving_state =
      prometheus::BuildGauge()
          .Name("temb_serving_state")
          .Help("1 for the server's current state, 0 for the others")
          .Register(*registry);
  std::unique_ptr<prometheus::Exposer> exposer;

  void Watch(std::shared_ptr<prometheus::Collectable> collectable) {
    if (exposer != nullptr) exposer->RegisterCollectable(collectable);
    watched.push_back(std::move(collectable));
  }

  // The series a finished request updates.  Family::Add looks labels up in
  // a std::map and builds a throw-away metric on every call, a measurable
  // share of a small request; these handles are looked up once per method
  // and code instead (the family owns the metrics, so pointers stay valid).
  struct MethodSeries {
    prometheus::Histogram* latency = nullptr;
    std::array<prometheus::Counter*, kStatusCodes> requests{};
  };
  struct Series {
    prometheus::Histogram* latency;
    prometheus::Counter* requests;
  };

  Series SeriesFor(absl::string_view method, absl::StatusCode code) {
    const int index = static_cast<int>(code);
    if (index < 0 || index >= kStatusCodes) {  // not a canonical code
      return {&LatencyFor(method), &RequestsFor(method, code)};
    }
    {
      absl::ReaderMutexLock lock(&mu);
      const auto it = by_method.find(method);
      if (it != by_method.end() && it->second.requests[index] != nullptr) {
        return {it->second.latency, it->second.requests[index]};
      }
    }
    absl::MutexLock lock(&mu);
    MethodSeries& series = by_method[method];
    if (series.latency == nullptr) series.latency = &LatencyFor(method);
    if (series.requests[index] == nullptr) {
      series.requests[index] = &RequestsFor(method, code);
    }
    return {series.latency, series.requests[index]};
  }

  prometheus::Histogram& LatencyFor(absl::string_view method) {
    return latency.Add({{"method", std::string(method)}}, LatencyBuckets());
  }
  prometheus::Counter& RequestsFor(absl::string_view method,
                                   absl::StatusCode code) {
    return requests.Add({{"method", std::string(method)},
                         {"code", absl::StatusCodeToString(code)}});
  }

  absl::Mutex mu;
  absl::flat_hash_map<std::string, MethodSeries> by_method ABSL_GUARDED_BY(mu);
};

PrometheusMetrics::PrometheusMetrics(absl::string_view backend,
                                     absl::string_view device)
    : impl_(std::make_unique<Impl>()) {
  impl_->backend_info
      .Add({{"backend", std::string(backend)}, {"device", std::string(device)}})
      .Set(1);
  // Every reason and state exists from the start, so that alerts on
  // rate() and absent series work before the first event.
  for (const char* reason :
       {"unauthenticated", "draining", "backend_failed", "deadline_exceeded",
        "max_inflight", "max_queued_bytes"}) {
    impl_->rejected.Add({{"reason", reason}});
  }
  for (const char* state : {"serving", "draining", "backend_failed"}) {
    impl_->serving_state.Add({{"state", state}});
  }
}

PrometheusMetrics::~PrometheusMetrics() = default;

absl::StatusOr<int> PrometheusMetrics::Serve(const std::string& address) {
  // prometheus-cpp reports bind failures by throwing; keep them inside.
  try {
    auto exposer = std::make_unique<prometheus::Exposer>(address);
    exposer->RegisterCollectable(impl_->registry);
    for (const auto& collectable : impl_->watched) {
      exposer->RegisterCollectable(collectable);
    }
    const std::vector<int> ports = exposer->GetListeningPorts();
    if (ports.empty()) {
      return absl::UnavailableError(
          absl::StrCat("metrics: not listening on \"", address, "\""));
    }
    impl_->exposer = std::move(exposer);
    return ports.front();
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on \"",
                                               address, "\": ", e.what()));
  }
}

void PrometheusMetrics::WatchConditioning(const ConditioningService* service) {
  impl_->Watch(std::make_shared<ConditioningCollectable>(service));
}

void PrometheusMetrics::WatchAdmission(const AdmissionController* admission) {
  impl_->Watch(std::make_shared<AdmissionCollectable>(admission));
}

std::string PrometheusMetrics::TextExposition() const {
  std::vector<prometheus::MetricFamily> families = impl_->registry->Collect();
  for (const auto& collectable : impl_->watched) {
    for (prometheus::MetricFamily& family : collectable->Collect()) {
      families.push_back(std::move(family));
    }
  }
  return prometheus::TextSerializer().Serialize(families);
}

void PrometheusMetrics::OnStart(absl::string_view /*method*/) {
  impl_->inflight.Increment();
}

void PrometheusMetrics::OnFinish(const RequestRecord& record) {
  impl_->inflight.Decrement();
  const Impl::Series series =
      impl_->SeriesFor(record.method, record.status->code());
  series.requests->Increment();
  series.latency->Observe(record.latency_seconds);
  if (record.status->ok()) {
    impl_->batch.Observe(static_cast<double>(record.batch));
    impl_->output_bytes.Increment(static_cast<double>(record.output_bytes));
  }
}

void PrometheusMetrics::OnRejected(absl::string_view reason) {
  impl_->rejected.Add({{"reason", std::string(reason)}}).Increment();
}

void PrometheusMetrics::OnBackendFailure(absl::string_view backend,
                                         const absl::Status& /*error*/,
                                         absl::string_view action) {
  impl_->backend_failures
      .Add({{"backend", std::string(backend)}, {"action", std::string(action)}})
      .Increment();
}

void PrometheusMetrics::OnServingChanged(absl::string_view state) {
  for (const char* name : {"serving", "draining", "backend_failed"}) {
    impl_->serving_state.Add({{"state", name}}).Set(state == name ? 1 : 0);
  }
}

}  // namespace temb
