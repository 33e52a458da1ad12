// HttpServer on cpp-httplib (Debian's libcpp-httplib, linked against the
// system OpenSSL 3).  civetweb, already in the process for /metrics, was
// measured too and is faster on plaintext, but Debian's civetweb 1.15 loads
// OpenSSL 1.1 functions from an unversioned libssl.so at run time and
// crashes on the first HTTPS request with OpenSSL 3 (docs/kserve.md).
//
// A pool of worker threads serves the connections (a keep-alive connection
// holds one worker until it goes idle for keep_alive_ms); each request is
// read whole (up to max_body_bytes, 413 beyond), handed to the RestHandler,
// and its response written from the handler's parts without joining them.
#include <httplib.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "temb/rest/http_server.h"
#include "temb/rest/rest_json.h"

namespace temb::rest {
namespace {

// HOST:PORT -> (host for getaddrinfo, port); brackets dropped from IPv6.
absl::Status SplitAddress(const std::string& address, std::string* host,
                          int* port) {
  if (absl::StartsWith(address, "unix:")) {
    return absl::InvalidArgumentError(
        "--http_address: unix domain sockets are served on the gRPC port "
        "only (--address=unix:PATH); give HOST:PORT");
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), port) || *port < 0 ||
      *port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http_address must be HOST:PORT (e.g. 0.0.0.0:8000, [::]:8000), "
        "got \"",
        address, "\""));
  }
  *host = address.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  if (host->empty()) *host = "0.0.0.0";
  return absl::OkStatus();
}

constexpr size_t kJoinBelowBytes = 64 << 10;

// Writes the handler's response: status, headers, then its parts as they
// are (the JSON, then binary tensors), through a content provider that owns
// the response, and with it the admission ticket, until it was sent.
void Send(HttpResponse response, httplib::Response& res) {
  res.status = response.status;
  for (auto& [name, value] : response.headers) res.set_header(name, value);
  const size_t length = response.body_size();
  if (length < kJoinBelowBytes) {
    // Small: one buffer, one write after the headers (the copy costs less
    // than a system call per part).
    std::string body;
    body.reserve(length);
    for (const std::string& part : response.body) body += part;
    res.body = std::move(body);  // what set_content does, without a copy
    res.set_header("Content-Type", response.content_type);
    return;
  }
  auto owned = std::make_shared<HttpResponse>(std::move(response));
  res.set_content_provider(
      length, owned->content_type,
      [owned](size_t offset, size_t /*length*/, httplib::DataSink& sink) {
        // Everything from `offset` on, part by part.
        for (const std::string& part : owned->body) {
          if (offset >= part.size()) {
            offset -= part.size();
            continue;
          }
          if (!sink.write(part.data() + offset, part.size() - offset)) {
            return false;
          }
          offset = 0;
        }
        return true;
      });
}

}  // namespace

struct HttpServer::Impl {
  std::unique_ptr<httplib::Server> server;
  std::thread thread;
  std::once_flag stopped;

