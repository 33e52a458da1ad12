#include "temb/rest/rest_handler.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "temb/base/status_macros.h"
#include "temb/core/version.h"
#include "temb/kserve/conditioning_convert.h"
#include "temb/kserve/inference.h"
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

// A probe's answer: 200 or `failure`, with an empty body (as Triton).
void SetProbe(bool ok, int failure, HttpResponse* response) {
  response->status = ok ? 200 : failure;
  response->content_type = "text/plain";
  response->body.clear();
}

void SetMethodNotAllowed(absl::string_view allowed, HttpResponse* response) {
  SetJson(405, ErrorJson(absl::StrCat("method not allowed; use ", allowed)),
          response);
  response->headers.emplace_back("Allow", std::string(allowed));
}

// The Inference-Header-Content-Length header: where the JSON of a body
// with binary tensors ends (nullopt: the whole body is JSON).
absl::StatusOr<std::optional<uint64_t>> JsonLength(const HttpRequest& request) {
  if (request.header_length.empty()) return std::nullopt;
  uint64_t value = 0;
  const char* end = request.header_length.data() + request.header_length.size();
  const auto parsed = std::from_chars(request.header_length.data(), end, value);
  if (parsed.ec != std::errc() || parsed.ptr != end) {
    return absl::InvalidArgumentError(
        absl::StrCat("Inference-Header-Content-Length must be a byte count, "
                     "got \"",
                     request.header_length, "\""));
  }
  return value;
}

absl::Status CheckContentEncoding(const HttpRequest& request) {
  if (request.content_encoding.empty() ||
      request.content_encoding == "identity") {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("Content-Encoding \"", request.content_encoding,
                   "\" is not supported: send the body uncompressed"));
}

// /v2/models/{m}[/versions/{v}][/{action}]
struct ModelRoute {
  std::string model;
  std::string version;
  std::string action;  // "", "ready", "config", "stats" or "infer"
};

std::optional<ModelRoute> ParseModelPath(absl::string_view path) {
  if (!absl::ConsumePrefix(&path, "/v2/models/")) return std::nullopt;
  const std::vector<std::string> parts = absl::StrSplit(path, '/');
  ModelRoute route;
  route.model = parts[0];
  if (route.model.empty()) return std::nullopt;
  size_t next = 1;
  if (parts.size() >= 3 && parts[1] == "versions") {
    route.version = parts[2];
    if (route.version.empty()) return std::nullopt;
    next = 3;
  }
  if (parts.size() == next + 1) {
    route.action = parts[next];
    const bool known = route.action == "ready" || route.action == "config" ||
                       route.action == "stats" || route.action == "infer";
    if (!known) return std::nullopt;
  } else if (parts.size() > next) {
    return std::nullopt;
  }
  return route;
}

bool IsInfer(const HttpRequest& request) {
  if (request.method != "POST") return false;
  const std::optional<ModelRoute> route = ParseModelPath(request.path);
  return route.has_value() && route->action == "infer";
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
      // An overloaded server is worth retrying later; a request over
      // max_batch, max_dim or max_output_bytes is not.
      return IsOverloaded(status) ? 429 : 400;
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
                         kserve::SharedMemoryRegistry* shared_memory,
                         const ConditioningService* conditioning,
                         ModelControl* control)
    : core_(core),
      models_{core, conditioning},
      admission_(admission),
      tokens_(tokens),
      observer_(observer),
      statistics_(statistics),
      shared_memory_(shared_memory),
      control_(control) {}

absl::Status RestHandler::Authenticate(const HttpRequest& request) const {
  if (tokens_ == nullptr) return absl::OkStatus();
  absl::Status status = tokens_->Verify(request.authorization);
  if (!status.ok() && observer_ != nullptr) {
    observer_->OnRejected("unauthenticated");
  }
  return status;
}

absl::Status RestHandler::Enter() const { return admission_->CheckServing(); }

