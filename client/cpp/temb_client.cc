#include "temb/client/temb_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "temb/base/file_reader.h"

namespace temb {
namespace {

// gRPC's service config wants durations as decimal seconds, "0.05s", with
// up to nine fractional digits (nanoseconds); fewer would round a short
// backoff to "0s", which gRPC rejects.
std::string ConfigDuration(absl::Duration d) {
  std::string text = absl::StrFormat("%.9f", absl::ToDoubleSeconds(d));
  while (text.back() == '0' && text[text.size() - 2] != '.') text.pop_back();
  return text + "s";
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const ClientOptions& options) {
  if (!options.tls && options.tls_ca_file.empty() &&
      options.tls_cert_file.empty() && options.tls_key_file.empty()) {
    return grpc::InsecureChannelCredentials();
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "a client certificate needs its key: set both tls_cert and tls_key, "
        "or neither");
  }
  grpc::SslCredentialsOptions ssl;
  const std::pair<const std::string*, std::string*> files[] = {
      {&options.tls_ca_file, &ssl.pem_root_certs},
      {&options.tls_cert_file, &ssl.pem_cert_chain},
      {&options.tls_key_file, &ssl.pem_private_key},
  };
  for (const auto& [path, pem] : files) {
    if (path->empty()) continue;
    absl::StatusOr<std::string> contents = ReadFile(*path, "TLS file");
    if (!contents.ok()) return contents.status();
    *pem = *std::move(contents);
  }
  return grpc::SslCredentials(ssl);
}

std::string ServiceConfigJson(const ClientOptions& options) {
  const int attempts = std::clamp(options.max_attempts, 1, 5);
  std::string retry;
  if (attempts > 1) {
    retry = absl::StrFormat(
        R"(,"retryPolicy":{"maxAttempts":%d,"initialBackoff":"%s",)"
        R"("maxBackoff":"%s","backoffMultiplier":2,)"
        R"("retryableStatusCodes":["UNAVAILABLE","CANCELLED"]})",
        attempts, ConfigDuration(options.initial_backoff),
        ConfigDuration(options.max_backoff));
  }
  // Embed, Condition and GetServerInfo are idempotent; a stream is not retried
  // because its requests may already have been answered.  CANCELLED is retried
  // because a server that is shutting down cancels calls that reached it
  // too late to be handled; a retry policy only ever acts on a status that
  // came from the server, so a cancel by this application (or an expired
  // deadline) is never retried.
  return absl::StrCat(
      R"({"loadBalancingConfig":[{"round_robin":{}}],"methodConfig":[{"name":[)",
      R"({"service":"temb.v1.EmbeddingService","method":"Embed"},)",
      R"({"service":"temb.v1.EmbeddingService","method":"Condition"},)",
      R"({"service":"temb.v1.EmbeddingService","method":"GetServerInfo"}])",
      retry, "}]}");
}

std::shared_ptr<grpc::Channel> CreateTembChannel(
    const ClientOptions& options,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    int pool_index) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  args.SetServiceConfigJSON(ServiceConfigJson(options));
  // Channels with identical arguments share subchannels (and so TCP
  // connections) through gRPC's global pool; a local pool per channel is
  // what makes a channel pool worth having.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("temb.pool_index", pool_index);
  if (!options.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls_server_name);
  }
  return grpc::CreateCustomChannel(options.target, credentials, args);
}

absl::Status ToAbslStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

std::string StatusCodeName(int code) {
  if (code < 0 || code > 16) return absl::StrCat("CODE_", code);
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

EmbedStream::EmbedStream(std::unique_ptr<grpc::ClientContext> context,
                         v1::EmbeddingService::Stub* stub)
    : context_(std::move(context)),
      stream_(stub->EmbedStream(context_.get())) {}

bool EmbedStream::Write(const v1::EmbedRequest& request) {
  return stream_->Write(request);
}

bool EmbedStream::WritesDone() { return stream_->WritesDone(); }

absl::StatusOr<v1::EmbedStreamResponse> EmbedStream::Read() {
  v1::EmbedStreamResponse response;
  if (stream_->Read(&response)) return response;
  return absl::OutOfRangeError("end of stream");
}

absl::Status EmbedStream::Finish() { return ToAbslStatus(stream_->Finish()); }

absl::StatusOr<std::unique_ptr<Client>> Client::Create(
    const ClientOptions& options,
    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  if (options.target.empty()) {
    return absl::InvalidArgumentError("target must not be empty");
  }
  if (options.channels < 1 || options.channels > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("channels must be in [1, 64], got ", options.channels));
  }
  if (options.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("deadline must be positive");
  }
  if (credentials == nullptr) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> made =
        ChannelCredentials(options);
    if (!made.ok()) return made.status();
    credentials = *std::move(made);
  }
  std::unique_ptr<Client> client(new Client(options));
  for (int i = 0; i < options.channels; ++i) {
    client->channels_.push_back(CreateTembChannel(options, credentials, i));
    client->stubs_.push_back(
        v1::EmbeddingService::NewStub(client->channels_.back()));
  }
  client->health_stub_ =
      grpc::health::v1::Health::NewStub(client->channels_[0]);
  return client;
}

Client::Client(const ClientOptions& options) : options_(options) {}

v1::EmbeddingService::Stub* Client::NextStub() {
  return stubs_[next_.fetch_add(1, std::memory_order_relaxed) % stubs_.size()]
      .get();
}

void Client::ConfigureContext(grpc::ClientContext* context) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + options_.deadline));
  AddCallMetadata(context);
}

void Client::AddCallMetadata(grpc::ClientContext* context) const {
  // Plain metadata rather than call credentials: gRPC drops call
  // credentials on insecure channels, and a token over plaintext is the
  // operator's choice (e.g. inside a mesh that encrypts for us).
  if (!options_.auth_token.empty()) {
    context->AddMetadata("authorization",
                         absl::StrCat("Bearer ", options_.auth_token));
  }
}

absl::StatusOr<v1::EmbedResponse> Client::Embed(
    const v1::EmbedRequest& request) {
  grpc::ClientContext context;
  ConfigureContext(&context);
  v1::EmbedResponse response;
  grpc::Status status = NextStub()->Embed(&context, request, &response);
  if (!status.ok()) return ToAbslStatus(status);
  return response;
}

absl::StatusOr<v1::ServerInfo> Client::GetServerInfo() {
  grpc::ClientContext context;
  ConfigureContext(&context);
  v1::ServerInfo info;
  grpc::Status status =
      NextStub()->GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
  if (!status.ok()) return ToAbslStatus(status);
  return info;
}

absl::StatusOr<v1::ConditionResponse> Client::Condition(
    const v1::ConditionRequest& request) {
  grpc::ClientContext context;
  ConfigureContext(&context);
  v1::ConditionResponse response;
  grpc::Status status = NextStub()->Condition(&context, request, &response);
  if (!status.ok()) return ToAbslStatus(status);
  return response;
}

absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus>
Client::Health(const std::string& service) {
  grpc::ClientContext context;
  ConfigureContext(&context);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = health_stub_->Check(&context, request, &response);
  if (!status.ok()) return ToAbslStatus(status);
  return response.status();
}

std::unique_ptr<EmbedStream> Client::OpenStream() {
  auto context = std::make_unique<grpc::ClientContext>();
  ConfigureContext(context.get());
  return std::make_unique<EmbedStream>(std::move(context), NextStub());
}

}  // namespace temb
