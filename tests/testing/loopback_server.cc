#include "temb/testing/loopback_server.h"

namespace temb::testing {

std::unique_ptr<grpc::Server> ServeOnLoopback(grpc::Service* service,
                                              int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           port);
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

}  // namespace temb::testing
