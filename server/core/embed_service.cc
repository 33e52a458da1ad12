#include "temb/core/embed_service.h"

#include <new>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "temb/base/quoted.h"
#include "temb/base/status_macros.h"
#include "temb/core/timesteps.h"
#include "temb/kernels/registry.h"

namespace temb {
namespace {

// Fields a preset fixes; a request naming a preset may not set them.
absl::Status CheckNoConventionFields(const SpecRequest& request) {
  const std::pair<bool, const char*> fields[] = {
      {request.max_period.has_value(), "max_period"},
      {request.flip_sin_to_cos.has_value(), "flip_sin_to_cos"},
      {request.downscale_freq_shift.has_value(), "downscale_freq_shift"},
      {request.scale.has_value(), "scale"},
      {request.time_factor.has_value(), "time_factor"},
      {request.repeat_only.has_value(), "repeat_only"},
      {request.layout.has_value(), "layout"},
      {request.exponent_order.has_value(), "exponent_order"},
      {request.frequencies != nullptr, "frequencies"},
  };
  const char* field = nullptr;
  for (const auto& [set, name] : fields) {
    if (set && field == nullptr) field = name;
  }
  if (field == nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, " cannot be set together with preset \"", request.preset,
      "\": a preset fixes the convention (only dim where the preset allows "
      "it, precision, dtype and timestep_dtype may be set); omit the preset to "
      "give an "
      "explicit spec"));
}

absl::StatusOr<EmbeddingSpec> FromPreset(const SpecRequest& request,
                                         const PresetCatalog& presets) {
  const Preset* preset = request.preset_entry != nullptr
                             ? request.preset_entry
                             : presets.Find(request.preset);
  if (preset == nullptr) {
    std::vector<absl::string_view> names;
    for (const Preset& p : presets.presets()) names.push_back(p.name);
    return absl::NotFoundError(
        absl::StrCat("unknown preset ", Quoted(request.preset),
                     "; known presets: ", absl::StrJoin(names, ", ")));
  }
  RETURN_IF_ERROR(CheckNoConventionFields(request));
  EmbeddingSpec spec = preset->spec;
  if (request.dim) {
    if (!preset->dim_overridable && *request.dim != spec.dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "preset \"", preset->name, "\" has a fixed dim of ", spec.dim,
          ", got dim=", *request.dim, "; omit dim or use an explicit spec"));
    }
    spec.dim = *request.dim;
  } else if (spec.dim == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "preset \"", preset->name, "\" has no default dim: set dim"));
  }
  if (request.precision) spec.precision = *request.precision;
  if (request.dtype) spec.dtype = *request.dtype;
  if (request.timestep_dtype) spec.timestep_dtype = *request.timestep_dtype;
  return spec;
}

absl::StatusOr<EmbeddingSpec> FromExplicitFields(const SpecRequest& request) {
  std::vector<absl::string_view> missing;
  if (!request.dim) missing.push_back("dim");
  // repeat_only copies t into every column: no convention to choose.
  const bool repeat_only = request.repeat_only.value_or(false);
  if (!request.flip_sin_to_cos && !repeat_only) {
    missing.push_back("flip_sin_to_cos");
  }
  // A frequency table replaces the formula the shift belongs to.
  if (!request.downscale_freq_shift && !repeat_only &&
      request.frequencies == nullptr) {
    missing.push_back("downscale_freq_shift");
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "without a preset, dim, flip_sin_to_cos and downscale_freq_shift are "
        "required (missing: ",
        absl::StrJoin(missing, ", "),
        "). temb does not guess: diffusers' get_timestep_embedding defaults "
        "(flip_sin_to_cos=false, downscale_freq_shift=1) differ from LDM's "
        "(true, 0), which most models use. Set them, or use a preset such as "
        "\"ldm\", \"diffusers-default\" or a model name like \"sdxl\""));
  }
  EmbeddingSpec spec;
  spec.dim = *request.dim;
  spec.flip_sin_to_cos = request.flip_sin_to_cos.value_or(spec.flip_sin_to_cos);
  spec.downscale_freq_shift =
      request.downscale_freq_shift.value_or(spec.downscale_freq_shift);
  spec.max_period = request.max_period.value_or(spec.max_period);
  spec.scale = request.scale.value_or(spec.scale);
  spec.time_factor = request.time_factor.value_or(spec.time_factor);
  spec.repeat_only = request.repeat_only.value_or(spec.repeat_only);
  spec.layout = request.layout.value_or(spec.layout);
  spec.exponent_order = request.exponent_order.value_or(spec.exponent_order);
  spec.precision = request.precision.value_or(spec.precision);
  spec.dtype = request.dtype.value_or(spec.dtype);
  spec.timestep_dtype = request.timestep_dtype.value_or(spec.timestep_dtype);
  spec.frequencies = request.frequencies;
  return spec;
}

}  // namespace

