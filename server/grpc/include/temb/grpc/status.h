// The one absl::Status -> grpc::Status conversion, shared by every frontend.
#ifndef TEMB_GRPC_STATUS_H_
#define TEMB_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace temb {

// absl and gRPC share the canonical code numbers, so the code is carried over
// unchanged, with the message.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace temb

#endif  // TEMB_GRPC_STATUS_H_
