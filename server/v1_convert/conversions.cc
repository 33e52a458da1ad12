#include "temb/v1_convert/conversions.h"

#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "temb/base/status_macros.h"
#include "temb/core/timesteps.h"
#include "temb/core/version.h"
#include "temb/kernels/frequencies.h"

namespace temb {
namespace {

// A generated table's width bound: far above any model's, and it keeps a
// request from asking for a huge table before the limits are known.
constexpr int kMaxTableDim = 1 << 16;

absl::Status BadEnum(absl::string_view field, int value) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, " has an unknown enum value ", value));
}

}  // namespace

absl::StatusOr<std::optional<DType>> DTypeFromProto(int value,
                                                    absl::string_view field) {
  switch (value) {
    case v1::DTYPE_UNSPECIFIED:
      return std::optional<DType>();
    case v1::DTYPE_FP32:
      return std::optional<DType>(DType::kFloat32);
    case v1::DTYPE_FP16:
      return std::optional<DType>(DType::kFloat16);
    case v1::DTYPE_BF16:
      return std::optional<DType>(DType::kBFloat16);
    case v1::DTYPE_FP64:
      return std::optional<DType>(DType::kFloat64);
  }
  return BadEnum(field, value);
}

absl::StatusOr<std::optional<Layout>> LayoutFromProto(int value,
                                                      absl::string_view field) {
  switch (value) {
    case v1::LAYOUT_UNSPECIFIED:
      return std::optional<Layout>();
    case v1::LAYOUT_HALVES:
      return std::optional<Layout>(Layout::kHalves);
    case v1::LAYOUT_INTERLEAVED:
      return std::optional<Layout>(Layout::kInterleaved);
  }
  return BadEnum(field, value);
}

absl::StatusOr<std::optional<Precision>> PrecisionFromProto(
    int value, absl::string_view field) {
  switch (value) {
    case v1::PRECISION_UNSPECIFIED:
      return std::optional<Precision>();
    case v1::PRECISION_FP32:
      return std::optional<Precision>(Precision::kFloat32);
    case v1::PRECISION_FP64:
      return std::optional<Precision>(Precision::kFloat64);
  }
  return BadEnum(field, value);
}

absl::StatusOr<std::optional<ExponentOrder>> ExponentOrderFromProto(
    int value, absl::string_view field) {
  switch (value) {
    case v1::EXPONENT_ORDER_UNSPECIFIED:
      return std::optional<ExponentOrder>();
    case v1::EXPONENT_ORDER_DIVIDE_LAST:
      return std::optional<ExponentOrder>(ExponentOrder::kDivideLast);
    case v1::EXPONENT_ORDER_SLOPE_FIRST:
      return std::optional<ExponentOrder>(ExponentOrder::kSlopeFirst);
  }
  return BadEnum(field, value);
}

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return v1::DTYPE_FP32;
    case DType::kFloat16:
      return v1::DTYPE_FP16;
    case DType::kBFloat16:
      return v1::DTYPE_BF16;
    case DType::kFloat64:
      return v1::DTYPE_FP64;
  }
  return v1::DTYPE_UNSPECIFIED;
}

v1::Layout LayoutToProto(Layout layout) {
  return layout == Layout::kInterleaved ? v1::LAYOUT_INTERLEAVED
                                        : v1::LAYOUT_HALVES;
}

v1::ExponentOrder ExponentOrderToProto(ExponentOrder order) {
  return order == ExponentOrder::kSlopeFirst ? v1::EXPONENT_ORDER_SLOPE_FIRST
                                             : v1::EXPONENT_ORDER_DIVIDE_LAST;
}

v1::Precision PrecisionToProto(Precision precision) {
  return precision == Precision::kFloat64 ? v1::PRECISION_FP64
                                          : v1::PRECISION_FP32;
}