std::optional<BodyPermit> RestHandler::Accept(
    const HttpRequest& head, std::optional<uint64_t> content_length,
    HttpResponse* refusal) const {
  absl::Status status = Authenticate(head);
  const bool body = !content_length.has_value() || *content_length > 0;
  if (status.ok() && body) status = CheckContentEncoding(head);
  const bool infer = IsInfer(head);
  const uint64_t limit = static_cast<uint64_t>(
      infer ? MaxRequestBodyBytes(core_.limits()) : kMaxControlBodyBytes);
  if (status.ok() && content_length.value_or(0) > limit) {
    SetJson(413,
            ErrorJson(absl::StrCat("the request body (", *content_length,
                                   " bytes) is larger than this endpoint's "
                                   "limit (",
                                   limit, " bytes)")),
            refusal);
    return std::nullopt;
  }
  AdmissionTicket ticket;
  if (status.ok() && infer) {
    // As on gRPC: admission (draining, overload) before any work on the
    // body, and the body's bytes held from before they are read.
    absl::StatusOr<AdmissionTicket> admitted =
        admission_->Admit(static_cast<int64_t>(content_length.value_or(limit)),
                          absl::InfiniteFuture());
    if (admitted.ok()) {
      ticket = *std::move(admitted);
    } else {
      status = admitted.status();
    }
  }
  if (!status.ok()) {
    if (infer) {
      // Counted, logged and in the statistics like any failed call.
      RequestTimer timer(observer_, kInferMethod);
      kserve::InferStatsTimer stats(statistics_);
      stats.Finish(status, ParseModelPath(head.path)->model, 0);
      timer.Finish(status, 0, 0, "");
    }
    SetError(status, refusal);
    return std::nullopt;
  }
  return BodyPermit(std::move(ticket), limit);
}

void RestHandler::Handle(const HttpRequest& request,
                         HttpResponse* response) const {
  std::optional<BodyPermit> permit =
      Accept(request, request.body.size(), response);
  if (permit.has_value()) Handle(request, *std::move(permit), response);
}

void RestHandler::Handle(const HttpRequest& request, BodyPermit permit,
                         HttpResponse* response) const {
  const absl::string_view path = request.path;
  const bool get = request.method == "GET";
  if (path == "/v2/health/live" || path == "/v2/health/ready") {
    if (!get) return SetMethodNotAllowed("GET", response);
    // Ready once every conditioning model has loaded or failed.
    return SetProbe(path == "/v2/health/live" ||
                        (admission_->serving() && models_.RepositoryReady()),
                    503, response);
  }
  if (path == "/v2" || path == "/v2/") {
    if (!get) return SetMethodNotAllowed("GET", response);
    if (absl::Status status = Enter(); !status.ok()) {
      return SetError(status, response);
    }
    inference::ServerMetadataResponse metadata;
    kserve::FillServerMetadata(Version(), &metadata);
    metadata.add_extensions("binary_tensor_data");
    return SetJson(200, MessageToJson(metadata), response);
  }
  if (SharedMemoryEndpoint(request, response)) return;
  if (RepositoryEndpoint(request, response)) return;
  if (path == "/v2/models/stats") {
    if (!get) return SetMethodNotAllowed("GET", response);
    return Statistics("", "", response);
  }
  if (const std::optional<ModelRoute> route = ParseModelPath(path)) {
    return ModelEndpoint(request, std::move(permit), route->model,
                         route->version, route->action, response);
  }
  SetJson(404,
          ErrorJson(absl::StrCat("no endpoint ", request.method, " ", path,
                                 " (KServe v2: /v2, /v2/health/{live,ready}, "
                                 "/v2/models/{model}[/versions/{version}]"
                                 "[/ready|/config|/stats|/infer])")),
          response);
}

