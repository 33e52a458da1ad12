// HttpServer on Boost.Beast and Asio (Debian's libboost-dev, header-only;
// TLS through the system OpenSSL 3 like the gRPC port).  Beast is a parser
// and stream toolkit rather than a server, which is what lets every limit
// apply before anything beyond it is read: the request line and fields go
// through RequestParser, which keeps only what RestHandler reads; the
// handler's Accept decides on the header alone whether the body may be
// read and how much of it; and each read runs under a deadline.  Requests
// are answered on the thread that read them, one at a time per connection,
// and a response is written straight from the handler's parts.
#include "temb/rest/http_server.h"

#include <openssl/ssl.h>

#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/stream_traits.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <chrono>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "temb/rest/rest_json.h"

namespace temb::rest {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

// HOST:PORT -> (host, port); brackets dropped from IPv6.
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

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = absl::ascii_tolower(c);
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The percent-decoded path of an origin-form request target (the query is
// dropped); nullopt when it is not one.
std::optional<std::string> DecodePath(absl::string_view target) {
  target = target.substr(0, target.find('?'));
  if (target.empty() || target.front() != '/') return std::nullopt;
  std::string path;
  path.reserve(target.size());
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] != '%') {
      path += target[i];
      continue;
    }
    if (i + 2 >= target.size()) return std::nullopt;
    const int high = HexDigit(target[i + 1]);
    const int low = HexDigit(target[i + 2]);
    if (high < 0 || low < 0) return std::nullopt;
    path += static_cast<char>(high * 16 + low);
    i += 2;
  }
  return path;
}

// Reads one request: the request line, the few fields RestHandler reads
// (the others are only counted, so a header costs its bytes in the read
// buffer and nothing more), and the body, which Beast has already bounded
// by body_limit for every framing.
class RequestParser final : public http::basic_parser<true> {
 public:
  RequestParser(uint32_t max_header_bytes, int max_header_fields)
      : max_header_fields_(max_header_fields) {
    header_limit(max_header_bytes);
    // Until Accept has given its limit (set before the body is read): a
    // Content-Length is checked by Accept, so Beast must not refuse it
    // while reading the header.  (Not boost::none: Beast 1.74 compares the
    // length with the optional, and every length is greater than none.)
    body_limit(std::numeric_limits<uint64_t>::max());
  }

  HttpRequest& request() { return request_; }
  const std::string& target() const { return target_; }
  int version() const { return version_; }
  bool expects_continue() const { return expects_continue_; }
  bool too_many_fields() const { return fields_ > max_header_fields_; }
  // The Transfer-Encoding refused (anything but "chunked"); empty if none.
  const std::string& unsupported_encoding() const {
    return unsupported_encoding_;
  }

 private:
  void on_request_impl(http::verb, beast::string_view method,
                       beast::string_view target, int version,
                       error_code&) override {
    request_.method = std::string(method);
    target_ = std::string(target);
    version_ = version;
  }
  void on_response_impl(int, beast::string_view, int, error_code&) override {}

  void on_field_impl(http::field name, beast::string_view name_string,
                     beast::string_view value, error_code& ec) override {
    if (++fields_ > max_header_fields_) {
      ec = http::error::header_limit;
      return;
    }
    const absl::string_view text(value.data(), value.size());
    switch (name) {
      case http::field::authorization:
        request_.authorization = std::string(text);
        break;
      case http::field::content_encoding:
        request_.content_encoding =
            absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
        break;
      case http::field::transfer_encoding:
        // Only chunked: any other coding would have to be undone before
        // the body's size is known (RFC 9112 answers 501).
        if (!absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(text),
                                    "chunked")) {
          unsupported_encoding_ = std::string(text);
          ec = http::error::bad_transfer_encoding;
        }
        break;
      case http::field::expect:
        expects_continue_ = absl::EqualsIgnoreCase(
            absl::StripAsciiWhitespace(text), "100-continue");
        break;
      default:
        if (absl::EqualsIgnoreCase(
                absl::string_view(name_string.data(), name_string.size()),
                "Inference-Header-Content-Length")) {
          request_.header_length = std::string(text);
        }
        break;
    }
  }
  void on_header_impl(error_code&) override {}
  void on_body_init_impl(const boost::optional<uint64_t>& length,
                         error_code&) override {
    // Accept has checked a declared length against its limit.
    if (length.has_value()) request_.body.reserve(*length);
  }
  size_t on_body_impl(beast::string_view body, error_code&) override {
    request_.body.append(body.data(), body.size());
    return body.size();
  }
  void on_chunk_header_impl(uint64_t, beast::string_view,
                            error_code&) override {}
  size_t on_chunk_body_impl(uint64_t, beast::string_view body,
                            error_code&) override {
    request_.body.append(body.data(), body.size());
    return body.size();
  }
  void on_finish_impl(error_code&) override {}

  const int max_header_fields_;
  int fields_ = 0;
  HttpRequest request_;
  std::string target_;
  int version_ = 11;
  bool expects_continue_ = false;
  std::string unsupported_encoding_;
};