absl::StatusOr<SpecRequest> SpecRequestFromProto(absl::string_view preset,
                                                 const v1::EmbeddingSpec& spec,
                                                 int dtype) {
  SpecRequest request;
  request.preset = std::string(preset);
  if (spec.has_dim()) request.dim = spec.dim();
  if (spec.has_max_period()) request.max_period = spec.max_period();
  if (spec.has_flip_sin_to_cos())
    request.flip_sin_to_cos = spec.flip_sin_to_cos();
  if (spec.has_downscale_freq_shift()) {
    request.downscale_freq_shift = spec.downscale_freq_shift();
  }
  if (spec.has_scale()) request.scale = spec.scale();
  if (spec.has_time_factor()) request.time_factor = spec.time_factor();
  if (spec.has_repeat_only()) request.repeat_only = spec.repeat_only();
  auto layout = LayoutFromProto(spec.layout(), "spec.layout");
  if (!layout.ok()) return layout.status();
  request.layout = *layout;
  auto exponent_order =
      ExponentOrderFromProto(spec.exponent_order(), "spec.exponent_order");
  if (!exponent_order.ok()) return exponent_order.status();
  request.exponent_order = *exponent_order;
  auto precision = PrecisionFromProto(spec.precision(), "spec.precision");
  if (!precision.ok()) return precision.status();
  request.precision = *precision;
  auto timestep_dtype =
      DTypeFromProto(spec.timestep_dtype(), "spec.timestep_dtype");
  if (!timestep_dtype.ok()) return timestep_dtype.status();
  request.timestep_dtype = *timestep_dtype;
  if (spec.frequencies_size() > 0 && spec.has_log_spaced_frequencies()) {
    return absl::InvalidArgumentError(
        "set at most one of spec.frequencies and spec.log_spaced_frequencies");
  }
  if (spec.frequencies_size() > 0) {
    request.frequencies = std::make_shared<const std::vector<double>>(
        spec.frequencies().begin(), spec.frequencies().end());
  }
  if (spec.has_log_spaced_frequencies()) {
    const v1::LogSpacedFrequencies& law = spec.log_spaced_frequencies();
    if (!spec.has_dim() || spec.dim() < 2 || spec.dim() > kMaxTableDim) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.log_spaced_frequencies needs spec.dim in [2, ",
                       kMaxTableDim, "]"));
    }
    if (!(law.min_frequency() > 0) || !(law.max_frequency() > 0) ||
        !std::isfinite(law.min_frequency()) ||
        !std::isfinite(law.max_frequency())) {
      return absl::InvalidArgumentError(
          "spec.log_spaced_frequencies: min_frequency and max_frequency must "
          "be finite and > 0");
    }
    request.frequencies =
        std::make_shared<const std::vector<double>>(LogSpacedFrequencies(
            spec.dim() / 2, law.min_frequency(), law.max_frequency()));
  }
  auto out_dtype = DTypeFromProto(dtype, "dtype");
  if (!out_dtype.ok()) return out_dtype.status();
  request.dtype = *out_dtype;
  return request;
}

void SpecRequestToProto(const SpecRequest& spec, v1::EmbedRequest* request) {
  request->set_preset(spec.preset);
  v1::EmbeddingSpec* out = request->mutable_spec();
  if (spec.dim) out->set_dim(*spec.dim);
  if (spec.max_period) out->set_max_period(*spec.max_period);
  if (spec.flip_sin_to_cos) out->set_flip_sin_to_cos(*spec.flip_sin_to_cos);
  if (spec.downscale_freq_shift) {
    out->set_downscale_freq_shift(*spec.downscale_freq_shift);
  }
  if (spec.scale) out->set_scale(*spec.scale);
  if (spec.time_factor) out->set_time_factor(*spec.time_factor);
  if (spec.repeat_only) out->set_repeat_only(*spec.repeat_only);
  if (spec.layout) out->set_layout(LayoutToProto(*spec.layout));
  if (spec.exponent_order) {
    out->set_exponent_order(ExponentOrderToProto(*spec.exponent_order));
  }
  if (spec.precision) out->set_precision(PrecisionToProto(*spec.precision));
  if (spec.timestep_dtype) {
    out->set_timestep_dtype(DTypeToProto(*spec.timestep_dtype));
  }
  if (spec.frequencies != nullptr) {
    out->mutable_frequencies()->Add(spec.frequencies->begin(),
                                    spec.frequencies->end());
  }
  if (spec.dtype) request->set_dtype(DTypeToProto(*spec.dtype));
}

void SpecToProto(const EmbeddingSpec& spec, v1::EmbeddingSpec* out) {
  if (spec.dim > 0) out->set_dim(spec.dim);
  out->set_max_period(spec.max_period);
  out->set_flip_sin_to_cos(spec.flip_sin_to_cos);
  out->set_downscale_freq_shift(spec.downscale_freq_shift);
  out->set_scale(spec.scale);
  out->set_time_factor(spec.time_factor);
  out->set_repeat_only(spec.repeat_only);
  out->set_layout(LayoutToProto(spec.layout));
  out->set_exponent_order(ExponentOrderToProto(spec.exponent_order));
  out->set_precision(PrecisionToProto(spec.precision));
  out->set_timestep_dtype(DTypeToProto(spec.timestep_dtype));
  if (spec.frequencies != nullptr) {
    out->mutable_frequencies()->Add(spec.frequencies->begin(),
                                    spec.frequencies->end());
  }
}

void PresetToProto(const Preset& preset, v1::Preset* out) {
  out->set_name(preset.name);
  out->set_description(preset.description);
  SpecToProto(preset.spec, out->mutable_spec());
  out->set_dim_overridable(preset.dim_overridable);
  out->set_default_dtype(DTypeToProto(preset.spec.dtype));
  for (const PresetPart& part : preset.parts) {
    v1::PresetPart* entry = out->add_parts();
    entry->set_name(part.name);
    entry->set_preset(part.preset);
  }
}

