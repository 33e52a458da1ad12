#include "temb/rest/rest_handler.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "temb/core/version.h"
#include "temb/kserve/kserve_convert.h"
#include "temb/rest/rest_json.h"

namespace temb::rest {
namespace {

constexpr absl::string_view kInferMethod = "HttpModelInfer";

void SetJson(int status, std::string json, HttpResponse* response) {
  response->status = status;
  response->content_type = "application/json";
  response->body.clear();
  response->body.push_back(std::move(json));
}

void SetError(const absl::Status& status, HttpResponse* response) {
  SetJson(HttpStatusFor(status), ErrorJson(status.message()), response);
  if (status.code() == absl::StatusCode::kUnauthenticated) {
    response->headers.emplace_back("WWW-Authenticate", "Bearer");
  }
}

// A probe's answer: 200 or `failure`, empty bodies (as Triton), except for
// authentication errors, which say why.
void SetProbe(const absl::Status& auth, bool ok, int failure,
              HttpResponse* response) {
  if (!auth.ok()) {
    SetError(auth, response);
    return;
  }
  response->status = ok ? 200 : failure;
  response->content_type = "text/plain";
  response->body.clear();
}

void SetMethodNotAllowed(absl::string_view allowed, HttpResponse* response) {
  SetJson(405, ErrorJson(absl::StrCat("method not allowed; use ", allowed)),
          response);
  response->headers.emplace_back("Allow", std::string(allowed));
}

// Timesteps answered: the rows of every output (all but its last extent).
int64_t BatchOf(const inference::ModelInferResponse& response) {
  int64_t batch = 0;
  for (const auto& output : response.outputs()) {
    int64_t rows = 1;
    for (int d = 0; d + 1 < output.shape_size(); ++d) rows *= output.shape(d);
    batch += rows;
  }
  return batch;
}

}  // namespace

uint64_t HttpResponse::body_size() const {
  uint64_t size = 0;
  for (const std::string& part : body) size += part.size();
  return size;
}

int64_t MaxRequestBodyBytes(const Limits& limits) {
  constexpr int64_t kHeadroom = int64_t{64} << 10;
  constexpr int64_t kPerTimestep = 32;
  const int64_t batch = std::clamp<int64_t>(
      limits.max_batch, 0,
      (std::numeric_limits<int64_t>::max() - kHeadroom) / kPerTimestep);
  return batch * kPerTimestep + kHeadroom;
}

int HttpStatusFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      // Admission refusals ("server overloaded: max_inflight ..." or
      // "... max_queued_bytes ...") are worth retrying later; a request over
      // max_batch, max_dim or max_output_bytes is not.
      return absl::StartsWith(status.message(), "server overloaded") ? 429
                                                                     : 400;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

RestHandler::RestHandler(const EmbedService& core,
                         AdmissionController* admission,
                         const TokenVerifier* tokens, RequestObserver* observer,
                         kserve::InferenceStatistics* statistics,
                         kserve::SharedMemoryRegistry* shared_memory)
    : core_(core),
      admission_(admission),
      tokens_(tokens),
      observer_(observer),
      statistics_(statistics),
      shared_memory_(shared_memory) {}

absl::Status RestHandler::Authenticate(const HttpRequest& request) const {
  if (tokens_ == nullptr) return absl::OkStatus();
  absl::Status status = tokens_->Verify(request.authorization);
  if (!status.ok() && observer_ != nullptr) {
    observer_->OnRejected("unauthenticated");
  }
  return status;
}

absl::Status RestHandler::Enter(const HttpRequest& request) const {
  if (absl::Status status = Authenticate(request); !status.ok()) return status;
  return admission_->CheckServing();
}

void RestHandler::Handle(const HttpRequest& request,
                         HttpResponse* response) const {
  const absl::string_view path = request.path;
  const bool get = request.method == "GET";
  if (path == "/v2/health/live" || path == "/v2/health/ready") {
    if (!get) return SetMethodNotAllowed("GET", response);
    const absl::Status auth = Authenticate(request);
    if (path == "/v2/health/live") return SetProbe(auth, true, 200, response);
    return SetProbe(auth, admission_->serving(), 503, response);
  }
  if (path == "/v2" || path == "/v2/") {
    if (!get) return SetMethodNotAllowed("GET", response);
    if (absl::Status status = Enter(request); !status.ok()) {
      return SetError(status, response);
    }
    inference::ServerMetadataResponse metadata;
    kserve::FillServerMetadata(Version(), &metadata);
    metadata.add_extensions("binary_tensor_data");
    return SetJson(200, MessageToJson(metadata), response);
  }
  if (SharedMemoryEndpoint(request, response)) return;
  if (path == "/v2/models/stats") {
    if (!get) return SetMethodNotAllowed("GET", response);
    return Statistics(request, "", "", response);
  }
  // /v2/models/{m}[/versions/{v}][/{action}]
  constexpr absl::string_view kModels = "/v2/models/";
  if (absl::StartsWith(path, kModels)) {
    const std::vector<std::string> parts =
        absl::StrSplit(path.substr(kModels.size()), '/');
    std::string version;
    std::string action;
    bool valid = !parts[0].empty();
    size_t next = 1;
    if (valid && parts.size() >= 3 && parts[1] == "versions") {
      version = parts[2];
      valid = !version.empty();
      next = 3;
    }
    if (valid && parts.size() == next + 1) {
      action = parts[next];
      valid = action == "ready" || action == "config" || action == "stats" ||
              action == "infer";
    } else if (parts.size() > next) {
      valid = false;
    }
    if (valid) {
      return ModelEndpoint(request, parts[0], version, action, response);
    }
  }
  SetJson(404,
          ErrorJson(absl::StrCat("no endpoint ", request.method, " ", path,
                                 " (KServe v2: /v2, /v2/health/{live,ready}, "
                                 "/v2/models/{model}[/versions/{version}]"
                                 "[/ready|/config|/stats|/infer])")),
          response);
}

void RestHandler::ModelEndpoint(const HttpRequest& request,
                                const std::string& model,
                                const std::string& version,
                                const std::string& action,
                                HttpResponse* response) const {
  if (action == "infer") {
    if (request.method != "POST") {
      return SetMethodNotAllowed("POST", response);
    }
    return Infer(request, model, version, response);
  }
  if (request.method != "GET") return SetMethodNotAllowed("GET", response);
  if (action == "stats") return Statistics(request, model, version, response);
  if (action == "ready") {
    // Unknown models are not ready: 404 says why; draining: 503.
    const absl::Status auth = Authenticate(request);
    if (auth.ok()) {
      absl::StatusOr<const Preset*> found =
          kserve::FindModel(core_.presets(), model, version);
      if (!found.ok()) return SetError(found.status(), response);
    }
    return SetProbe(auth, admission_->serving(), 503, response);
  }
  if (absl::Status status = Enter(request); !status.ok()) {
    return SetError(status, response);
  }
  absl::StatusOr<const Preset*> found =
      kserve::FindModel(core_.presets(), model, version);
  if (!found.ok()) return SetError(found.status(), response);
  if (action == "config") {
    inference::ModelConfig config;
    kserve::FillModelConfig(**found, core_.limits(), &config);
    return SetJson(200, MessageToJson(config), response);
  }
  inference::ModelMetadataResponse metadata;
  kserve::FillModelMetadata(**found, &metadata);
  SetJson(200, MessageToJson(metadata), response);
}

void RestHandler::Statistics(const HttpRequest& request,
                             const std::string& model,
                             const std::string& version,
                             HttpResponse* response) const {
  if (absl::Status status = Enter(request); !status.ok()) {
    return SetError(status, response);
  }
  if (statistics_ == nullptr) {
    return SetError(absl::UnimplementedError("statistics are not collected"),
                    response);
  }
  inference::ModelStatisticsResponse stats;
  if (absl::Status status = statistics_->Fill(model, version, &stats);
      !status.ok()) {
    return SetError(status, response);
  }
  SetJson(200, MessageToJson(stats), response);
}

void RestHandler::Infer(const HttpRequest& request, const std::string& model,
                        const std::string& version,
                        HttpResponse* response) const {
  RequestTimer timer(observer_, kInferMethod);
  kserve::InferStatsTimer stats(statistics_);
  AdmissionTicket ticket;
  inference::ModelInferResponse answer;
  absl::StatusOr<InferBody> body = absl::UnknownError("not parsed");
  EncodedInferResponse encoded;

  // As on gRPC: authentication, then admission (draining, overload) before
  // any work on the body.
  absl::Status status = Authenticate(request);
  if (status.ok()) {
    absl::StatusOr<AdmissionTicket> admitted = admission_->Admit(
        static_cast<int64_t>(request.body.size()), absl::InfiniteFuture());
    if (admitted.ok()) {
      ticket = std::move(*admitted);
    } else {
      status = admitted.status();
    }
  }
  stats.Lap(kserve::InferPhase::kQueue);
  if (status.ok() && !request.content_encoding.empty() &&
      request.content_encoding != "identity") {
    status = absl::InvalidArgumentError(
        absl::StrCat("Content-Encoding \"", request.content_encoding,
                     "\" is not supported: send the body uncompressed"));
  }
  std::optional<uint64_t> json_length;
  if (status.ok() && !request.header_length.empty()) {
    uint64_t value = 0;
    const char* end =
        request.header_length.data() + request.header_length.size();
    const auto parsed =
        std::from_chars(request.header_length.data(), end, value);
    if (parsed.ec != std::errc() || parsed.ptr != end) {
      status = absl::InvalidArgumentError(
          absl::StrCat("Inference-Header-Content-Length must be a byte "
                       "count, got \"",
                       request.header_length, "\""));
    }
    json_length = value;
  }
  if (status.ok()) {
    body = ParseInferBody(request.body, json_length);
    status = body.status();
  }
  if (status.ok()) {
    body->request.set_model_name(model);
    body->request.set_model_version(version);
  }
  stats.Lap(kserve::InferPhase::kComputeInput);
  if (status.ok() && kserve::UsesSharedMemory(body->request)) {
    std::vector<kserve::SharedMemoryOutput> targets;
    status = shared_memory_ == nullptr
                 ? absl::InvalidArgumentError("shared memory is not enabled")
                 : kserve::PrepareSharedMemory(*shared_memory_, &body->request,
                                               &targets);
    if (status.ok()) {
      status = kserve::Infer(core_, body->request, &answer, &ticket);
    }
    if (status.ok()) status = kserve::FinishSharedMemory(targets, &answer);
  } else if (status.ok()) {
    status = kserve::Infer(core_, body->request, &answer, &ticket);
  }
  stats.Lap(kserve::InferPhase::kComputeInfer);
  if (status.ok()) {
    // JSON outputs take several times their raw bytes: held like them.
    status = ticket.Reserve(ExtraJsonBytes(*body, answer));
  }
  int64_t batch = 0;
  if (status.ok()) {
    batch = BatchOf(answer);
    absl::StatusOr<EncodedInferResponse> out =
        EncodeInferResponse(*body, &answer);
    if (out.ok()) {
      encoded = *std::move(out);
    } else {
      status = out.status();
    }
  }
  stats.Lap(kserve::InferPhase::kComputeOutput);
  const std::string id = body.ok() ? body->request.id() : std::string();
  stats.Finish(status, model, batch);
  if (!status.ok()) {
    timer.Finish(status, 0, 0, id);
    return SetError(status, response);
  }
  int64_t output_bytes = 0;
  for (const std::string& part : encoded.binary) {
    output_bytes += static_cast<int64_t>(part.size());
  }
  timer.Finish(status, batch, output_bytes, id);

  response->status = 200;
  response->body.clear();
  if (encoded.binary.empty()) {
    response->content_type = "application/json";
  } else {
    response->content_type = "application/octet-stream";
    response->headers.emplace_back("Inference-Header-Content-Length",
                                   std::to_string(encoded.json.size()));
  }
  response->body.reserve(1 + encoded.binary.size());
  response->body.push_back(std::move(encoded.json));
  for (std::string& part : encoded.binary) {
    response->body.push_back(std::move(part));
  }
  ticket.MarkAnswered();  // computed; its bytes stay until sent
  response->ticket = std::move(ticket);
}

}  // namespace temb::rest

