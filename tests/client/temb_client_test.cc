// temb::Client, the C++ client library.
//
// Three kinds of tests: option validation and the service config (no
// server); calls against the real server assembly (temb::App on
// 127.0.0.1:0 with the CPU backend behind a gate that can hold a
// computation); and the retry policy against a scripted fake
// EmbeddingService that fails a given number of attempts and counts them,
// since only a server that fails on purpose shows how often the client
// tried.
#include "temb/client/temb_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "temb/app/app.h"
#include "temb/kernels/embedding_spec.h"
#include "temb/testing/cpu_reference.h"
#include "temb/testing/gated_backend.h"
#include "temb/testing/loopback_server.h"
#include "temb/v1/temb.grpc.pb.h"

namespace temb {
namespace {

using ::grpc::health::v1::HealthCheckResponse;
using ::temb::testing::CpuBackendBytes;
using ::temb::testing::GatedBackend;
using ::temb::testing::ServeOnLoopback;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------
// Options and the service config, no server.

google::protobuf::Struct ParseJson(const std::string& json) {
  google::protobuf::Struct parsed;
  const auto status =
      google::protobuf::util::JsonStringToMessage(json, &parsed);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return parsed;
}

const google::protobuf::Struct& MethodConfig(
    const google::protobuf::Struct& config) {
  const auto& list = config.fields().at("methodConfig").list_value();
  EXPECT_EQ(list.values_size(), 1);
  return list.values(0).struct_value();
}

TEST(ServiceConfigJsonTest, RoundRobinAndTheIdempotentMethods) {
  const google::protobuf::Struct config =
      ParseJson(ServiceConfigJson(ClientOptions()));
  const auto& lb = config.fields().at("loadBalancingConfig").list_value();
  ASSERT_EQ(lb.values_size(), 1);
  EXPECT_TRUE(lb.values(0).struct_value().fields().count("round_robin") == 1);

  // Embed and GetServerInfo only: a stream may already have been answered
  // in part, so it must never be replayed.
  std::vector<std::string> methods;
  for (const auto& name :
       MethodConfig(config).fields().at("name").list_value().values()) {
    const auto& fields = name.struct_value().fields();
    EXPECT_EQ(fields.at("service").string_value(), "temb.v1.EmbeddingService");
    methods.push_back(fields.at("method").string_value());
  }
  EXPECT_THAT(methods, ElementsAre("Embed", "Condition", "GetServerInfo"));
}

TEST(ServiceConfigJsonTest, RetryPolicyFollowsTheOptions) {
  ClientOptions options;
  options.max_attempts = 3;
  options.initial_backoff = absl::Milliseconds(20);
  options.max_backoff = absl::Milliseconds(1500);
  const google::protobuf::Struct config = ParseJson(ServiceConfigJson(options));
  const auto& retry =
      MethodConfig(config).fields().at("retryPolicy").struct_value().fields();
  EXPECT_EQ(retry.at("maxAttempts").number_value(), 3);
  EXPECT_EQ(retry.at("initialBackoff").string_value(), "0.02s");
  EXPECT_EQ(retry.at("maxBackoff").string_value(), "1.5s");
  EXPECT_EQ(retry.at("backoffMultiplier").number_value(), 2);
  std::vector<std::string> codes;
  for (const auto& code :
       retry.at("retryableStatusCodes").list_value().values()) {
    codes.push_back(code.string_value());
  }
  EXPECT_THAT(codes, ElementsAre("UNAVAILABLE", "CANCELLED"));
}

// A backoff under a millisecond used to print as "0.000s", which gRPC
// rejects, failing every call of the channel.
TEST(ServiceConfigJsonTest, SubMillisecondBackoffKeepsItsDigits) {
  ClientOptions options;
  options.max_attempts = 3;
  options.initial_backoff = absl::Microseconds(100);
  options.max_backoff = absl::Microseconds(250);
  const std::string json = ServiceConfigJson(options);
  EXPECT_THAT(json, HasSubstr("\"initialBackoff\":\"0.0001s\""));
  EXPECT_THAT(json, HasSubstr("\"maxBackoff\":\"0.00025s\""));
}

TEST(ServiceConfigJsonTest, AttemptsAreClampedAndOneMeansNoPolicy) {
  for (int attempts : {1, 0, -4}) {
    ClientOptions options;
    options.max_attempts = attempts;
    const google::protobuf::Struct config =
        ParseJson(ServiceConfigJson(options));
    EXPECT_EQ(MethodConfig(config).fields().count("retryPolicy"), 0u)
        << attempts;
  }
  ClientOptions options;
  options.max_attempts = 9;  // gRPC caps at 5; the config says so itself
  const google::protobuf::Struct config = ParseJson(ServiceConfigJson(options));
  EXPECT_EQ(MethodConfig(config)
                .fields()
                .at("retryPolicy")
                .struct_value()
                .fields()
                .at("maxAttempts")
                .number_value(),
            5);
}

TEST(StatusTest, CodeNamesAndConversion) {
  EXPECT_EQ(StatusCodeName(0), "OK");
  EXPECT_EQ(StatusCodeName(3), "INVALID_ARGUMENT");
  EXPECT_EQ(StatusCodeName(14), "UNAVAILABLE");
  EXPECT_EQ(StatusCodeName(16), "UNAUTHENTICATED");
  EXPECT_EQ(StatusCodeName(17), "CODE_17");
  EXPECT_EQ(StatusCodeName(-1), "CODE_-1");

  EXPECT_TRUE(ToAbslStatus(grpc::Status::OK).ok());
  const absl::Status status = ToAbslStatus(
      grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "too large"));
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(), "too large");
}