absl::StatusOr<SpecRequest> PartSpecRequest(const SpecRequest& whole,
                                            absl::string_view name,
                                            const SpecRequest& part,
                                            const PresetCatalog& presets) {
  const bool own_convention =
      !part.preset.empty() || part.dim || part.max_period ||
      part.flip_sin_to_cos || part.downscale_freq_shift || part.scale ||
      part.time_factor || part.repeat_only || part.layout ||
      part.exponent_order || part.frequencies != nullptr;
  SpecRequest resolved = whole;
  if (own_convention) {
    resolved = part;
  } else if (!whole.preset.empty()) {
    const Preset* preset = whole.preset_entry != nullptr
                               ? whole.preset_entry
                               : presets.Find(whole.preset);
    if (preset == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("unknown preset ", Quoted(whole.preset)));
    }
    for (const PresetPart& preset_part : preset->parts) {
      if (preset_part.name != name) continue;
      // Only the per-request choices carry over to the part's preset.
      resolved = SpecRequest();
      resolved.preset = preset_part.preset;
      resolved.precision = whole.precision;
      resolved.dtype = whole.dtype;
      resolved.timestep_dtype = whole.timestep_dtype;
      break;
    }
  }
  if (part.precision) resolved.precision = part.precision;
  if (part.dtype) resolved.dtype = part.dtype;
  if (part.timestep_dtype) resolved.timestep_dtype = part.timestep_dtype;
  if (own_convention) {
    if (!resolved.precision) resolved.precision = whole.precision;
    if (!resolved.dtype) resolved.dtype = whole.dtype;
    if (!resolved.timestep_dtype)
      resolved.timestep_dtype = whole.timestep_dtype;
  }
  return resolved;
}

absl::StatusOr<EmbeddingSpec> ResolveSpec(const SpecRequest& request,
                                          const PresetCatalog& presets,
                                          const Limits& limits) {
  ASSIGN_OR_RETURN(EmbeddingSpec spec, request.preset.empty()
                                           ? FromExplicitFields(request)
                                           : FromPreset(request, presets));
  RETURN_IF_ERROR(ValidateSpec(spec, limits));
  return spec;
}

absl::StatusOr<BackendFailurePolicy> ParseBackendFailurePolicy(
    absl::string_view name) {
  if (name == "not_serving") return BackendFailurePolicy::kNotServing;
  if (name == "fallback_cpu") return BackendFailurePolicy::kFallbackCpu;
  return absl::InvalidArgumentError(absl::StrCat(
      "on_backend_failure must be not_serving or fallback_cpu, got \"", name,
      "\""));
}

EmbedService::EmbedService(std::unique_ptr<Backend> backend,
                           PresetCatalog presets, Options options)
    : backend_(std::move(backend)),
      presets_(std::move(presets)),
      options_(std::move(options)),
      active_(backend_.get()) {}

