// EmbedService: the service core shared by every frontend (native temb.v1,
// KServe v2) and by the CLI's in-process mode.  It resolves presets, validates
// once, enforces limits and runs the backend.  No gRPC types here: frontends
// convert their messages to SpecRequest and back, and account metrics and
// request logs through RequestObserver (request_observer.h).
#ifndef TEMB_CORE_EMBED_SERVICE_H_
#define TEMB_CORE_EMBED_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "temb/core/admission.h"
#include "temb/core/presets.h"
#include "temb/core/request_observer.h"
#include "temb/kernels/backend.h"
#include "temb/kernels/embedding_spec.h"
#include "temb/kernels/registry.h"

namespace temb {

// Bounds on the text a response echoes, so that every answer the limits
// admit also fits the gRPC message limit (whose headroom over
// max_output_bytes is 64 KiB): a request id is echoed twice on a stream.
inline constexpr size_t kMaxRequestIdBytes = 1024;
inline constexpr int kMaxParts = 64;
inline constexpr size_t kMaxPartNameBytes = 256;

// What a caller asks for: a preset and/or explicit fields.  Unset fields take
// the preset's value; without a preset, dim, flip_sin_to_cos and
// downscale_freq_shift are required and the rest default as in EmbeddingSpec.
// With a preset only dim (where the preset allows it), precision, dtype and
// timestep_dtype may be set.  With repeat_only only dim is required.
struct SpecRequest {
  std::string preset;  // empty: explicit spec
  // The catalogue entry named `preset`, when the caller already looked it up
  // in the service's catalogue (KServe: the model); saves a second lookup.
  const Preset* preset_entry = nullptr;
  std::optional<int> dim;
  std::optional<double> max_period;
  std::optional<bool> flip_sin_to_cos;
  std::optional<double> downscale_freq_shift;
  std::optional<double> scale;
  std::optional<double> time_factor;
  std::optional<bool> repeat_only;
  std::optional<Layout> layout;
  std::optional<ExponentOrder> exponent_order;
  std::optional<Precision> precision;
  std::optional<DType> dtype;
  // fp32 | fp16 | bf16: see EmbeddingSpec::timestep_dtype.
  std::optional<DType> timestep_dtype;
  // A table instead of the frequency formula (EmbeddingSpec::frequencies).
  std::shared_ptr<const std::vector<double>> frequencies;
};

// The request one part of a multi-part call resolves with: `part` itself when
// it names a preset or sets a convention field (dim, max_period,
// flip_sin_to_cos, downscale_freq_shift, scale, time_factor, repeat_only,
// layout, exponent_order); else the part called `name` of `whole`'s preset
// (Preset::parts); else `whole`.  dtype, precision and timestep_dtype that the
// part leaves unset come from `whole`.  NOT_FOUND for an unknown preset of
// `whole`.
absl::StatusOr<SpecRequest> PartSpecRequest(const SpecRequest& whole,
                                            absl::string_view name,
                                            const SpecRequest& part,
                                            const PresetCatalog& presets);

// Turns a SpecRequest into a validated EmbeddingSpec.  NOT_FOUND for an
// unknown preset; INVALID_ARGUMENT naming the field otherwise;
// RESOURCE_EXHAUSTED for dim above limits.max_dim.
absl::StatusOr<EmbeddingSpec> ResolveSpec(const SpecRequest& request,
                                          const PresetCatalog& presets,
                                          const Limits& limits);

// A computed embedding: `rows` x spec.dim elements of spec.dtype, row-major,
// little-endian, in `data` (a std::string so that frontends can move it into a
// protobuf bytes field without copying).
// Where Embed() writes an embedding's bytes when the caller wants them
// somewhere other than Embedding::data (the frontends: in a gRPC slice they
// then send without copying it, or zero-filling it first).  When the backend
// lends faster memory, Embed() computes there and hands it over instead.
class OutputAllocator {
 public:
  virtual ~OutputAllocator() = default;
  // `bytes` bytes of writable memory that outlive the Embed() call.  They may
  // be uninitialised: the backend writes every byte.
  virtual absl::Span<uint8_t> Allocate(size_t bytes) = 0;
  // Instead of Allocate(): the output was computed into memory the backend
  // lent (Backend::AllocateOutput), which the allocator now owns and sends.
  virtual void Adopt(std::unique_ptr<HostBuffer> buffer) = 0;
};

struct Embedding {
  EmbeddingSpec spec;
  int64_t rows = 0;
  int64_t size_bytes = 0;  // of the output, wherever it was written
  std::string data;        // the output, unless Embed() had an OutputAllocator
  BackendKind backend = BackendKind::kCpu;
};

// A whole request as every frontend hands it to EmbedService::Serve: one
// embedding, or several named parts (Flux's timestep and guidance, SDXL's
// time ids), each with its own timesteps.  Frontends convert their messages
// to this (parsing numbers and shapes); the limits, the part rules and the
// errors that name fields are the core's.
struct RequestPart {
  // Picks the part of the request's preset (PartSpecRequest) and names the
  // answer's part.  Empty for a request that is one embedding.
  std::string name;
  // Where the part's fields sit in the caller's message, for errors:
  // "parts[2]", "inputs[0]"; empty when they are the request's own.
  std::string field;
  // The part's own convention and dtype fields (unset: the request's).
  SpecRequest spec;
  absl::Span<const float> timesteps;
  // The timesteps' shape (empty: [N]); the answer's is this shape + [dim].
  absl::Span<const int64_t> timesteps_shape;
};

struct Request {
  absl::string_view request_id;
  // The request's own fields, which parts inherit (PartSpecRequest).
  SpecRequest spec;
  std::vector<RequestPart> parts;
  // A part's errors are prefixed with its field and name
  // ("parts[1] ("guidance"): ...") unless the request is one embedding.
  bool named_parts = true;
  // How the caller's protocol spells its fields in messages.
  absl::string_view request_id_field = "request_id";
  absl::string_view parts_field = "parts";
  absl::string_view shape_field = "timesteps_shape";
};

struct ResponsePart {
  std::string name;
  std::vector<int64_t> shape;  // the timesteps' shape + [dim]
  Embedding embedding;
};

struct Response {
  std::vector<ResponsePart> parts;  // in the request's order
  int64_t rows = 0;                 // timesteps answered
  int64_t output_bytes = 0;         // of every part
};

// What the service does when its backend fails a computation (a device
// error: backends never fail valid requests on a healthy device).
enum class BackendFailurePolicy {
  // Stop serving for good: the failing call and every later one get
  // UNAVAILABLE (clients retry them on another replica), health turns
  // NOT_SERVING so that the orchestrator replaces the process.
  kNotServing,
  // Recompute the failing call, and every later one, on a CPU backend
  // created at that moment; only if that fails too, stop as kNotServing.
  kFallbackCpu,
};

// "not_serving" | "fallback_cpu"; INVALID_ARGUMENT otherwise.
absl::StatusOr<BackendFailurePolicy> ParseBackendFailurePolicy(
    absl::string_view name);

class EmbedService {
 public:
  struct Options {
    Limits limits;
    BackendFailurePolicy on_backend_failure = BackendFailurePolicy::kNotServing;
    // Told when the backend fails under kNotServing (may be null: the error
    // is then only returned).  Must outlive the service.
    AdmissionController* admission = nullptr;
    // Hears OnBackendFailure (may be null).  Must outlive the service.
    RequestObserver* observer = nullptr;
    // For the CPU backend of kFallbackCpu.
    BackendOptions fallback_options;
  };