namespace temb::rest {

bool RestHandler::SharedMemoryEndpoint(const HttpRequest& request,
                                       HttpResponse* response) const {
  const absl::string_view path = request.path;
  absl::string_view rest;
  bool cuda = false;
  if (absl::StartsWith(path, "/v2/systemsharedmemory/")) {
    rest = path.substr(strlen("/v2/systemsharedmemory/"));
  } else if (absl::StartsWith(path, "/v2/cudasharedmemory/")) {
    rest = path.substr(strlen("/v2/cudasharedmemory/"));
    cuda = true;
  } else {
    return false;
  }
  // [region/{name}/]{status|register|unregister}
  std::string name;
  std::string action(rest);
  if (absl::StartsWith(rest, "region/")) {
    const absl::string_view tail = rest.substr(strlen("region/"));
    const size_t slash = tail.rfind('/');
    if (slash == absl::string_view::npos || slash == 0) return false;
    name = std::string(tail.substr(0, slash));
    action = std::string(tail.substr(slash + 1));
  }
  const bool get = action == "status";
  if (!get && action != "unregister" &&
      !(action == "register" && !name.empty())) {
    return false;
  }
  if (get != (request.method == "GET")) {
    SetMethodNotAllowed(get ? "GET" : "POST", response);
    return true;
  }
  if (absl::Status status = Enter(request); !status.ok()) {
    SetError(status, response);
    return true;
  }
  const auto not_found = [&name](absl::string_view kind) {
    return absl::NotFoundError(absl::StrCat(
        "no ", kind, " shared memory region \"", name, "\" is registered"));
  };
  if (cuda) {
    if (action == "register") {
      SetError(absl::InvalidArgumentError(
                   "CUDA shared memory is not supported; use system shared "
                   "memory"),
               response);
    } else if (!name.empty()) {
      SetError(not_found("CUDA"), response);
    } else {
      SetJson(200, get ? "[]" : "{}", response);
    }
    return true;
  }
  if (shared_memory_ == nullptr) {
    SetError(absl::UnimplementedError("shared memory is not enabled"),
             response);
    return true;
  }
  if (action == "unregister") {
    const absl::Status status = shared_memory_->Unregister(name);
    if (!status.ok()) {
      SetError(status, response);
    } else {
      SetJson(200, "{}", response);
    }
    return true;
  }
  if (action == "register") {
    absl::Status status;
    std::string key;
    uint64_t offset = 0;
    uint64_t byte_size = 0;
    try {
      const nlohmann::json body = nlohmann::json::parse(request.body);
      key = body.at("key").get<std::string>();
      byte_size = body.at("byte_size").get<uint64_t>();
      if (body.contains("offset")) offset = body.at("offset").get<uint64_t>();
    } catch (const nlohmann::json::exception& e) {
      status = absl::InvalidArgumentError(absl::StrCat(
          "the body must be {\"key\": string, \"byte_size\": integer, "
          "\"offset\": integer}: ",
          e.what()));
    }
    if (status.ok()) {
      status = shared_memory_->Register(name, key, offset, byte_size);
    }
    if (!status.ok()) {
      SetError(status, response);
    } else {
      SetJson(200, "{}", response);
    }
    return true;
  }
  auto regions = shared_memory_->Status(name);
  if (!regions.ok()) {
    SetError(regions.status(), response);
    return true;
  }
  nlohmann::json list = nlohmann::json::array();
  for (const auto& region : *regions) {
    list.push_back({{"name", region->name()},
                    {"key", region->key()},
                    {"offset", region->offset()},
                    {"byte_size", region->byte_size()}});
  }
  SetJson(200,
          list.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
          response);
  return true;
}

}  // namespace temb::rest