absl::StatusOr<Embedding> EmbedService::Embed(
    const SpecRequest& request, absl::Span<const float> timesteps,
    AdmissionTicket* ticket, OutputAllocator* allocator) const {
  ASSIGN_OR_RETURN(const EmbeddingSpec requested,
                   ResolveSpec(request, presets_, options_.limits));
  // What the backend computes: the same numbers, from the timesteps as a
  // fp16/bf16 pipeline's model sees them when timestep_dtype says so.
  EmbeddingSpec spec = requested;
  std::vector<float> pipeline_timesteps;
  if (spec.timestep_dtype != DType::kFloat32 &&
      static_cast<int64_t>(timesteps.size()) <= options_.limits.max_batch) {
    pipeline_timesteps.assign(timesteps.begin(), timesteps.end());
    RETURN_IF_ERROR(
        PipelineTimesteps(&spec, absl::MakeSpan(pipeline_timesteps)));
    timesteps = pipeline_timesteps;
  }
  RETURN_IF_ERROR(ValidateTimesteps(spec, timesteps, options_.limits));
  Embedding embedding;
  embedding.spec = requested;
  embedding.rows = static_cast<int64_t>(timesteps.size());
  embedding.size_bytes = OutputBytes(spec, embedding.rows);
  if (ticket != nullptr) RETURN_IF_ERROR(ticket->Reserve(embedding.size_bytes));
  const auto size = static_cast<size_t>(embedding.size_bytes);
  Backend* backend = active_.load();
  absl::Span<uint8_t> output;
  std::unique_ptr<HostBuffer> lent;
  // The limits make this rare, not impossible (a small container): a clear
  // RESOURCE_EXHAUSTED rather than an exception escaping into gRPC.
  try {
    if (allocator != nullptr) {
      lent = size > 0 ? backend->AllocateOutput(size) : nullptr;
      output = lent != nullptr ? lent->bytes() : allocator->Allocate(size);
    } else {
      embedding.data.resize(size);
      output = absl::MakeSpan(reinterpret_cast<uint8_t*>(embedding.data.data()),
                              size);
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", size,
                     " bytes for the output; retry later or with "
                     "a smaller batch"));
  }
  while (true) {
    const absl::Status status = backend->Compute(spec, timesteps, output);
    if (status.ok()) break;
    ASSIGN_OR_RETURN(backend, HandleBackendFailure(backend, status));
  }
  if (lent != nullptr) allocator->Adopt(std::move(lent));
  embedding.backend = backend->KindFor(embedding.size_bytes);
  return embedding;
}

namespace {

// A shape error of `part` with the field named where the part sits
// ("parts[2].timesteps_shape ..."): EmbeddingShape's messages start with
// the field it was given.  Built only on error, so that a valid request
// allocates no field names.
absl::Status ShapeError(const RequestPart& part, const absl::Status& status) {
  if (status.ok() || part.field.empty()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(part.field, ".", status.message()));
}

}  // namespace

