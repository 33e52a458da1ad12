// PrometheusMetrics as the frontends drive it: RequestObserver events in,
// Prometheus text out.  Most tests read TextExposition(); one scrapes the
// real /metrics endpoint, since that is what Prometheus sees.
#include "temb/metrics/prometheus_metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "temb/core/admission.h"
#include "temb/core/request_observer.h"
#include "temb/testing/http_get.h"

namespace temb {
namespace {

using ::temb::testing::HttpGet;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Optional;

// The value of the sample whose name and labels are exactly `series`
// (labels as prometheus-cpp writes them: sorted by name), e.g.
// `temb_requests_total{code="OK",method="Embed"}`; nullopt when absent.
std::optional<double> Sample(const std::string& text,
                             const std::string& series) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (absl::StartsWith(line, series + " ")) {
      return std::strtod(line.c_str() + series.size() + 1, nullptr);
    }
  }
  return std::nullopt;
}

// Reports one finished request the way RequestTimer does.
void Finish(PrometheusMetrics& metrics, absl::string_view method,
            const absl::Status& status, double latency_seconds,
            int64_t batch = 0, int64_t output_bytes = 0) {
  RequestRecord record;
  record.method = method;
  record.status = &status;
  record.latency_seconds = latency_seconds;
  record.batch = batch;
  record.output_bytes = output_bytes;
  metrics.OnFinish(record);
}

TEST(PrometheusMetricsTest, BackendInfoAndPreCreatedSeries) {
  PrometheusMetrics metrics("cpu", "AMD EPYC (16 threads)");
  const std::string text = metrics.TextExposition();
  EXPECT_THAT(Sample(text,
                     "temb_backend_info{backend=\"cpu\",device=\"AMD "
                     "EPYC (16 threads)\"}"),
              Optional(1.0));
  // Alerts on rate() and absent() need every reason and state from the
  // start, at zero.
  for (const char* reason :
       {"unauthenticated", "draining", "backend_failed", "deadline_exceeded",
        "max_inflight", "max_queued_bytes"}) {
    EXPECT_THAT(Sample(text, std::string("temb_rejected_requests_total{"
                                         "reason=\"") +
                                 reason + "\"}"),
                Optional(0.0))
        << reason;
  }
  for (const char* state : {"serving", "draining", "backend_failed"}) {
    EXPECT_THAT(Sample(text, std::string("temb_serving_state{state=\"") +
                                 state + "\"}"),
                Optional(0.0))
        << state;
  }
  EXPECT_THAT(Sample(text, "temb_inflight_requests"), Optional(0.0));
  EXPECT_THAT(Sample(text, "temb_output_bytes_total"), Optional(0.0));
  EXPECT_THAT(Sample(text, "temb_batch_size_count"), Optional(0.0));
  // Request series exist per (method, code) seen, so none yet.
  EXPECT_THAT(text, Not(HasSubstr("temb_requests_total")));
  EXPECT_THAT(text, Not(HasSubstr("temb_request_latency_seconds")));
}

TEST(PrometheusMetricsTest, RequestsAreCountedByMethodAndCode) {
  PrometheusMetrics metrics("cpu", "dev");
  for (int i = 0; i < 3; ++i) {
    metrics.OnStart("Embed");
    Finish(metrics, "Embed", absl::OkStatus(), 0.001, 2, 2560);
  }
  metrics.OnStart("Embed");
  Finish(metrics, "Embed", absl::NotFoundError("no preset \"x\""), 0.001);
  metrics.OnStart("ModelInfer");
  Finish(metrics, "ModelInfer", absl::InvalidArgumentError("bad"), 0.001);
  metrics.OnStart("EmbedStream");
  Finish(metrics, "EmbedStream", absl::CancelledError(), 0.001);

  const std::string text = metrics.TextExposition();
  EXPECT_THAT(Sample(text, "temb_requests_total{code=\"OK\",method=\"Embed\"}"),
              Optional(3.0));
  EXPECT_THAT(
      Sample(text, "temb_requests_total{code=\"NOT_FOUND\",method=\"Embed\"}"),
      Optional(1.0));
  EXPECT_THAT(Sample(text,
                     "temb_requests_total{code=\"INVALID_ARGUMENT\","
                     "method=\"ModelInfer\"}"),
              Optional(1.0));
  EXPECT_THAT(Sample(text,
                     "temb_requests_total{code=\"CANCELLED\","
                     "method=\"EmbedStream\"}"),
              Optional(1.0));
  // Series appear only for the (method, code) pairs seen.
  EXPECT_EQ(Sample(text,
                   "temb_requests_total{code=\"OK\",method="
                   "\"ModelInfer\"}"),
            std::nullopt);
  EXPECT_THAT(
      Sample(text, "temb_request_latency_seconds_count{method=\"Embed\"}"),
      Optional(4.0));
  EXPECT_THAT(
      Sample(text, "temb_request_latency_seconds_count{method=\"ModelInfer\"}"),
      Optional(1.0));
  EXPECT_THAT(Sample(text, "temb_inflight_requests"), Optional(0.0));
  EXPECT_THAT(text, HasSubstr("# TYPE temb_requests_total counter\n"));
  EXPECT_THAT(text,
              HasSubstr("# TYPE temb_request_latency_seconds histogram\n"));
}

