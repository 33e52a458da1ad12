// HttpServer: the HTTP/1.1 listener in front of a RestHandler, on
// Boost.Beast and Asio (docs/kserve.md says why).  Connections are served
// asynchronously by a pool of `threads` threads, so a connection costs a
// buffer, never a thread, while its client is slow; requests on one
// connection (pipelined or not) are answered in order.  Every limit is
// enforced before anything beyond it is buffered: header bytes and fields,
// the body limit RestHandler::Accept gives for every framing
// (Content-Length, chunked), the time a client may take to send a header
// and a body, and the number of open connections.  TLS 1.2+ and mutual TLS
// from the same PEM files as the gRPC port.
#ifndef TEMB_REST_HTTP_SERVER_H_
#define TEMB_REST_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "temb/rest/rest_handler.h"

namespace temb::rest {

struct HttpServerOptions {
  // HOST:PORT ("0.0.0.0:8000", "127.0.0.1:0", "[::]:8000"); port 0 picks a
  // free port (HttpServer::port()).
  std::string address;
  // PEM files: cert_file and key_file together serve HTTPS; client_ca_file
  // additionally requires client certificates signed by it.  All empty:
  // plaintext.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  // Threads serving connections and running the handler; each handles
  // one request at a time.
  int threads = 64;
  // Connections open at once; more are closed as soon as they are accepted.
  int max_connections = 1024;
  // Bytes of a request's header (request line and fields) and its number
  // of fields: beyond either, 431 and the connection is closed.
  uint32_t max_header_bytes = 16 << 10;
  int max_header_fields = 100;
  // From a connection's start (its TLS handshake included) or the end of
  // its previous answer to a whole request header: an idle keep-alive
  // connection, or a client sending its header slowly, is closed then.
  absl::Duration header_timeout = absl::Seconds(10);
  // For a request's body to arrive once its header has, and for a response
  // to be taken by the client.
  absl::Duration body_timeout = absl::Seconds(30);
  // Told of an exception that escaped a connection's handling (the
  // connection is dropped, the thread goes on serving); may be empty.
  std::function<void(absl::string_view what)> on_error;
};

class HttpServer {
 public:
  // Starts serving `handler` (which must outlive the server).
  // INVALID_ARGUMENT for an address it cannot parse or an incomplete TLS
  // set; UNAVAILABLE when the address cannot be bound or the TLS files
  // cannot be used.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const HttpServerOptions& options, const RestHandler* handler);
  ~HttpServer();  // Stop()

  int port() const { return port_; }

  // Closes the listener and the idle connections, lets the requests being
  // answered finish (their responses are sent, then their connections
  // closed) and returns when every connection is gone.  Idempotent.
  void Stop();

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl, int port);

  std::unique_ptr<Impl> impl_;
  int port_;
};

}  // namespace temb::rest

#endif  // TEMB_REST_HTTP_SERVER_H_