void RestHandler::ModelEndpoint(const HttpRequest& request, BodyPermit permit,
                                const std::string& model,
                                const std::string& version,
                                const std::string& action,
                                HttpResponse* response) const {
  if (action == "infer") {
    if (request.method != "POST") {
      return SetMethodNotAllowed("POST", response);
    }
    return Infer(request, std::move(permit), model, version, response);
  }
  if (request.method != "GET") return SetMethodNotAllowed("GET", response);
  if (action == "stats") return Statistics(model, version, response);
  if (action == "ready") {
    // Unknown models are not ready: 404 says why; draining: 503.
    if (!models_.IsConditioning(model)) {
      absl::StatusOr<const Preset*> found =
          kserve::FindModel(core_.presets(), model, version);
      if (!found.ok()) return SetError(found.status(), response);
    }
    return SetProbe(admission_->serving() && models_.Ready(model, version), 503,
                    response);
  }
  if (absl::Status status = Enter(); !status.ok()) {
    return SetError(status, response);
  }
  if (action == "config") {
    inference::ModelConfig config;
    if (absl::Status status = models_.FillConfig(model, version, &config);
        !status.ok()) {
      return SetError(status, response);
    }
    return SetJson(200, MessageToJson(config), response);
  }
  inference::ModelMetadataResponse metadata;
  if (absl::Status status = models_.FillMetadata(model, version, &metadata);
      !status.ok()) {
    return SetError(status, response);
  }
  SetJson(200, MessageToJson(metadata), response);
}

void RestHandler::Statistics(const std::string& model,
                             const std::string& version,
                             HttpResponse* response) const {
  if (absl::Status status = Enter(); !status.ok()) {
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

absl::StatusOr<EncodedInferResponse> RestHandler::Answer(
    const HttpRequest& request, const std::string& model,
    const std::string& version, InferredCall* call) const {
  // Authenticated and admitted by Accept, before the body was read.
  call->stats.Lap(kserve::InferPhase::kQueue);
  ASSIGN_OR_RETURN(const std::optional<uint64_t> json_length,
                   JsonLength(request));
  // What the body costs once parsed is held like its bytes.
  AdmissionTicket& ticket = call->ticket;
  ASSIGN_OR_RETURN(
      InferBody body,
      ParseInferBody(request.body, json_length, [&ticket](int64_t bytes) {
        return ticket.Reserve(bytes);
      }));
  body.request.set_model_name(model);
  body.request.set_model_version(version);
  call->id = body.request.id();
  call->stats.Lap(kserve::InferPhase::kComputeInput);
  inference::ModelInferResponse answer;
  RETURN_IF_ERROR(kserve::RunInference(models_, shared_memory_, body.request,
                                       &answer, &call->ticket));
  call->stats.Lap(kserve::InferPhase::kComputeInfer);
  // JSON outputs take several times their raw bytes: held like them.
  RETURN_IF_ERROR(call->ticket.Reserve(ExtraJsonBytes(body, answer)));
  call->batch = kserve::TimestepsAnswered(models_, answer);
  return EncodeInferResponse(body, &answer);
}

void RestHandler::Infer(const HttpRequest& request, BodyPermit permit,
                        const std::string& model, const std::string& version,
                        HttpResponse* response) const {
  RequestTimer timer(observer_, kInferMethod);
  InferredCall call(statistics_);
  call.ticket = std::move(permit.ticket_);
  absl::StatusOr<EncodedInferResponse> encoded =
      Answer(request, model, version, &call);
  call.stats.Lap(kserve::InferPhase::kComputeOutput);
  if (!encoded.ok()) {
    call.stats.Finish(encoded.status(), model, 0);
    timer.Finish(encoded.status(), 0, 0, call.id);
    return SetError(encoded.status(), response);
  }
  call.stats.Finish(absl::OkStatus(), model, call.batch);
  int64_t output_bytes = 0;
  for (const std::string& part : encoded->binary) {
    output_bytes += static_cast<int64_t>(part.size());
  }
  timer.Finish(absl::OkStatus(), call.batch, output_bytes, call.id);

  response->status = 200;
  response->body.clear();
  if (encoded->binary.empty()) {
    response->content_type = "application/json";
  } else {
    response->content_type = "application/octet-stream";
    response->headers.emplace_back("Inference-Header-Content-Length",
                                   std::to_string(encoded->json.size()));
  }
  response->body.reserve(1 + encoded->binary.size());
  response->body.push_back(std::move(encoded->json));
  for (std::string& part : encoded->binary) {
    response->body.push_back(std::move(part));
  }
  call.ticket.MarkAnswered();  // computed; its bytes stay until sent
  response->ticket = std::move(call.ticket);
}

}  // namespace temb::rest

namespace temb::rest {

namespace {

std::optional<SharedMemoryRoute> ParseSharedMemoryPath(absl::string_view path) {
  SharedMemoryRoute route;
  if (absl::ConsumePrefix(&path, "/v2/cudasharedmemory/")) {
    route.cuda = true;
  } else if (!absl::ConsumePrefix(&path, "/v2/systemsharedmemory/")) {
    return std::nullopt;
  }
  if (absl::ConsumePrefix(&path, "region/")) {
    const size_t slash = path.rfind('/');
    if (slash == absl::string_view::npos || slash == 0) return std::nullopt;
    route.name = std::string(path.substr(0, slash));
    path.remove_prefix(slash + 1);
  }
  route.action = std::string(path);
  const bool known = route.action == "status" || route.action == "unregister" ||
                     (route.action == "register" && !route.name.empty());
  if (!known) return std::nullopt;
  return route;
}

// A byte count or offset of a register body: a JSON integer in
// [0, 2^63 - 1] (the gRPC message's uint64 fields, and what mmap takes),
// never a fraction that would be truncated.
absl::StatusOr<uint64_t> ByteCountMember(const nlohmann::json& body,
                                         const char* key) {
  const nlohmann::json& value = body.at(key);
  const bool integer = value.is_number_unsigned() ||
                       (value.is_number_integer() && value.get<int64_t>() >= 0);
  if (!integer ||
      value.get<uint64_t>() >
          static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    // Only a number is shown: dumping a nested value recurses per level.
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", key, "\" must be an integer in [0, ",
        std::numeric_limits<int64_t>::max(), "], got ",
        value.is_number() ? value.dump()
                          : std::string("a ") + value.type_name()));
  }
  return value.get<uint64_t>();
}

struct RegisterBody {
  std::string key;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};

absl::StatusOr<RegisterBody> ParseRegisterBody(absl::string_view text) {
  constexpr absl::string_view kShape =
      "the body must be {\"key\": string, \"byte_size\": integer, "
      "\"offset\": integer}";
  RegisterBody out;
  try {
    const nlohmann::json body = nlohmann::json::parse(text);
    out.key = body.at("key").get<std::string>();
    ASSIGN_OR_RETURN(out.byte_size, ByteCountMember(body, "byte_size"));
    if (body.contains("offset")) {
      ASSIGN_OR_RETURN(out.offset, ByteCountMember(body, "offset"));
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(kShape, ": ", e.what()));
  }
  return out;
}

std::string RegionsJson(
    const std::vector<std::shared_ptr<const kserve::SharedMemoryRegion>>&
        regions) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& region : regions) {
    list.push_back({{"name", region->name()},
                    {"key", region->key()},
                    {"offset", region->offset()},
                    {"byte_size", region->byte_size()}});
  }
  return list.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

