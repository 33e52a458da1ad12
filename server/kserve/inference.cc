#include "temb/kserve/inference.h"

#include <algorithm>
#include <vector>

#include "temb/kserve/kserve_convert.h"

namespace temb::kserve {

absl::Status RunInference(const EmbedService& core,
                          const SharedMemoryRegistry* shared_memory,
                          const inference::ModelInferRequest& request,
                          inference::ModelInferResponse* response,
                          AdmissionTicket* ticket, OutputAllocator* output) {
  if (!UsesSharedMemory(request)) {
    return Infer(core, request, response, ticket, output);
  }
  if (shared_memory == nullptr) {
    return absl::InvalidArgumentError("shared memory is not enabled");
  }
  // The inputs' bytes are copied in, the outputs written out, around the
  // same Infer.
  inference::ModelInferRequest resolved = request;
  std::vector<SharedMemoryOutput> targets;
  // No valid input is wider than max_batch 8-byte timesteps.
  const uint64_t max_input_bytes =
      static_cast<uint64_t>(std::max<int64_t>(core.limits().max_batch, 0)) * 8;
  absl::Status status = PrepareSharedMemory(*shared_memory, max_input_bytes,
                                            ticket, &resolved, &targets);
  if (status.ok()) status = Infer(core, resolved, response, ticket);
  if (status.ok()) status = FinishSharedMemory(targets, response);
  return status;
}

int64_t TimestepsAnswered(const inference::ModelInferResponse& response) {
  int64_t batch = 0;
  for (const auto& output : response.outputs()) {
    int64_t rows = 1;
    for (int d = 0; d + 1 < output.shape_size(); ++d) rows *= output.shape(d);
    batch += rows;
  }
  return batch;
}

}  // namespace temb::kserve
