// The KServe v2 / Open Inference Protocol over HTTP/REST, independent of the
// HTTP server library (http_server.h adapts one): a request in, a response
// out.  Every endpoint runs the same rules as the gRPC frontend:
//   - authentication with the same TokenVerifier ("Authorization: Bearer"),
//   - admission with the same AdmissionController (draining, failed backend,
//     max_inflight, max_queued_bytes),
//   - inference through kserve::Infer on an inference::ModelInferRequest
//     built from the JSON (and binary) body, so numbers, limits and error
//     messages are those of gRPC,
//   - the same RequestObserver (metrics and request log, method
//     "HttpModelInfer") and the same InferenceStatistics (Triton's
//     statistics extension).
//
// Endpoints (m a model, v its version; every path also without
// /versions/{v}):
//   GET  /v2/health/live, /v2/health/ready             200, or 401 / 503
//   GET  /v2                                           server metadata
//   GET  /v2/models/{m}/versions/{v}                   model metadata
//   GET  /v2/models/{m}/versions/{v}/ready             200, or 404 / 503
//   GET  /v2/models/{m}/versions/{v}/config            Triton model config
//   GET  /v2/models/{m}/versions/{v}/stats, /v2/models/stats  statistics
//   POST /v2/models/{m}/versions/{v}/infer             inference
//   GET  /v2/systemsharedmemory[/region/{r}]/status    regions
//   POST /v2/systemsharedmemory/region/{r}/register    {"key", "offset",
//                                                       "byte_size"}
//   POST /v2/systemsharedmemory[/region/{r}]/unregister
//   /v2/cudasharedmemory/...: the same paths; nothing is ever registered
// Errors are {"error": "..."} with the status HttpStatusFor() gives.
#ifndef TEMB_REST_REST_HANDLER_H_
#define TEMB_REST_REST_HANDLER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "temb/core/admission.h"
#include "temb/core/embed_service.h"
#include "temb/core/model_control.h"
#include "temb/core/request_observer.h"
#include "temb/core/token_auth.h"
#include "temb/kserve/inference.h"
#include "temb/kserve/model_statistics.h"
#include "temb/kserve/shared_memory.h"
#include "temb/rest/rest_json.h"

namespace temb::rest {

// What the handler needs of an HTTP request; the adapter fills it (the
// header fields before the body is read, see RestHandler::Accept).
struct HttpRequest {
  std::string method;            // "GET", "POST", ...
  std::string path;              // percent-decoded, without the query string
  std::string authorization;     // the Authorization header; "" if none
  std::string header_length;     // Inference-Header-Content-Length; "" if none
  std::string content_encoding;  // Content-Encoding; "" if none
  std::string body;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  // Extra headers (Inference-Header-Content-Length, Allow, ...).
  std::vector<std::pair<std::string, std::string>> headers;
  // Sent in order, without being joined: the JSON, then binary tensors.
  std::vector<std::string> body;
  // An answered inference request holds its admission until the adapter has
  // sent the response (max_queued_bytes counts responses being written).
  AdmissionTicket ticket;

  uint64_t body_size() const;
};

// The HTTP status for a status of the core or of kserve::Infer:
// INVALID_ARGUMENT (and limits: RESOURCE_EXHAUSTED naming max_batch, max_dim
// or max_output_bytes) 400, UNAUTHENTICATED 401, PERMISSION_DENIED 403,
// NOT_FOUND 404, ALREADY_EXISTS 409, overload (RESOURCE_EXHAUSTED from
// admission) 429,
// UNIMPLEMENTED 501, UNAVAILABLE (draining, failed backend) 503,
// DEADLINE_EXCEEDED 504, anything else 500.
int HttpStatusFor(const absl::Status& status);

// The largest request body worth reading for a server with these limits:
// max_batch timesteps as JSON text (at most 32 bytes each, nested [N, 1]
// lists included; binary data takes at most 8) plus 64 KiB for the rest of
// the header (ids, parameters).  Larger bodies are refused unread (413).
int64_t MaxRequestBodyBytes(const Limits& limits);

// The largest body of any other request: a shared-memory registration
// ({"key", "offset", "byte_size"}, a key of at most 256 bytes) needs less
// than 1 KiB; other endpoints take no body.
inline constexpr int64_t kMaxControlBodyBytes = 4096;

// Leave to read a request's body, given by RestHandler::Accept once the
// header has arrived: at most max_body_bytes() of it, and for an inference
// call the admission holding those bytes (and, later, what the request
// costs once parsed and its response) until the answer is sent.
class BodyPermit {
 public:
  BodyPermit(BodyPermit&&) = default;
  BodyPermit& operator=(BodyPermit&&) = default;
  uint64_t max_body_bytes() const { return max_body_bytes_; }

