// A gRPC server for one test service, on a port of 127.0.0.1 the system
// picks.
#ifndef TEMB_TESTING_LOOPBACK_SERVER_H_
#define TEMB_TESTING_LOOPBACK_SERVER_H_

#include <memory>

#include "grpcpp/grpcpp.h"

namespace temb::testing {

// Serves `service` (not owned; it must outlive the server) on
// 127.0.0.1:0 without TLS and sets `*port` to the bound port.  Null when
// the server does not start.
std::unique_ptr<grpc::Server> ServeOnLoopback(grpc::Service* service,
                                              int* port);

}  // namespace temb::testing

#endif  // TEMB_TESTING_LOOPBACK_SERVER_H_