// Status line and header fields of `response`, whose body has `length`
// bytes.
std::string ResponseHead(const HttpResponse& response, uint64_t length,
                         bool keep_alive, int version) {
  const beast::string_view reason =
      http::obsolete_reason(http::int_to_status(response.status));
  std::string head =
      absl::StrCat("HTTP/1.1 ", response.status, " ",
                   absl::string_view(reason.data(), reason.size()),
                   "\r\nContent-Length: ", length, "\r\n");
  if (length > 0 || !response.body.empty()) {
    absl::StrAppend(&head, "Content-Type: ", response.content_type, "\r\n");
  }
  for (const auto& [name, value] : response.headers) {
    absl::StrAppend(&head, name, ": ", value, "\r\n");
  }
  if (!keep_alive) {
    head += "Connection: close\r\n";
  } else if (version < 11) {
    head += "Connection: keep-alive\r\n";
  }
  head += "\r\n";
  return head;
}

HttpResponse ErrorResponse(int status, absl::string_view message) {
  HttpResponse response;
  response.status = status;
  response.body.push_back(ErrorJson(message));
  return response;
}

// What a connection does when the server stops.
class Stoppable {
 public:
  virtual ~Stoppable() = default;
  // Closes the connection at once if it waits for a request; otherwise it
  // closes after the answer it is working on.  Any thread.
  virtual void RequestStop() = 0;
};

}  // namespace

struct HttpServer::Impl {
  Impl(const HttpServerOptions& options, const RestHandler* handler)
      : options(options), handler(handler) {
    for (int i = 0; i < std::max(1, options.threads); ++i) {
      // Concurrency hint 1: each context is run by one thread.
      contexts.push_back(std::make_unique<asio::io_context>(1));
      keep_running.emplace_back(contexts.back()->get_executor());
    }
    acceptor.emplace(*contexts.front());
    retry_accept.emplace(*contexts.front());
  }

  void Accept();
  void OnAccepted(tcp::socket socket);
  void Track(const std::shared_ptr<Stoppable>& connection);
  void Untrack(Stoppable* connection);
  void Stop();

  const HttpServerOptions options;
  const RestHandler* const handler;
  // Declared before the io context: a connection still owned by a pending
  // handler when it is destroyed untracks itself and uses the TLS context.
  std::atomic<bool> stopping{false};
  std::atomic<int> open_connections{0};
  std::once_flag stopped;
  std::mutex mu;
  std::unordered_map<Stoppable*, std::weak_ptr<Stoppable>> connections;
  std::optional<asio::ssl::context> tls;
  // One io context per thread, connections dealt out in turn: all of a
  // connection's steps run on its context's one thread, with no handoff
  // between threads (one context shared by every thread measured up to 2x
  // slower per request), and a handler computing blocks only the
  // connections of its own thread.
  std::vector<std::unique_ptr<asio::io_context>> contexts;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>>
      keep_running;         // a context without connections waits for one
  size_t next_context = 0;  // the acceptor's thread only
  std::optional<tcp::acceptor> acceptor;
  std::optional<asio::steady_timer> retry_accept;
  std::vector<std::thread> threads;
};

