// A Backend that sends each request to one of two backends by the size of
// its output: small requests to one (the CPU: it answers a 1x320 request in
// well under a microsecond), large ones to the other (the GPU: its fixed cost
// per call, the transfers, the launch and the synchronisation, is about
// 20 us, but it keeps the CPU free for the server under load).
// docs/benchmarks-gpu.md has the measurements behind the default threshold.
#ifndef TEMB_KERNELS_SIZE_ROUTER_H_
#define TEMB_KERNELS_SIZE_ROUTER_H_

#include <cstdint>
#include <memory>

#include "temb/kernels/backend.h"

namespace temb {

// Outputs of at least `large_min_bytes` go to `large`, the others to
// `small`.  kind() is the large backend's (the device the process serves
// with); KindFor() says which one a given request runs on.  In a process
// forked from the one that made the router, every request goes to `small`
// (CUDA does not survive fork()).
std::unique_ptr<Backend> RouteBySize(std::unique_ptr<Backend> small,
                                     std::unique_ptr<Backend> large,
                                     int64_t large_min_bytes);

}  // namespace temb

#endif  // TEMB_KERNELS_SIZE_ROUTER_H_