 private:
  friend class RestHandler;
  BodyPermit(AdmissionTicket ticket, uint64_t max_body_bytes)
      : ticket_(std::move(ticket)), max_body_bytes_(max_body_bytes) {}

  AdmissionTicket ticket_;
  uint64_t max_body_bytes_ = 0;
};

// A shared-memory endpoint: /v2/{system,cuda}sharedmemory/
// [region/{name}/]{status|register|unregister}.
struct SharedMemoryRoute {
  bool cuda = false;
  std::string name;  // empty: every region
  std::string action;
};

class RestHandler {
 public:
  // Every pointer must outlive the handler.  `admission` is required;
  // `tokens` null means no authentication; `observer`, `statistics` and
  // `shared_memory` may be null (no shared memory: registering fails).
  RestHandler(const EmbedService& core, AdmissionController* admission,
              const TokenVerifier* tokens, RequestObserver* observer,
              kserve::InferenceStatistics* statistics,
              kserve::SharedMemoryRegistry* shared_memory = nullptr,
              const ConditioningService* conditioning = nullptr,
              ModelControl* control = nullptr);

  // Once a request's header has arrived (`head` without its body) and
  // before any of the body is read: authentication (every endpoint, health
  // included, when tokens are on), Content-Encoding, the endpoint's body
  // limit against `content_length` (nullopt: chunked, length unknown), and
  // for an inference call admission of the body's bytes (the limit's, when
  // chunked).  nullopt: `refusal` is the answer (401, 400, 413, 429, 503),
  // to send without reading the body.  Thread-safe.
  std::optional<BodyPermit> Accept(const HttpRequest& head,
                                   std::optional<uint64_t> content_length,
                                   HttpResponse* refusal) const;
  // The whole request, its body read under `permit`.  Thread-safe.
  void Handle(const HttpRequest& request, BodyPermit permit,
              HttpResponse* response) const;
  // Accept, then Handle: for a request already whole (tests, tools).
  void Handle(const HttpRequest& request, HttpResponse* response) const;

 private:
  absl::Status Authenticate(const HttpRequest& request) const;
  // UNAVAILABLE unless serving (calls that compute nothing: metadata,
  // config, statistics).  Authentication was Accept's.
  absl::Status Enter() const;

  void ModelEndpoint(const HttpRequest& request, BodyPermit permit,
                     const std::string& model, const std::string& version,
                     const std::string& action, HttpResponse* response) const;
  // An infer call's state while it is answered: its admission, its
  // statistics, and what the request logs need.
  struct InferredCall {
    explicit InferredCall(kserve::InferenceStatistics* statistics)
        : stats(statistics) {}
    AdmissionTicket ticket;
    kserve::InferStatsTimer stats;
    std::string id;     // the request's
    int64_t batch = 0;  // timesteps answered
  };
  void Infer(const HttpRequest& request, BodyPermit permit,
             const std::string& model, const std::string& version,
             HttpResponse* response) const;
  // Parse, the KServe inference path gRPC uses too, encode.
  absl::StatusOr<EncodedInferResponse> Answer(const HttpRequest& request,
                                              const std::string& model,
                                              const std::string& version,
                                              InferredCall* call) const;
  void Statistics(const std::string& model, const std::string& version,
                  HttpResponse* response) const;
  // /v2/{system,cuda}sharedmemory/...; false when `path` is none of them.
  bool SharedMemoryEndpoint(const HttpRequest& request,
                            HttpResponse* response) const;
  // The JSON answer of one shared-memory endpoint.
  absl::StatusOr<std::string> SharedMemoryAnswer(
      const HttpRequest& request, const SharedMemoryRoute& route) const;
  // Triton's repository extension (POST /v2/repository/index and
  // /v2/repository/models/{model}/{load,unload}), as over gRPC; false when
  // `path` is none of them.
  bool RepositoryEndpoint(const HttpRequest& request,
                          HttpResponse* response) const;
  absl::StatusOr<std::string> RepositoryAnswer(
      const HttpRequest& request) const;

  const EmbedService& core_;
  const kserve::ServedModels models_;
  AdmissionController* const admission_;
  const TokenVerifier* const tokens_;
  RequestObserver* const observer_;
  kserve::InferenceStatistics* const statistics_;
  kserve::SharedMemoryRegistry* const shared_memory_;
  ModelControl* const control_;
};

}  // namespace temb::rest

#endif  // TEMB_REST_REST_HANDLER_H_