absl::StatusOr<Response> EmbedService::Serve(
    const Request& request, AdmissionTicket* ticket,
    absl::Span<OutputAllocator* const> outputs) const {
  if (request.request_id.size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        request.request_id_field, " must be at most ", kMaxRequestIdBytes,
        " bytes, got ", request.request_id.size()));
  }
  const size_t count = request.parts.size();
  if (count > static_cast<size_t>(kMaxParts)) {
    return absl::InvalidArgumentError(absl::StrCat(request.parts_field,
                                                   " must hold at most ",
                                                   kMaxParts, ", got ", count));
  }
  if (!outputs.empty() && outputs.size() != count) {
    return absl::InternalError(absl::StrCat(
        "Serve: ", outputs.size(), " output allocators for ", count, " parts"));
  }
  // Part names are checked before any work: a part given twice (in any case:
  // KServe input names are matched case-insensitively) is a mistake, not two
  // answers.  At most kMaxParts: pairwise, without allocating.
  for (size_t i = 0; i < count; ++i) {
    const RequestPart& part = request.parts[i];
    if (part.name.size() > kMaxPartNameBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(part.field, ".name must be at most ", kMaxPartNameBytes,
                       " bytes, got ", part.name.size()));
    }
    if (part.name.empty()) continue;  // unnamed parts carry their own specs
    for (size_t earlier = 0; earlier < i; ++earlier) {
      if (absl::EqualsIgnoreCase(request.parts[earlier].name, part.name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            part.field, ".name: part ", Quoted(part.name), " given twice (as ",
            request.parts[earlier].field, ")"));
      }
    }
  }
  Response response;
  response.parts.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const RequestPart& part = request.parts[i];
    // A wrong shape must not cost a computation.
    RETURN_IF_ERROR(ShapeError(
        part, EmbeddingShape(part.timesteps_shape,
                             static_cast<int64_t>(part.timesteps.size()), 0,
                             request.shape_field)
                  .status()));
    absl::StatusOr<Embedding> embedding = [&]() -> absl::StatusOr<Embedding> {
      SpecRequest spec = request.spec;
      if (!part.field.empty()) {  // a part, not the request's own fields
        ASSIGN_OR_RETURN(spec, PartSpecRequest(request.spec, part.name,
                                               part.spec, presets_));
      }
      return Embed(spec, part.timesteps, ticket,
                   outputs.empty() ? nullptr : outputs[i]);
    }();
    if (!embedding.ok()) {
      if (!request.named_parts) return embedding.status();
      // Name the part, keep the code.
      return absl::Status(embedding.status().code(),
                          absl::StrCat(part.field, " (", Quoted(part.name),
                                       "): ", embedding.status().message()));
    }
    absl::StatusOr<std::vector<int64_t>> shape =
        EmbeddingShape(part.timesteps_shape, embedding->rows,
                       embedding->spec.dim, request.shape_field);
    RETURN_IF_ERROR(ShapeError(part, shape.status()));
    response.rows += embedding->rows;
    response.output_bytes += embedding->size_bytes;
    // Each part passed max_output_bytes; the answer as a whole must too.
    if (response.output_bytes > options_.limits.max_output_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the parts' outputs together must be <= ",
          options_.limits.max_output_bytes, " bytes (max_output_bytes), got ",
          response.output_bytes, " up to ", part.field));
    }
    response.parts.push_back(
        {part.name, *std::move(shape), *std::move(embedding)});
  }
  return response;
}

absl::StatusOr<Backend*> EmbedService::HandleBackendFailure(
    Backend* failed, const absl::Status& error) const {
  const std::string name(BackendKindName(failed->kind()));
  std::lock_guard<std::mutex> lock(fallback_mu_);
  if (options_.on_backend_failure == BackendFailurePolicy::kFallbackCpu) {
    // Another call may already have switched over.
    if (fallback_ != nullptr && failed != fallback_.get()) {
      return fallback_.get();
    }
    if (fallback_ == nullptr) {
      absl::StatusOr<std::unique_ptr<Backend>> cpu =
          CreateBackend(BackendChoice::kCpu, options_.fallback_options);
      if (cpu.ok()) {
        if (options_.observer != nullptr) {
          options_.observer->OnBackendFailure(name, error, "fallback_cpu");
        }
        fallback_ = std::move(*cpu);
        active_.store(fallback_.get());
        return fallback_.get();
      }
    }
  }
  if (options_.observer != nullptr) {
    options_.observer->OnBackendFailure(name, error, "not_serving");
  }
  const absl::Status cause(error.code(),
                           absl::StrCat(name, " backend: ", error.message()));
  if (options_.admission != nullptr)
    options_.admission->MarkBackendFailed(cause);
  return absl::UnavailableError(absl::StrCat(
      "the backend failed and the server stopped serving: ", cause.message()));
}

}  // namespace temb