absl::StatusOr<Preset> PresetFromProto(const v1::Preset& proto) {
  absl::StatusOr<SpecRequest> request =
      SpecRequestFromProto("", proto.spec(), proto.default_dtype());
  if (!request.ok()) return request.status();
  if (!request->flip_sin_to_cos ||
      (!request->downscale_freq_shift && request->frequencies == nullptr &&
       proto.frequencies_file().empty())) {
    return absl::InvalidArgumentError(
        "spec must set flip_sin_to_cos and downscale_freq_shift explicitly");
  }
  Preset preset;
  preset.name = proto.name();
  preset.description = proto.description();
  preset.dim_overridable = proto.dim_overridable();
  EmbeddingSpec& spec = preset.spec;
  spec.dim = request->dim.value_or(0);
  spec.max_period = request->max_period.value_or(spec.max_period);
  spec.flip_sin_to_cos = *request->flip_sin_to_cos;
  spec.downscale_freq_shift =
      request->downscale_freq_shift.value_or(spec.downscale_freq_shift);
  spec.scale = request->scale.value_or(spec.scale);
  spec.time_factor = request->time_factor.value_or(spec.time_factor);
  spec.repeat_only = request->repeat_only.value_or(spec.repeat_only);
  spec.layout = request->layout.value_or(spec.layout);
  spec.exponent_order = request->exponent_order.value_or(spec.exponent_order);
  spec.precision = request->precision.value_or(spec.precision);
  spec.dtype = request->dtype.value_or(spec.dtype);
  spec.timestep_dtype = request->timestep_dtype.value_or(spec.timestep_dtype);
  spec.frequencies = request->frequencies;
  for (const v1::PresetPart& part : proto.parts()) {
    preset.parts.push_back({part.name(), part.preset()});
  }
  return preset;
}

namespace {

// The float timesteps of `message` (an EmbedRequest or an EmbedPart), or its
// integer ones converted into a new entry of `storage`.
template <typename Message>
absl::StatusOr<absl::Span<const float>> TimestepsOf(
    const Message& message, std::vector<std::vector<float>>* storage) {
  if (message.integer_timesteps_size() == 0) {
    return absl::MakeConstSpan(message.timesteps().data(),
                               message.timesteps_size());
  }
  if (message.timesteps_size() > 0) {
    return absl::InvalidArgumentError(
        "set either timesteps or integer_timesteps, not both");
  }
  storage->push_back(TimestepsAsFloat32(message.integer_timesteps()));
  return absl::MakeConstSpan(storage->back());
}

}  // namespace

absl::StatusOr<Request> RequestFromProto(
    const v1::EmbedRequest& request, std::vector<std::vector<float>>* storage) {
  Request out;
  out.request_id = request.request_id();
  ASSIGN_OR_RETURN(
      out.spec,
      SpecRequestFromProto(request.preset(), request.spec(), request.dtype()));
  if (request.parts_size() == 0) {
    RequestPart whole;
    ASSIGN_OR_RETURN(whole.timesteps, TimestepsOf(request, storage));
    whole.timesteps_shape = request.timesteps_shape();
    out.parts.push_back(std::move(whole));
    out.named_parts = false;
    return out;
  }
  if (request.timesteps_size() > 0 || request.integer_timesteps_size() > 0 ||
      !request.timesteps_shape().empty()) {
    return absl::InvalidArgumentError(
        "a request with parts carries its timesteps in each part: leave "
        "timesteps, integer_timesteps and timesteps_shape empty");
  }
  // Every part is converted (the message size bounds them); the core
  // enforces the limits on their number and names.
  out.parts.reserve(request.parts_size());
  for (int i = 0; i < request.parts_size(); ++i) {
    const v1::EmbedPart& part = request.parts(i);
    RequestPart converted;
    converted.name = part.name();
    converted.field = absl::StrCat("parts[", i, "]");
    ASSIGN_OR_RETURN(
        converted.spec,
        SpecRequestFromProto(part.preset(), part.spec(), part.dtype()));
    ASSIGN_OR_RETURN(converted.timesteps, TimestepsOf(part, storage));
    converted.timesteps_shape = part.timesteps_shape();
    out.parts.push_back(std::move(converted));
  }
  return out;
}

v1::ServerInfo ServerInfoProto(const EmbedService& service,
                               int64_t max_message_bytes) {
  v1::ServerInfo info;
  info.set_version(std::string(Version()));
  info.set_backend(std::string(BackendKindName(service.backend().kind())));
  info.set_device(service.backend().device());
  v1::Limits* limits = info.mutable_limits();
  limits->set_max_dim(service.limits().max_dim);
  limits->set_max_batch(service.limits().max_batch);
  limits->set_max_output_bytes(service.limits().max_output_bytes);
  limits->set_max_message_bytes(max_message_bytes);
  for (const Preset& preset : service.presets().presets()) {
    PresetToProto(preset, info.add_presets());
  }
  return info;
}

}  // namespace temb