TEST(PrometheusMetricsTest, LatencyLandsInItsBucket) {
  PrometheusMetrics metrics("cpu", "dev");
  // 0.3 ms: above the 250 us bound, within 500 us.
  metrics.OnStart("Embed");
  Finish(metrics, "Embed", absl::OkStatus(), 0.0003, 1, 4);
  // 2 s: beyond the last finite bound (1 s).
  metrics.OnStart("Embed");
  Finish(metrics, "Embed", absl::OkStatus(), 2.0, 1, 4);

  const std::string text = metrics.TextExposition();
  const std::string bucket =
      "temb_request_latency_seconds_bucket{method=\"Embed\",le=\"";
  EXPECT_THAT(Sample(text, bucket + "5e-05\"}"), Optional(0.0));
  EXPECT_THAT(Sample(text, bucket + "0.00025\"}"), Optional(0.0));
  EXPECT_THAT(Sample(text, bucket + "0.0005\"}"), Optional(1.0));
  EXPECT_THAT(Sample(text, bucket + "1\"}"), Optional(1.0));
  EXPECT_THAT(Sample(text, bucket + "+Inf\"}"), Optional(2.0));
  const std::optional<double> sum =
      Sample(text, "temb_request_latency_seconds_sum{method=\"Embed\"}");
  ASSERT_TRUE(sum.has_value());
  EXPECT_NEAR(*sum, 2.0003, 1e-9);
}

TEST(PrometheusMetricsTest, BatchAndBytesCountOnlySuccessfulRequests) {
  PrometheusMetrics metrics("cpu", "dev");
  metrics.OnStart("Embed");
  Finish(metrics, "Embed", absl::OkStatus(), 0.001, /*batch=*/3,
         /*output_bytes=*/3840);
  metrics.OnStart("Embed");
  Finish(metrics, "Embed", absl::OkStatus(), 0.001, /*batch=*/64,
         /*output_bytes=*/81920);
  // A failed request may still know its batch; it returned no embedding.
  metrics.OnStart("Embed");
  Finish(metrics, "Embed", absl::ResourceExhaustedError("too big"), 0.001,
         /*batch=*/100000, /*output_bytes=*/123);

  const std::string text = metrics.TextExposition();
  EXPECT_THAT(Sample(text, "temb_output_bytes_total"), Optional(85760.0));
  EXPECT_THAT(Sample(text, "temb_batch_size_count"), Optional(2.0));
  EXPECT_THAT(Sample(text, "temb_batch_size_sum"), Optional(67.0));
  // Powers of two: 3 falls in le=4, 64 in le=64 (bounds are inclusive).
  EXPECT_THAT(Sample(text, "temb_batch_size_bucket{le=\"2\"}"), Optional(0.0));
  EXPECT_THAT(Sample(text, "temb_batch_size_bucket{le=\"4\"}"), Optional(1.0));
  EXPECT_THAT(Sample(text, "temb_batch_size_bucket{le=\"32\"}"), Optional(1.0));
  EXPECT_THAT(Sample(text, "temb_batch_size_bucket{le=\"64\"}"), Optional(2.0));
  EXPECT_THAT(Sample(text, "temb_batch_size_bucket{le=\"65536\"}"),
              Optional(2.0));
}