namespace {

// One client connection, plaintext (beast::tcp_stream) or TLS
// (beast::ssl_stream over it).  Every step runs on the one thread of the
// connection's io context; a step that waits on the client runs under the
// stream's deadline, whose expiry closes the socket.
template <typename Stream>
class Connection final
    : public Stoppable,
      public std::enable_shared_from_this<Connection<Stream>> {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

  Connection(Stream stream, HttpServer::Impl* server)
      : stream_(std::move(stream)),
        server_(server),
        // The header must fit (Beast parses it from one flat buffer);
        // body bytes pass through in pieces of up to 16 KiB.
        buffer_(server->options.max_header_bytes + (16 << 10)) {}

  ~Connection() override {
    server_->Untrack(this);
    --server_->open_connections;
  }

  void Start() {
    asio::dispatch(stream_.get_executor(),
                   [self = this->shared_from_this()] { self->Begin(); });
  }

  void RequestStop() override {
    asio::post(stream_.get_executor(), [self = this->shared_from_this()] {
      if (self->waiting_) self->Lowest().cancel();
    });
  }

 private:
  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }
  auto Self() { return this->shared_from_this(); }
  std::chrono::nanoseconds Timeout(absl::Duration d) const {
    return absl::ToChronoNanoseconds(d);
  }

  void Begin() {
    if constexpr (kTls) {
      waiting_ = true;
      Lowest().expires_after(Timeout(server_->options.header_timeout));
      stream_.async_handshake(asio::ssl::stream_base::server,
                              [self = Self()](error_code ec) {
                                self->waiting_ = false;
                                if (ec) return self->Close();
                                self->ReadHeader();
                              });
    } else {
      ReadHeader();
    }
  }

