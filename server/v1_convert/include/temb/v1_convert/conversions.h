// Conversions between the temb.v1 messages and the core's plain types, both
// directions.
//
// The one place that knows how temb.v1.EmbeddingSpec maps onto SpecRequest
// and EmbeddingSpec: the catalogue loader, the native frontend and the CLI
// use it, so a field added to the proto is mapped once.
#ifndef TEMB_V1_CONVERT_CONVERSIONS_H_
#define TEMB_V1_CONVERT_CONVERSIONS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "temb/core/embed_service.h"
#include "temb/core/presets.h"
#include "temb/kernels/embedding_spec.h"
#include "temb/v1/temb.pb.h"

namespace temb {

// UNSPECIFIED maps to nullopt; a value outside the enum (proto3 enums are
// open) is INVALID_ARGUMENT naming `field`.
absl::StatusOr<std::optional<DType>> DTypeFromProto(int value,
                                                    absl::string_view field);
absl::StatusOr<std::optional<Layout>> LayoutFromProto(int value,
                                                      absl::string_view field);
absl::StatusOr<std::optional<Precision>> PrecisionFromProto(
    int value, absl::string_view field);
absl::StatusOr<std::optional<ExponentOrder>> ExponentOrderFromProto(
    int value, absl::string_view field);

v1::DType DTypeToProto(DType dtype);
v1::Layout LayoutToProto(Layout layout);
v1::Precision PrecisionToProto(Precision precision);
v1::ExponentOrder ExponentOrderToProto(ExponentOrder order);

// Copies the fields present in `spec` (and the preset name and dtype) into a
// SpecRequest.  Only enum values can be invalid here; the semantic rules are
// ResolveSpec's.
absl::StatusOr<SpecRequest> SpecRequestFromProto(absl::string_view preset,
                                                 const v1::EmbeddingSpec& spec,
                                                 int dtype);

// The inverse: the fields set in `spec` (preset, dtype included) into
// `request`; unset fields stay unset.
void SpecRequestToProto(const SpecRequest& spec, v1::EmbedRequest* request);

// An EmbedRequest as the core's Request (EmbedService::Serve): its spec, and
// its timesteps as one embedding or as its parts.  The result points into
// `request` and into `storage`, where integer timesteps are converted to
// float32; both must outlive it.  INVALID_ARGUMENT for timesteps given both
// ways, or at the top level of a request with parts.
absl::StatusOr<Request> RequestFromProto(
    const v1::EmbedRequest& request, std::vector<std::vector<float>>* storage);

// What GetServerInfo answers for `service` (max_message_bytes 0: the
// caller's messages do not travel, as in the in-process engine).
v1::ServerInfo ServerInfoProto(const EmbedService& service,
                               int64_t max_message_bytes);

// Every field of `spec` except dtype, all marked present; dim is left unset
// when it is 0 (a preset without a default width).
void SpecToProto(const EmbeddingSpec& spec, v1::EmbeddingSpec* out);

void PresetToProto(const Preset& preset, v1::Preset* out);

// A catalogue entry.  INVALID_ARGUMENT for a bad enum value or a spec that
// leaves flip_sin_to_cos or downscale_freq_shift unset (a preset must say
// which convention it is); the remaining rules are PresetCatalog::Create's.
absl::StatusOr<Preset> PresetFromProto(const v1::Preset& proto);

}  // namespace temb

#endif  // TEMB_V1_CONVERT_CONVERSIONS_H_