  void Stop() {
    std::call_once(stopped, [this] {
      if (server == nullptr) return;
      server->stop();  // closes the listener; workers finish their requests
      if (thread.joinable()) thread.join();
    });
  }
  ~Impl() { Stop(); }
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl, int port)
    : impl_(std::move(impl)), port_(port) {}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() { impl_->Stop(); }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const HttpServerOptions& options, const RestHandler* handler) {
  std::string host;
  int port = 0;
  if (absl::Status status = SplitAddress(options.address, &host, &port);
      !status.ok()) {
    return status;
  }
  const bool tls =
      !options.tls_cert_file.empty() || !options.tls_key_file.empty();
  if (tls && (options.tls_cert_file.empty() || options.tls_key_file.empty())) {
    return absl::InvalidArgumentError("HTTPS needs both tls_cert and tls_key");
  }
  if (!tls && !options.tls_client_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "tls_client_ca needs tls_cert and tls_key");
  }

  auto impl = std::make_unique<Impl>();
  if (tls) {
    auto server = std::make_unique<httplib::SSLServer>(
        options.tls_cert_file.c_str(), options.tls_key_file.c_str(),
        options.tls_client_ca_file.empty()
            ? nullptr
            : options.tls_client_ca_file.c_str());
    if (!server->is_valid()) {
      return absl::UnavailableError(absl::StrCat(
          "cannot serve HTTPS on \"", options.address,
          "\": unusable --tls_cert, --tls_key or --tls_client_ca"));
    }
    SSL_CTX_set_min_proto_version(server->ssl_context(), TLS1_2_VERSION);
    impl->server = std::move(server);
  } else {
    impl->server = std::make_unique<httplib::Server>();
  }

  httplib::Server& server = *impl->server;
  const int threads = std::max(1, options.threads);
  server.new_task_queue = [threads] {
    return new httplib::ThreadPool(static_cast<size_t>(threads));
  };
  server.set_keep_alive_max_count(size_t{1} << 30);
  server.set_keep_alive_timeout(std::max(1, options.keep_alive_ms / 1000));
  server.set_read_timeout(30);
  server.set_write_timeout(30);
  server.set_tcp_nodelay(true);
  // httplib's default also sets SO_REUSEPORT: a second server on a busy port
  // would start "successfully" and share it.  Fail instead (as gRPC does).
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server.set_payload_max_length(static_cast<size_t>(options.max_body_bytes));

  const auto serve = [handler](const httplib::Request& req,
                               httplib::Response& res, std::string body) {
    HttpRequest request;
    request.method = req.method == "HEAD" ? "GET" : req.method;
    request.path = req.path;  // percent-decoded by httplib
    request.authorization = req.get_header_value("Authorization");
    request.header_length =
        req.get_header_value("Inference-Header-Content-Length");
    request.body = std::move(body);
    HttpResponse response;
    handler->Handle(request, &response);
    Send(std::move(response), res);
  };
  // Before the body is read: compressed bodies are refused rather than
  // inflated (a small body could inflate past every limit).
  server.set_pre_routing_handler([serve](const httplib::Request& req,
                                         httplib::Response& res) {
    const std::string encoding =
        absl::AsciiStrToLower(req.get_header_value("Content-Encoding"));
    if (encoding.empty() || encoding == "identity") {
      // A body-less POST (no Content-Length, not chunked), as tritonclient
      // sends to unregister shared memory: httplib would answer 400 itself.
      if (req.method == "POST" && !req.has_header("Content-Length") &&
          !req.has_header("Transfer-Encoding")) {
        serve(req, res, std::string());
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    }
    res.status = 400;
    res.set_header("Connection", "close");  // the body stays unread
    res.set_content(ErrorJson(absl::StrCat("Content-Encoding \"", encoding,
                                           "\" is not supported: send the body "
                                           "uncompressed")),
                    "application/json");
    return httplib::Server::HandlerResponse::Handled;
  });
  // POST bodies are read here, as they come, whatever their Content-Type:
  // httplib's own reading would parse form-urlencoded bodies (curl's and
  // libcurl's default type) and cap them at 8 KiB.
  server.Post(".*", [serve](const httplib::Request& req, httplib::Response& res,
                            const httplib::ContentReader& reader) {
    std::string body;
    const bool read = req.is_multipart_form_data()
                          ? false
                          : reader([&body](const char* data, size_t size) {
                              body.append(data, size);
                              return true;
                            });
    if (!read) {
      // Over max_body_bytes httplib has set 413; otherwise the body did not
      // arrive whole.
      if (res.status == -1 || res.status == 200) {
        res.status = 400;
        res.set_header("Connection", "close");
        res.set_content(ErrorJson(req.is_multipart_form_data()
                                      ? "multipart bodies are not accepted"
                                      : "the request body did not arrive "
                                        "whole"),
                        "application/json");
      }
      return;
    }
    serve(req, res, std::move(body));
  });
  const auto handle = [serve](const httplib::Request& req,
                              httplib::Response& res) {
    serve(req, res, req.body);
  };
  for (const char* pattern : {".*"}) {
    server.Get(pattern, handle);
    server.Put(pattern, handle);
    server.Delete(pattern, handle);
    server.Patch(pattern, handle);
    server.Options(pattern, handle);
  }
  // Answers httplib gives itself (413 over max_body_bytes, 400 for a
  // malformed request) get the protocol's {"error": ...} body too.
  const httplib::Server::HandlerWithResponse on_error =
      [max = options.max_body_bytes](const httplib::Request&,
                                     httplib::Response& res) {
        if (!res.body.empty() || res.content_length_ > 0) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        const std::string message =
            res.status == 413 ? absl::StrCat(
                                    "the request body is larger than the "
                                    "server's limit (",
                                    max, " bytes)")
                              : absl::StrCat("HTTP status ", res.status);
        res.set_content(ErrorJson(message), "application/json");
        return httplib::Server::HandlerResponse::Handled;
      };
  server.set_error_handler(on_error);

  int bound = port;
  if (port == 0) {
    bound = server.bind_to_any_port(host);
  } else if (!server.bind_to_port(host, port)) {
    bound = -1;
  }
  if (bound <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve HTTP on \"", options.address,
                     "\" (address in use or invalid?)"));
  }
  httplib::Server* raw = impl->server.get();
  impl->thread = std::thread([raw] { raw->listen_after_bind(); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl), bound));
}

}  // namespace temb::rest