  void ReadHeader() {
    if (server_->stopping) return Close();
    parser_.emplace(server_->options.max_header_bytes,
                    server_->options.max_header_fields);
    waiting_ = true;
    Lowest().expires_after(Timeout(server_->options.header_timeout));
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = Self()](error_code ec, size_t) {
                              self->waiting_ = false;
                              self->OnHeader(ec);
                            });
  }

  void OnHeader(error_code ec) {
    if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
      return Refuse(
          431, parser_->too_many_fields()
                   ? absl::StrCat("the request has more than ",
                                  server_->options.max_header_fields,
                                  " header fields")
                   : absl::StrCat("the request header is larger "
                                  "than ",
                                  server_->options.max_header_bytes, " bytes"));
    }
    if (ec == http::error::bad_transfer_encoding &&
        !parser_->unsupported_encoding().empty()) {
      return Refuse(501, absl::StrCat("Transfer-Encoding \"",
                                      parser_->unsupported_encoding(),
                                      "\" is not supported: send "
                                      "Content-Length or chunked"));
    }
    if (ec && IsParseError(ec)) {
      return Refuse(400,
                    absl::StrCat("malformed HTTP request: ", ec.message()));
    }
    // Closed, timed out, stopped: nothing to answer.
    if (ec) return Close();

    HttpRequest& request = parser_->request();
    std::optional<std::string> path = DecodePath(parser_->target());
    if (!path.has_value()) {
      return Refuse(400,
                    "malformed request target: give an absolute path, "
                    "with valid %-escapes");
    }
    request.path = *std::move(path);
    head_only_ = request.method == "HEAD";
    if (head_only_) request.method = "GET";
    keep_alive_ = parser_->keep_alive();
    const std::optional<uint64_t> length =
        parser_->chunked()
            ? std::nullopt
            : std::optional<uint64_t>(parser_->content_length().value_or(0));

    HttpResponse refusal;
    permit_ = server_->handler->Accept(request, length, &refusal);
    if (!permit_.has_value()) {
      // Answered with the body unread: the connection cannot be reused.
      if (!parser_->is_done()) keep_alive_ = false;
      response_ = std::move(refusal);
      return Write();
    }
    if (parser_->is_done()) return Answer();
    parser_->body_limit(permit_->max_body_bytes());
    if (parser_->expects_continue()) {
      static constexpr absl::string_view kContinue =
          "HTTP/1.1 100 Continue\r\n\r\n";
      Lowest().expires_after(Timeout(server_->options.body_timeout));
      return asio::async_write(stream_,
                               asio::buffer(kContinue.data(), kContinue.size()),
                               [self = Self()](error_code written, size_t) {
                                 if (written) return self->Close();
                                 self->ReadBody();
                               });
    }
    ReadBody();
  }

  void ReadBody() {
    Lowest().expires_after(Timeout(server_->options.body_timeout));
    http::async_read(
        stream_, buffer_, *parser_,
        [self = Self()](error_code ec, size_t) { self->OnBody(ec); });
  }

  void OnBody(error_code ec) {
    if (ec == http::error::body_limit) {
      return Refuse(413, absl::StrCat("the request body is larger than this "
                                      "endpoint's limit (",
                                      permit_->max_body_bytes(), " bytes)"));
    }
    if (ec && IsParseError(ec)) {
      return Refuse(
          400, absl::StrCat("malformed HTTP request body: ", ec.message()));
    }
    if (ec) return Close();
    Answer();
  }

  void Answer() {
    server_->handler->Handle(parser_->request(), *std::move(permit_),
                             &response_);
    permit_.reset();
    Write();
  }

  // Answers `status` and closes: what was not read of the request stays
  // unread.
  void Refuse(int status, absl::string_view message) {
    permit_.reset();
    response_ = ErrorResponse(status, message);
    keep_alive_ = false;
    Write();
  }

  void Write() {
    // The request, and its body, are no longer needed.
    const int version = parser_.has_value() ? parser_->version() : 11;
    parser_.reset();
    if (server_->stopping) keep_alive_ = false;
    head_ =
        ResponseHead(response_, response_.body_size(), keep_alive_, version);
    out_.clear();
    out_.push_back(asio::buffer(head_));
    if (!head_only_) {
      for (const std::string& part : response_.body) {
        if (!part.empty()) out_.push_back(asio::buffer(part));
      }
    }
    Lowest().expires_after(Timeout(server_->options.body_timeout));
    asio::async_write(stream_, out_, [self = Self()](error_code ec, size_t) {
      self->OnWritten(ec);
    });
  }

  void OnWritten(error_code ec) {
    // Frees the response, and with it the admission it held.
    response_ = HttpResponse();
    head_only_ = false;
    if (ec || !keep_alive_) return Close();
    ReadHeader();
  }

  // Parse errors are the client's (answered 400); the others are the
  // stream's (closed, timed out, cancelled).
  static bool IsParseError(error_code ec) {
    return ec.category() ==
               http::make_error_code(http::error::bad_method).category() &&
           ec != http::error::end_of_stream &&
           ec != http::error::partial_message;
  }

  void Close() {
    if (closing_) return;
    closing_ = true;
    // What the request held (its admission above all) goes now, not when
    // the lingering close ends.
    permit_.reset();
    response_ = HttpResponse();
    parser_.reset();
    Lowest().expires_after(std::chrono::seconds(2));
    if constexpr (kTls) {
      stream_.async_shutdown(
          [self = Self()](error_code) { self->Lowest().close(); });
    } else {
      // Half-close, then drain what the client still sends for a moment:
      // closing with unread bytes would reset the connection, and the
      // client could lose the answer (a 413 for a body it is sending).
      error_code ignored;
      Lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
      Linger();
    }
  }

  void Linger() {
    Lowest().async_read_some(asio::buffer(linger_),
                             [self = Self()](error_code ec, size_t) {
                               self->lingered_ += sizeof(self->linger_);
                               if (ec || self->lingered_ > (1 << 20)) {
                                 self->Lowest().close();
                                 return;
                               }
                               self->Linger();
                             });
  }

  Stream stream_;
  HttpServer::Impl* const server_;
  beast::flat_buffer buffer_;
  std::optional<RequestParser> parser_;
  std::optional<BodyPermit> permit_;
  HttpResponse response_;
  std::string head_;
  std::vector<asio::const_buffer> out_;
  bool waiting_ = false;  // for a request (or a TLS handshake): stoppable
  bool keep_alive_ = true;
  bool head_only_ = false;
  bool closing_ = false;
  char linger_[4096];
  size_t lingered_ = 0;
};

}  // namespace

void HttpServer::Impl::Accept() {
  asio::io_context& context = *contexts[next_context];
  next_context = (next_context + 1) % contexts.size();
  acceptor->async_accept(context, [this](error_code ec, tcp::socket socket) {
    if (stopping || ec == asio::error::operation_aborted) return;
    if (ec) {
      // Out of descriptors, say: try again shortly rather than spin.
      retry_accept->expires_after(std::chrono::milliseconds(50));
      retry_accept->async_wait([this](error_code wait) {
        if (!wait && !stopping) Accept();
      });
      return;
    }
    OnAccepted(std::move(socket));
    Accept();
  });
}