// A scratch directory for PEM and token files, removed afterwards.
class TempDir {
 public:
  TempDir() {
    char dir[] = "/tmp/temb_client_test.XXXXXX";
    if (mkdtemp(dir) != nullptr) path_ = dir;
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& contents) {
    const std::string file = path_ + "/" + name;
    std::ofstream(file) << contents;
    return file;
  }

 private:
  std::string path_;
};

TEST(ChannelCredentialsTest, CertificateAndKeyGoTogether) {
  TempDir dir;
  const std::string pem = dir.Write("any.pem", "not checked yet");
  ClientOptions options;
  options.tls_cert_file = pem;
  auto credentials = ChannelCredentials(options);
  EXPECT_EQ(credentials.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(credentials.status().message(), HasSubstr("key"));

  options.tls_cert_file.clear();
  options.tls_key_file = pem;
  EXPECT_EQ(ChannelCredentials(options).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Client::Create builds the credentials from the same options.
  options.target = "127.0.0.1:1";
  EXPECT_EQ(Client::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChannelCredentialsTest, UnreadableFilesKeepReadFilesCode) {
  TempDir dir;
  const std::string pem = dir.Write("ok.pem", "x");
  const std::string missing = dir.path() + "/missing.pem";
  struct Case {
    const char* which;
    ClientOptions options;
  };
  std::vector<Case> cases(3);
  cases[0].which = "ca";
  cases[0].options.tls_ca_file = missing;
  cases[1].which = "cert";
  cases[1].options.tls_cert_file = missing;
  cases[1].options.tls_key_file = pem;
  cases[2].which = "key";
  cases[2].options.tls_cert_file = pem;
  cases[2].options.tls_key_file = missing;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.which);
    auto credentials = ChannelCredentials(c.options);
    EXPECT_EQ(credentials.status().code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(credentials.status().message(), HasSubstr(missing));
  }
  // A directory reads as an error too, not as an empty PEM.
  ClientOptions options;
  options.tls_ca_file = dir.path();
  EXPECT_FALSE(ChannelCredentials(options).ok());
}

TEST(ChannelCredentialsTest, InsecureUnlessAskedForTls) {
  ClientOptions options;
  auto credentials = ChannelCredentials(options);
  ASSERT_TRUE(credentials.ok());
  ASSERT_NE(*credentials, nullptr);
  // The PEM contents are only checked at the handshake.
  TempDir dir;
  options.tls_ca_file = dir.Write("ca.pem", "garbage");
  credentials = ChannelCredentials(options);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_NE(*credentials, nullptr);
}

TEST(ClientCreateTest, RefusesBadOptions) {
  ClientOptions options;
  EXPECT_THAT(Client::Create(options).status().message(), HasSubstr("target"));
  options.target = "127.0.0.1:1";
  for (int channels : {0, -1, 65}) {
    options.channels = channels;
    auto client = Client::Create(options);
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument)
        << channels;
    EXPECT_THAT(client.status().message(), HasSubstr("channels"));
  }
  options.channels = 64;
  EXPECT_TRUE(Client::Create(options).ok());
  options.channels = 1;
  for (absl::Duration deadline : {absl::ZeroDuration(), absl::Seconds(-1)}) {
    options.deadline = deadline;
    EXPECT_EQ(Client::Create(options).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(ClientCreateTest, GivenCredentialsWinOverTheOptions) {
  // Options that ChannelCredentials() refuses, but the caller brings its
  // own credentials, so they are not consulted.
  ClientOptions options;
  options.target = "127.0.0.1:1";
  options.tls_cert_file = "/nonexistent/cert.pem";
  EXPECT_TRUE(Client::Create(options, grpc::InsecureChannelCredentials()).ok());
}

TEST(ClientCreateTest, ChannelPoolIsRoundRobin) {
  ClientOptions options;
  options.target = "127.0.0.1:1";
  options.channels = 3;
  auto client = Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<v1::EmbeddingService::Stub*> stubs;
  for (int i = 0; i < 7; ++i) stubs.push_back((*client)->NextStub());
  EXPECT_NE(stubs[0], stubs[1]);
  EXPECT_NE(stubs[1], stubs[2]);
  EXPECT_NE(stubs[0], stubs[2]);
  EXPECT_EQ(stubs[3], stubs[0]);
  EXPECT_EQ(stubs[4], stubs[1]);
  EXPECT_EQ(stubs[5], stubs[2]);
  EXPECT_EQ(stubs[6], stubs[0]);

  options.channels = 1;
  auto single = Client::Create(options);
  ASSERT_TRUE(single.ok());
  EXPECT_EQ((*single)->NextStub(), (*single)->NextStub());
}

TEST(ClientCreateTest, ConfigureContextSetsTheDeadline) {
  ClientOptions options;
  options.target = "127.0.0.1:1";
  options.deadline = absl::Seconds(7);
  auto client = Client::Create(options);
  ASSERT_TRUE(client.ok());
  const absl::Time before = absl::Now();
  grpc::ClientContext context;
  (*client)->ConfigureContext(&context);
  const absl::Time deadline = absl::FromChrono(context.deadline());
  EXPECT_GE(deadline, before + absl::Seconds(7));
  EXPECT_LE(deadline, absl::Now() + absl::Seconds(7));
}

// ---------------------------------------------------------------------------
// Against the real server.

v1::EmbedRequest LdmRequest(int dim, std::vector<float> timesteps,
                            const std::string& id = "") {
  v1::EmbedRequest request;
  request.set_preset("ldm");
  request.mutable_spec()->set_dim(dim);
  for (float t : timesteps) request.add_timesteps(t);
  request.set_request_id(id);
  return request;
}

EmbeddingSpec LdmSpec(int dim) {
  EmbeddingSpec spec;
  spec.dim = dim;
  spec.flip_sin_to_cos = true;
  spec.downscale_freq_shift = 0;
  return spec;
}

class RealServerTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(AppOptions()); }

  void TearDown() override {
    if (backend_ != nullptr) backend_->Open();  // never leave a call held
    app_.reset();
  }

  void Start(AppOptions options) {
    if (backend_ != nullptr) backend_->Open();
    app_.reset();
    options.address = "127.0.0.1:0";
    options.metrics_address = "";
    options.drain_grace = absl::Seconds(5);
    options.drain_quiet = absl::Milliseconds(1);
    auto backend = std::make_unique<GatedBackend>();
    backend_ = backend.get();
    auto app = App::Start(options, std::move(backend));
    ASSERT_TRUE(app.ok()) << app.status();
    app_ = *std::move(app);
  }

  std::string Target() const {
    return absl::StrCat("127.0.0.1:", app_->port());
  }

  std::unique_ptr<Client> NewClient(ClientOptions options = ClientOptions()) {
    options.target = Target();
    auto client = Client::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::unique_ptr<App> app_;
  GatedBackend* backend_ = nullptr;
};

TEST_F(RealServerTest, EmbedReturnsTheServersBytes) {
  std::unique_ptr<Client> client = NewClient();
  ASSERT_NE(client, nullptr);
  const std::vector<float> ts = {0.0f, 1.0f, 500.5f};
  absl::StatusOr<v1::EmbedResponse> response =
      client->Embed(LdmRequest(64, ts, "id-7"));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->request_id(), "id-7");
  EXPECT_EQ(response->backend(), "cpu");
  EXPECT_THAT(response->embedding().shape(), ElementsAre(3, 64));
  EXPECT_TRUE(response->embedding().data() == CpuBackendBytes(LdmSpec(64), ts));
}

TEST_F(RealServerTest, ServerErrorsKeepTheirCodeAndMessage) {
  std::unique_ptr<Client> client = NewClient();
  ASSERT_NE(client, nullptr);
  v1::EmbedRequest request = LdmRequest(64, {1});
  request.set_preset("no-such-preset");
  absl::StatusOr<v1::EmbedResponse> response = client->Embed(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(response.status().message(), HasSubstr("no-such-preset"));

  request.set_preset("ldm");
  request.mutable_spec()->set_layout(v1::LAYOUT_INTERLEAVED);  // odd dim
  request.mutable_spec()->set_dim(7);
  response = client->Embed(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->calls(), 0);
}

TEST_F(RealServerTest, ServerInfoAndHealth) {
  std::unique_ptr<Client> client = NewClient();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->backend(), "cpu");
  EXPECT_EQ(info->limits().max_dim(), Limits().max_dim);
  EXPECT_EQ(info->presets_size(),
            static_cast<int>(app_->service().presets().presets().size()));

  auto health = client->Health("");
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, HealthCheckResponse::SERVING);
  health = client->Health("temb.v1.EmbeddingService");
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, HealthCheckResponse::SERVING);
  // An unknown service is an RPC error, not a status.
  health = client->Health("no.such.Service");
  EXPECT_EQ(health.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RealServerTest, StreamAnswersInOrderThenEnds) {
  std::unique_ptr<Client> client = NewClient();
  ASSERT_NE(client, nullptr);
  std::unique_ptr<EmbedStream> stream = client->OpenStream();
  v1::EmbedRequest bad = LdmRequest(8, {1}, "r1");
  bad.set_preset("nope");
  ASSERT_TRUE(stream->Write(LdmRequest(8, {1, 2}, "r0")));
  ASSERT_TRUE(stream->Write(bad));
  ASSERT_TRUE(stream->Write(LdmRequest(16, {3}, "r2")));
  ASSERT_TRUE(stream->WritesDone());

  absl::StatusOr<v1::EmbedStreamResponse> answer = stream->Read();
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->request_id(), "r0");
  ASSERT_TRUE(answer->has_response());
  EXPECT_TRUE(answer->response().embedding().data() ==
              CpuBackendBytes(LdmSpec(8), {1, 2}));
  // A bad request is answered in its place; the stream goes on.
  answer = stream->Read();
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->request_id(), "r1");
  ASSERT_TRUE(answer->has_error());
  EXPECT_EQ(answer->error().code(), grpc::StatusCode::NOT_FOUND);
  answer = stream->Read();
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->request_id(), "r2");
  EXPECT_THAT(answer->response().embedding().shape(), ElementsAre(1, 16));

  EXPECT_EQ(stream->Read().status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(RealServerTest, DeadlineCoversTheCallAndIsNotRetried) {
  ClientOptions options;
  options.deadline = absl::Milliseconds(300);
  options.max_attempts = 5;
  options.initial_backoff = absl::Milliseconds(1);
  std::unique_ptr<Client> client = NewClient(options);
  ASSERT_NE(client, nullptr);
  backend_->Close();
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::EmbedResponse> response =
      client->Embed(LdmRequest(8, {1}));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(response.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(10));
  backend_->Open();
  // At most one attempt reached the backend: an expired deadline is never
  // retried, even with attempts to spare.
  EXPECT_LE(backend_->calls(), 1);
  // The client is fine afterwards.  A few tries: 300 ms is short for a
  // loaded machine, and one slow call is not what this checks; a broken
  // client fails them all.
  absl::Status after;
  for (int attempt = 0; attempt < 10; ++attempt) {
    after = client->Embed(LdmRequest(8, {1})).status();
    if (after.ok()) break;
  }
  EXPECT_TRUE(after.ok()) << after;
}

TEST_F(RealServerTest, StreamDeadlineEndsTheStream) {
  ClientOptions options;
  options.deadline = absl::Milliseconds(300);
  std::unique_ptr<Client> client = NewClient(options);
  ASSERT_NE(client, nullptr);
  backend_->Close();
  std::unique_ptr<EmbedStream> stream = client->OpenStream();
  ASSERT_TRUE(stream->Write(LdmRequest(8, {1})));
  absl::StatusOr<v1::EmbedStreamResponse> answer = stream->Read();
  EXPECT_FALSE(answer.ok());
  EXPECT_EQ(stream->Finish().code(), absl::StatusCode::kDeadlineExceeded);
  backend_->Open();
}

TEST_F(RealServerTest, PooledChannelsAllServe) {
  ClientOptions options;
  options.channels = 3;
  std::unique_ptr<Client> client = NewClient(options);
  ASSERT_NE(client, nullptr);
  for (int i = 0; i < 6; ++i) {  // twice round the pool
    absl::StatusOr<v1::EmbedResponse> response =
        client->Embed(LdmRequest(8, {static_cast<float>(i)}));
    ASSERT_TRUE(response.ok()) << i << ": " << response.status();
  }
  EXPECT_EQ(backend_->calls(), 6);
}

TEST_F(RealServerTest, BearerTokenIsSentOnEveryCall) {
  TempDir dir;
  AppOptions app_options;
  app_options.auth_token_file = dir.Write("tokens", "s3cret-token\n");
  Start(app_options);

  ClientOptions options;
  options.max_attempts = 1;
  std::unique_ptr<Client> anonymous = NewClient(options);
  ASSERT_NE(anonymous, nullptr);
  EXPECT_EQ(anonymous->Embed(LdmRequest(8, {1})).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anonymous->GetServerInfo().status().code(),
            absl::StatusCode::kUnauthenticated);
  // Health stays open to probes without a token.
  EXPECT_TRUE(anonymous->Health("").ok());

  options.auth_token = "wrong-token";
  EXPECT_EQ(NewClient(options)->Embed(LdmRequest(8, {1})).status().code(),
            absl::StatusCode::kUnauthenticated);

  options.auth_token = "s3cret-token";
  std::unique_ptr<Client> client = NewClient(options);
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(client->Embed(LdmRequest(8, {1})).ok());
  EXPECT_TRUE(client->GetServerInfo().ok());
  std::unique_ptr<EmbedStream> stream = client->OpenStream();
  ASSERT_TRUE(stream->Write(LdmRequest(8, {1})));
  ASSERT_TRUE(stream->WritesDone());
  absl::StatusOr<v1::EmbedStreamResponse> answer = stream->Read();
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE(answer->has_response());
  EXPECT_EQ(stream->Read().status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(RealServerTest, TlsCredentialsDoNotTalkToAPlaintextServer) {
  ClientOptions options;
  options.tls = true;
  options.max_attempts = 1;
  options.deadline = absl::Seconds(10);
  std::unique_ptr<Client> client = NewClient(options);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->Embed(LdmRequest(8, {1})).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(backend_->calls(), 0);
}

// A self-signed certificate for 127.0.0.1 and localhost, made with the
// openssl tool; empty when it is not installed.
struct SelfSigned {
  std::string cert;
  std::string key;
};

SelfSigned MakeCertificate(const TempDir& dir) {
  const std::string cert = dir.path() + "/cert.pem";
  const std::string key = dir.path() + "/key.pem";
  const std::string command = absl::StrCat(
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
      "-nodes -days 2 -subj /CN=temb-client-test "
      "-addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout '",
      key, "' -out '", cert, "' >/dev/null 2>&1");
  if (std::system(command.c_str()) != 0) return {};
  return {cert, key};
}

TEST_F(RealServerTest, TlsVerifiesTheServerAndItsName) {
  TempDir dir;
  const SelfSigned certificate = MakeCertificate(dir);
  if (certificate.cert.empty()) GTEST_SKIP() << "openssl is not available";
  AppOptions app_options;
  app_options.tls.cert_file = certificate.cert;
  app_options.tls.key_file = certificate.key;
  Start(app_options);

  ClientOptions options;
  options.max_attempts = 1;
  options.deadline = absl::Seconds(10);
  options.tls_ca_file = certificate.cert;  // implies TLS
  std::unique_ptr<Client> client = NewClient(options);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<v1::EmbedResponse> response =
      client->Embed(LdmRequest(8, {1}));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_TRUE(response->embedding().data() == CpuBackendBytes(LdmSpec(8), {1}));

  // The name to expect can differ from the target's host...
  options.tls_server_name = "localhost";
  EXPECT_TRUE(NewClient(options)->Embed(LdmRequest(8, {1})).ok());
  // ...and a name the certificate lacks fails the handshake.
  options.tls_server_name = "elsewhere.example";
  EXPECT_EQ(NewClient(options)->Embed(LdmRequest(8, {1})).status().code(),
            absl::StatusCode::kUnavailable);
  // Plaintext to a TLS server fails too.
  ClientOptions plain;
  plain.max_attempts = 1;
  EXPECT_EQ(NewClient(plain)->Embed(LdmRequest(8, {1})).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(UnreachableServerTest, IsUnavailable) {
  // A port that was free a moment ago; nothing listens there.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)),
            0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  close(fd);

  ClientOptions options;
  options.target = absl::StrCat("127.0.0.1:", ntohs(address.sin_port));
  options.max_attempts = 1;
  options.deadline = absl::Seconds(10);
  auto client = Client::Create(options);
  ASSERT_TRUE(client.ok());
  EXPECT_EQ((*client)->Embed(v1::EmbedRequest()).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ((*client)->GetServerInfo().status().code(),
            absl::StatusCode::kUnavailable);
}

// ---------------------------------------------------------------------------
// The retry policy, against a scripted service.

// Fails each call with the next code of its script (OK once the script is
// empty) and counts every attempt.
class ScriptedService final : public v1::EmbeddingService::Service {
 public:
  void Script(std::vector<grpc::StatusCode> codes) {
    std::lock_guard<std::mutex> lock(mutex_);
    script_.assign(codes.begin(), codes.end());
  }
  int attempts() {
    std::lock_guard<std::mutex> lock(mutex_);
    return attempts_;
  }
  std::vector<std::string> authorizations() {
    std::lock_guard<std::mutex> lock(mutex_);
    return authorizations_;
  }

  grpc::Status Embed(grpc::ServerContext* context,
                     const v1::EmbedRequest* request,
                     v1::EmbedResponse* response) override {
    response->set_request_id(request->request_id());
    return Next(context);
  }
  grpc::Status GetServerInfo(grpc::ServerContext* context,
                             const v1::GetServerInfoRequest*,
                             v1::ServerInfo* info) override {
    info->set_backend("scripted");
    return Next(context);
  }
  grpc::Status EmbedStream(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::EmbedStreamResponse, v1::EmbedRequest>*)
      override {
    return Next(context);
  }

 private:
  grpc::Status Next(grpc::ServerContext* context) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++attempts_;
    const auto& metadata = context->client_metadata();
    const auto header = metadata.find("authorization");
    authorizations_.push_back(
        header == metadata.end()
            ? "<none>"
            : std::string(header->second.data(), header->second.size()));
    if (script_.empty()) return grpc::Status::OK;
    const grpc::StatusCode code = script_.front();
    script_.pop_front();
    return grpc::Status(code, "scripted failure");
  }

  std::mutex mutex_;
  std::deque<grpc::StatusCode> script_;
  int attempts_ = 0;
  std::vector<std::string> authorizations_;
};

class RetryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = ServeOnLoopback(&service_, &port_);
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
  }
  void TearDown() override { server_->Shutdown(); }

  std::unique_ptr<Client> NewClient(int max_attempts) {
    ClientOptions options;
    options.target = absl::StrCat("127.0.0.1:", port_);
    options.max_attempts = max_attempts;
    // Short backoffs keep the test fast; the policy is the same.
    options.initial_backoff = absl::Milliseconds(1);
    options.max_backoff = absl::Milliseconds(5);
    options.deadline = absl::Seconds(20);
    auto client = Client::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return *std::move(client);
  }

  ScriptedService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(RetryTest, UnavailableIsRetriedUntilItSucceeds) {
  service_.Script(
      {grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::UNAVAILABLE});
  v1::EmbedRequest request;
  request.set_request_id("again");
  absl::StatusOr<v1::EmbedResponse> response = NewClient(3)->Embed(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->request_id(), "again");
  EXPECT_EQ(service_.attempts(), 3);
}

TEST_F(RetryTest, GivesUpAfterMaxAttempts) {
  service_.Script(
      std::vector<grpc::StatusCode>(10, grpc::StatusCode::UNAVAILABLE));
  absl::StatusOr<v1::EmbedResponse> response =
      NewClient(3)->Embed(v1::EmbedRequest());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(response.status().message(), "scripted failure");
  EXPECT_EQ(service_.attempts(), 3);
}

TEST_F(RetryTest, AttemptsAreCappedAtFive) {
  service_.Script(
      std::vector<grpc::StatusCode>(10, grpc::StatusCode::UNAVAILABLE));
  EXPECT_EQ(NewClient(9)->Embed(v1::EmbedRequest()).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(service_.attempts(), 5);
}

TEST_F(RetryTest, OneAttemptMeansNoRetry) {
  service_.Script({grpc::StatusCode::UNAVAILABLE});
  EXPECT_EQ(NewClient(1)->Embed(v1::EmbedRequest()).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(service_.attempts(), 1);
}

TEST_F(RetryTest, CancelledFromTheServerIsRetried) {
  // A draining server cancels calls that reached it too late.
  service_.Script({grpc::StatusCode::CANCELLED});
  EXPECT_TRUE(NewClient(4)->Embed(v1::EmbedRequest()).ok());
  EXPECT_EQ(service_.attempts(), 2);
}

TEST_F(RetryTest, OtherCodesAreFinal) {
  std::unique_ptr<Client> client = NewClient(5);
  int expected_attempts = 0;
  for (grpc::StatusCode code :
       {grpc::StatusCode::INVALID_ARGUMENT, grpc::StatusCode::NOT_FOUND,
        grpc::StatusCode::RESOURCE_EXHAUSTED, grpc::StatusCode::INTERNAL,
        grpc::StatusCode::DEADLINE_EXCEEDED,
        grpc::StatusCode::UNAUTHENTICATED}) {
    SCOPED_TRACE(StatusCodeName(code));
    service_.Script({code});
    EXPECT_EQ(
        static_cast<int>(client->Embed(v1::EmbedRequest()).status().code()),
        static_cast<int>(code));
    EXPECT_EQ(service_.attempts(), ++expected_attempts);
  }
}

TEST_F(RetryTest, GetServerInfoIsRetried) {
  service_.Script({grpc::StatusCode::UNAVAILABLE});
  absl::StatusOr<v1::ServerInfo> info = NewClient(2)->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->backend(), "scripted");
  EXPECT_EQ(service_.attempts(), 2);
}

TEST_F(RetryTest, StreamsAreNeverRetried) {
  service_.Script({grpc::StatusCode::UNAVAILABLE});
  std::unique_ptr<EmbedStream> stream = NewClient(5)->OpenStream();
  stream->WritesDone();
  EXPECT_FALSE(stream->Read().ok());
  EXPECT_EQ(stream->Finish().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(service_.attempts(), 1);
}

TEST_F(RetryTest, EveryAttemptCarriesTheToken) {
  ClientOptions options;
  options.target = absl::StrCat("127.0.0.1:", port_);
  options.initial_backoff = absl::Milliseconds(1);
  options.auth_token = "tok-1";
  auto client = Client::Create(options);
  ASSERT_TRUE(client.ok());
  service_.Script({grpc::StatusCode::UNAVAILABLE});
  EXPECT_TRUE((*client)->Embed(v1::EmbedRequest()).ok());
  EXPECT_THAT(service_.authorizations(),
              ElementsAre("Bearer tok-1", "Bearer tok-1"));

  // Without a token, no authorization header at all.
  EXPECT_TRUE(NewClient(1)->GetServerInfo().ok());
  EXPECT_EQ(service_.authorizations().back(), "<none>");
}

}  // namespace
}  // namespace temb
