// HttpServer: the HTTP/1.1 listener in front of a RestHandler (cpp-httplib;
// docs/kserve.md has the measurements and why not civetweb).  Keep-alive
// connections, a pool of `threads` workers (an open connection holds one
// until it idles for keep_alive_ms), TCP_NODELAY, request bodies up to
// max_body_bytes (413 beyond), compressed bodies refused (400), TLS 1.2+ and
// mutual TLS from the same PEM files as the gRPC port.
#ifndef TEMB_REST_HTTP_SERVER_H_
#define TEMB_REST_HTTP_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
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
  // Connections served at once (each holds a worker while open).  More
  // wait for a free worker.
  int threads = 64;
  // Largest request body; larger ones get 413 unread.
  int64_t max_body_bytes = int64_t{64} << 20;
  // An idle keep-alive connection is closed after this long (whole
  // seconds; Stop() may wait this long for idle connections).
  int keep_alive_ms = 5000;
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

  // Closes the listener and waits for the requests being answered.
  // Idempotent.
  void Stop();

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl, int port);

  std::unique_ptr<Impl> impl_;
  int port_;
};

}  // namespace temb::rest

#endif  // TEMB_REST_HTTP_SERVER_H_