void HttpServer::Impl::OnAccepted(tcp::socket socket) {
  if (open_connections.fetch_add(1) >= options.max_connections) {
    // Over the limit: closed at once, before anything is read.
    --open_connections;
    error_code ignored;
    socket.close(ignored);
    return;
  }
  error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
  beast::tcp_stream stream(std::move(socket));
  std::shared_ptr<Stoppable> connection;
  if (tls.has_value()) {
    auto tls_connection =
        std::make_shared<Connection<beast::ssl_stream<beast::tcp_stream>>>(
            beast::ssl_stream<beast::tcp_stream>(std::move(stream), *tls),
            this);
    Track(tls_connection);
    tls_connection->Start();
  } else {
    auto plain_connection = std::make_shared<Connection<beast::tcp_stream>>(
        std::move(stream), this);
    Track(plain_connection);
    plain_connection->Start();
  }
}

void HttpServer::Impl::Track(const std::shared_ptr<Stoppable>& connection) {
  std::lock_guard<std::mutex> lock(mu);
  connections.emplace(connection.get(), connection);
}

void HttpServer::Impl::Untrack(Stoppable* connection) {
  std::lock_guard<std::mutex> lock(mu);
  connections.erase(connection);
}

void HttpServer::Impl::Stop() {
  std::call_once(stopped, [this] {
    stopping = true;
    asio::post(acceptor->get_executor(), [this] {
      error_code ignored;
      acceptor->close(ignored);
      retry_accept->cancel();
    });
    std::vector<std::shared_ptr<Stoppable>> open;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& [raw, weak] : connections) {
        if (auto connection = weak.lock()) open.push_back(connection);
      }
    }
    for (const auto& connection : open) connection->RequestStop();
    open.clear();
    // The threads return once every connection is gone.
    for (auto& guard : keep_running) guard.reset();
    for (std::thread& thread : threads) thread.join();
  });
}

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

  auto impl = std::make_unique<Impl>(options, handler);
  if (tls) {
    impl->tls.emplace(asio::ssl::context::tls_server);
    asio::ssl::context& context = *impl->tls;
    error_code ec;
    context.set_options(asio::ssl::context::default_workarounds |
                            asio::ssl::context::single_dh_use,
                        ec);
    if (!ec) context.use_certificate_chain_file(options.tls_cert_file, ec);
    if (!ec) {
      context.use_private_key_file(options.tls_key_file,
                                   asio::ssl::context::pem, ec);
    }
    if (!ec && !options.tls_client_ca_file.empty()) {
      context.load_verify_file(options.tls_client_ca_file, ec);
      if (!ec) {
        context.set_verify_mode(
            asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert,
            ec);
      }
    }
    if (ec || SSL_CTX_set_min_proto_version(context.native_handle(),
                                            TLS1_2_VERSION) != 1) {
      return absl::UnavailableError(absl::StrCat(
          "cannot serve HTTPS on \"", options.address,
          "\": unusable --tls_cert, --tls_key or --tls_client_ca (",
          ec.message(), ")"));
    }
  }

  error_code ec;
  const asio::ip::address ip = asio::ip::make_address(
      host == "localhost" ? std::string("127.0.0.1") : host, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http_address: \"", host,
                     "\" is not an IP address (give one, e.g. 0.0.0.0)"));
  }
  const tcp::endpoint endpoint(ip, static_cast<unsigned short>(port));
  tcp::acceptor& acceptor = *impl->acceptor;
  // SO_REUSEADDR (restarts reuse a port in TIME_WAIT), but not
  // SO_REUSEPORT: a second server on a busy port must fail, as gRPC does.
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve HTTP on \"", options.address, "\" (", ec.message(), ")"));
  }
  const int bound = acceptor.local_endpoint().port();
  impl->Accept();
  for (int i = 0; i < std::max(1, options.threads); ++i) {
    impl->threads.emplace_back(
        [raw = impl.get(), context = impl->contexts[i].get()] {
          // An exception out of a handler (bad_alloc, say) unwinds through
          // run(): the connection it came from is dropped with the handler
          // that owned it, and the thread goes back to serving the others.
          for (;;) {
            try {
              context->run();
              return;
            } catch (const std::exception& e) {
              if (raw->options.on_error) raw->options.on_error(e.what());
            }
          }
        });
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl), bound));
}

}  // namespace temb::rest