TEST(PrometheusMetricsTest, InflightFollowsStartAndFinish) {
  PrometheusMetrics metrics("cpu", "dev");
  metrics.OnStart("Embed");
  metrics.OnStart("Embed");
  metrics.OnStart("EmbedStream");
  EXPECT_THAT(Sample(metrics.TextExposition(), "temb_inflight_requests"),
              Optional(3.0));
  Finish(metrics, "Embed", absl::OkStatus(), 0.001, 1, 4);
  EXPECT_THAT(Sample(metrics.TextExposition(), "temb_inflight_requests"),
              Optional(2.0));
  Finish(metrics, "Embed", absl::UnavailableError("draining"), 0.001);
  Finish(metrics, "EmbedStream", absl::OkStatus(), 0.001);
  EXPECT_THAT(Sample(metrics.TextExposition(), "temb_inflight_requests"),
              Optional(0.0));
}

TEST(PrometheusMetricsTest, RequestTimerReportsThroughTheObserver) {
  PrometheusMetrics metrics("cpu", "dev");
  {
    RequestTimer finished(&metrics, "GetServerInfo");
    EXPECT_THAT(Sample(metrics.TextExposition(), "temb_inflight_requests"),
                Optional(1.0));
    finished.Finish(absl::OkStatus(), 5, 640);
    RequestTimer abandoned(&metrics, "GetServerInfo");
  }  // `abandoned` reports UNKNOWN from its destructor.
  const std::string text = metrics.TextExposition();
  EXPECT_THAT(Sample(text,
                     "temb_requests_total{code=\"OK\",method="
                     "\"GetServerInfo\"}"),
              Optional(1.0));
  EXPECT_THAT(Sample(text,
                     "temb_requests_total{code=\"UNKNOWN\",method="
                     "\"GetServerInfo\"}"),
              Optional(1.0));
  EXPECT_THAT(Sample(text, "temb_output_bytes_total"), Optional(640.0));
  EXPECT_THAT(Sample(text, "temb_inflight_requests"), Optional(0.0));
}

TEST(PrometheusMetricsTest, RejectionsFailuresAndServingState) {
  PrometheusMetrics metrics("cuda", "H100");
  metrics.OnRejected("draining");
  metrics.OnRejected("draining");
  metrics.OnRejected("max_inflight");
  metrics.OnBackendFailure("cuda", absl::InternalError("ECC"), "fallback_cpu");
  metrics.OnServingChanged("draining");
  std::string text = metrics.TextExposition();
  EXPECT_THAT(Sample(text, "temb_rejected_requests_total{reason=\"draining\"}"),
              Optional(2.0));
  EXPECT_THAT(
      Sample(text, "temb_rejected_requests_total{reason=\"max_inflight\"}"),
      Optional(1.0));
  EXPECT_THAT(
      Sample(text, "temb_rejected_requests_total{reason=\"unauthenticated\"}"),
      Optional(0.0));
  EXPECT_THAT(Sample(text,
                     "temb_backend_failures_total{action=\"fallback_cpu\","
                     "backend=\"cuda\"}"),
              Optional(1.0));
  EXPECT_THAT(Sample(text, "temb_serving_state{state=\"draining\"}"),
              Optional(1.0));
  EXPECT_THAT(Sample(text, "temb_serving_state{state=\"serving\"}"),
              Optional(0.0));

  // Exactly one state is 1 at a time.
  metrics.OnServingChanged("backend_failed");
  text = metrics.TextExposition();
  EXPECT_THAT(Sample(text, "temb_serving_state{state=\"backend_failed\"}"),
              Optional(1.0));
  EXPECT_THAT(Sample(text, "temb_serving_state{state=\"draining\"}"),
              Optional(0.0));
  EXPECT_THAT(Sample(text, "temb_serving_state{state=\"serving\"}"),
              Optional(0.0));
}