namespace {

// A repository call's body: empty, or a JSON object with at most the
// member `allowed` ("ready": a boolean; "parameters": an empty object).
absl::StatusOr<bool> RepositoryBody(absl::string_view text,
                                    absl::string_view allowed) {
  if (absl::StripAsciiWhitespace(text).empty()) return false;
  const std::string shape =
      allowed == "ready"
          ? std::string("the body must be {} or {\"ready\": true|false}")
          : std::string(
                "the body must be {} (no parameters are taken but "
                "unload_dependents)");
  try {
    const nlohmann::json body = nlohmann::json::parse(text);
    if (!body.is_object()) return absl::InvalidArgumentError(shape);
    bool ready = false;
    for (const auto& [key, value] : body.items()) {
      if (key == "ready" && allowed == "ready" && value.is_boolean()) {
        ready = value.get<bool>();
      } else if (key == "parameters" && allowed == "parameters" &&
                 value.is_object() &&
                 (value.empty() ||
                  (value.size() == 1 && value.contains("unload_dependents")))) {
        // tritonclient's unload_model sends unload_dependents; a
        // conditioning model has no dependents.
        continue;
      } else {
        return absl::InvalidArgumentError(shape);
      }
    }
    return ready;
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(shape, ": ", e.what()));
  }
}

}  // namespace