  EmbedService(std::unique_ptr<Backend> backend, PresetCatalog presets,
               Options options);

  // Thread-safe.  Validates the whole request before any work.  With a
  // `ticket`, the response's bytes are reserved on it before the output is
  // allocated (RESOURCE_EXHAUSTED naming max_queued_bytes when they do not
  // fit).  A backend failure is handled as options.on_backend_failure says
  // and returns UNAVAILABLE when the call could not be answered.  With an
  // `allocator`, the output goes to the memory it gives and `data` stays
  // empty.
  absl::StatusOr<Embedding> Embed(const SpecRequest& request,
                                  absl::Span<const float> timesteps,
                                  AdmissionTicket* ticket = nullptr,
                                  OutputAllocator* allocator = nullptr) const;

  // A whole request, the one call of every frontend: checks the request id,
  // the number of parts, their names (case-insensitively distinct), their
  // timesteps' shapes and the answer's bytes as a whole (against
  // limits.max_output_bytes), then resolves and embeds each part in order.
  // `outputs` is empty or holds one allocator per part (null: the part's
  // bytes go to its Embedding::data), as Embed() takes it.
  absl::StatusOr<Response> Serve(
      const Request& request, AdmissionTicket* ticket = nullptr,
      absl::Span<OutputAllocator* const> outputs = {}) const;

  // The backend computing now: the configured one, or the CPU fallback once
  // it took over.
  const Backend& backend() const { return *active_.load(); }
  const PresetCatalog& presets() const { return presets_; }
  const Limits& limits() const { return options_.limits; }

 private:
  // Decides what a failure of `failed` means; returns the backend to retry
  // on, or the error to answer with.
  absl::StatusOr<Backend*> HandleBackendFailure(
      Backend* failed, const absl::Status& error) const;

  std::unique_ptr<Backend> backend_;
  PresetCatalog presets_;
  Options options_;
  mutable std::mutex fallback_mu_;
  mutable std::unique_ptr<Backend> fallback_;  // guarded by fallback_mu_
  mutable std::atomic<Backend*> active_;
};

}  // namespace temb

#endif  // TEMB_CORE_EMBED_SERVICE_H_