TEST(PrometheusMetricsTest, QueuedBytesFollowAdmissionAtEachScrape) {
  PrometheusMetrics metrics("cpu", "dev");
  AdmissionController admission(
      AdmissionLimits{/*max_inflight=*/0, /*max_queued_bytes=*/1000});
  metrics.WatchAdmission(&admission);
  absl::StatusOr<int> port = metrics.Serve("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_THAT(Sample(metrics.TextExposition(), "temb_queued_bytes_limit"),
              Optional(1000.0));
  EXPECT_THAT(Sample(metrics.TextExposition(), "temb_queued_bytes"),
              Optional(0.0));
  {
    absl::StatusOr<AdmissionTicket> ticket =
        admission.Admit(100, absl::InfiniteFuture());
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    ASSERT_TRUE(ticket->Reserve(500).ok());
    // Answered, not yet written: the bytes stay counted.
    ticket->MarkAnswered();
    EXPECT_THAT(Sample(metrics.TextExposition(), "temb_queued_bytes"),
                Optional(600.0));
    // What Prometheus scrapes too: watched before Serve, registered by it.
    const std::string reply = HttpGet(*port, "/metrics");
    const size_t body = reply.find("\r\n\r\n");
    ASSERT_NE(body, std::string::npos) << reply;
    EXPECT_THAT(Sample(reply.substr(body + 4), "temb_queued_bytes"),
                Optional(600.0));
  }
  EXPECT_THAT(Sample(metrics.TextExposition(), "temb_queued_bytes"),
              Optional(0.0));
}

TEST(PrometheusMetricsTest, ConcurrentRequestsAreAllCounted) {
  // The per-method series cache is filled under a lock while other threads
  // read it; no increment may be lost and no series duplicated.
  PrometheusMetrics metrics("cpu", "dev");
  constexpr int kThreads = 4;
  constexpr int kPerThread = 2000;
  const char* const methods[] = {"Embed", "EmbedStream"};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const char* method = methods[(t + i) % 2];
        metrics.OnStart(method);
        Finish(metrics, method,
               i % 4 == 0 ? absl::UnavailableError("x") : absl::OkStatus(),
               0.001, 1, 8);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();

  const std::string text = metrics.TextExposition();
  double total = 0;
  for (const char* method : methods) {
    for (const char* code : {"OK", "UNAVAILABLE"}) {
      const std::optional<double> n =
          Sample(text, std::string("temb_requests_total{code=\"") + code +
                           "\",method=\"" + method + "\"}");
      ASSERT_TRUE(n.has_value()) << method << " " << code;
      total += *n;
    }
  }
  EXPECT_EQ(total, kThreads * kPerThread);
  const double ok = kThreads * kPerThread * 3 / 4;
  EXPECT_THAT(Sample(text, "temb_batch_size_count"), Optional(ok));
  EXPECT_THAT(Sample(text, "temb_output_bytes_total"), Optional(8 * ok));
  EXPECT_THAT(Sample(text, "temb_inflight_requests"), Optional(0.0));
}

// One test serves: stopping the HTTP exposer takes about a second.
TEST(PrometheusMetricsTest, ServesTheSameSeriesOverHttp) {
  PrometheusMetrics metrics("cpu", "dev");
  absl::StatusOr<int> port = metrics.Serve("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status();
  ASSERT_GT(*port, 0);
  metrics.OnStart("Embed");
  Finish(metrics, "Embed", absl::OkStatus(), 0.001, 2, 2560);
  metrics.OnStart("Embed");  // still in flight during the scrape

  const std::string reply = HttpGet(*port, "/metrics");
  EXPECT_THAT(reply, HasSubstr("200 OK"));
  const size_t body = reply.find("\r\n\r\n");
  ASSERT_NE(body, std::string::npos) << reply;
  const std::string text = reply.substr(body + 4);
  EXPECT_THAT(Sample(text, "temb_requests_total{code=\"OK\",method=\"Embed\"}"),
              Optional(1.0));
  EXPECT_THAT(Sample(text, "temb_output_bytes_total"), Optional(2560.0));
  EXPECT_THAT(Sample(text, "temb_inflight_requests"), Optional(1.0));
  EXPECT_THAT(Sample(text,
                     "temb_backend_info{backend=\"cpu\",device="
                     "\"dev\"}"),
              Optional(1.0));
}

TEST(PrometheusMetricsTest, ServeOnABusyPortIsUnavailable) {
  // Hold a port with a plain listening socket, then ask to serve on it.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = 0;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)),
            0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string busy =
      "127.0.0.1:" + std::to_string(ntohs(address.sin_port));

  PrometheusMetrics metrics("cpu", "dev");
  absl::StatusOr<int> port = metrics.Serve(busy);
  EXPECT_EQ(port.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(port.status().message(), HasSubstr(busy));
  close(fd);
  // The metrics themselves keep working without an endpoint.
  metrics.OnRejected("draining");
  EXPECT_THAT(Sample(metrics.TextExposition(),
                     "temb_rejected_requests_total{reason=\"draining\"}"),
              Optional(1.0));
}

}  // namespace
}  // namespace temb