bool RestHandler::RepositoryEndpoint(const HttpRequest& request,
                                     HttpResponse* response) const {
  if (!absl::StartsWith(request.path, "/v2/repository/")) return false;
  if (request.method != "POST") {
    SetMethodNotAllowed("POST", response);
    return true;
  }
  absl::StatusOr<std::string> answer = RepositoryAnswer(request);
  if (answer.ok()) {
    SetJson(200, *std::move(answer), response);
  } else {
    SetError(answer.status(), response);
  }
  return true;
}

absl::StatusOr<std::string> RestHandler::RepositoryAnswer(
    const HttpRequest& request) const {
  RETURN_IF_ERROR(Enter());
  if (control_ == nullptr) {
    return absl::FailedPreconditionError(
        "the server has no model repository (--model_repository)");
  }
  absl::string_view path = request.path;
  if (path == "/v2/repository/index") {
    ASSIGN_OR_RETURN(const bool ready, RepositoryBody(request.body, "ready"));
    nlohmann::json list = nlohmann::json::array();
    for (const auto& entry : control_->Index(ready)) {
      inference::RepositoryIndexResponse::ModelIndex index;
      kserve::FillModelIndex(entry, &index);
      list.push_back({{"name", index.name()},
                      {"version", index.version()},
                      {"state", index.state()},
                      {"reason", index.reason()}});
    }
    return list.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  if (absl::ConsumePrefix(&path, "/v2/repository/models/")) {
    const std::vector<std::string> parts = absl::StrSplit(path, '/');
    if (parts.size() == 2 && (parts[1] == "load" || parts[1] == "unload")) {
      RETURN_IF_ERROR(RepositoryBody(request.body, "parameters").status());
      RETURN_IF_ERROR(parts[1] == "load" ? control_->Load(parts[0])
                                         : control_->Unload(parts[0]));
      return std::string("{}");
    }
  }
  return absl::NotFoundError(
      absl::StrCat("no endpoint POST ", request.path.substr(0, 256),
                   " (the repository's: /v2/repository/index, "
                   "/v2/repository/models/{model}/load and .../unload)"));
}

bool RestHandler::SharedMemoryEndpoint(const HttpRequest& request,
                                       HttpResponse* response) const {
  const std::optional<SharedMemoryRoute> route =
      ParseSharedMemoryPath(request.path);
  if (!route.has_value()) return false;
  const bool get = route->action == "status";
  if (get != (request.method == "GET")) {
    SetMethodNotAllowed(get ? "GET" : "POST", response);
    return true;
  }
  absl::StatusOr<std::string> answer = SharedMemoryAnswer(request, *route);
  if (answer.ok()) {
    SetJson(200, *std::move(answer), response);
  } else {
    SetError(answer.status(), response);
  }
  return true;
}

absl::StatusOr<std::string> RestHandler::SharedMemoryAnswer(
    const HttpRequest& request, const SharedMemoryRoute& route) const {
  RETURN_IF_ERROR(Enter());
  if (route.cuda) {
    // No CUDA region is ever registered.
    if (route.action == "register") {
      return absl::InvalidArgumentError(
          "CUDA shared memory is not supported; use system shared memory");
    }
    if (!route.name.empty()) {
      return absl::NotFoundError(absl::StrCat("no CUDA shared memory region \"",
                                              route.name, "\" is registered"));
    }
    return std::string(route.action == "status" ? "[]" : "{}");
  }
  if (shared_memory_ == nullptr) {
    return absl::UnimplementedError("shared memory is not enabled");
  }
  if (route.action == "unregister") {
    RETURN_IF_ERROR(shared_memory_->Unregister(route.name));
    return std::string("{}");
  }
  if (route.action == "register") {
    ASSIGN_OR_RETURN(const RegisterBody body, ParseRegisterBody(request.body));
    RETURN_IF_ERROR(shared_memory_->Register(route.name, body.key, body.offset,
                                             body.byte_size));
    return std::string("{}");
  }
  ASSIGN_OR_RETURN(const auto regions, shared_memory_->Status(route.name));
  return RegionsJson(regions);
}

}  // namespace temb::rest
