// temb.v1 <-> core conversions.  The property that matters is presence:
// a field the caller left unset must stay unset in both directions (the
// server's preset rules depend on it), and an explicit false or 0 must
// survive as set.
#include "temb/v1_convert/conversions.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "temb/core/embed_service.h"
#include "temb/core/presets.h"
#include "temb/kernels/embedding_spec.h"
#include "temb/v1/temb.pb.h"
#include "temb/v1_convert/preset_catalog.h"

namespace temb {
namespace {

using ::testing::HasSubstr;

// Every field of a SpecRequest compared, preset_entry aside (it is never
// converted).
void ExpectSameRequest(const SpecRequest& a, const SpecRequest& b) {
  EXPECT_EQ(a.preset, b.preset);
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.max_period, b.max_period);
  EXPECT_EQ(a.flip_sin_to_cos, b.flip_sin_to_cos);
  EXPECT_EQ(a.downscale_freq_shift, b.downscale_freq_shift);
  EXPECT_EQ(a.scale, b.scale);
  EXPECT_EQ(a.time_factor, b.time_factor);
  EXPECT_EQ(a.repeat_only, b.repeat_only);
  EXPECT_EQ(a.layout, b.layout);
  EXPECT_EQ(a.exponent_order, b.exponent_order);
  EXPECT_EQ(a.precision, b.precision);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.timestep_dtype, b.timestep_dtype);
}

absl::StatusOr<SpecRequest> RoundTrip(const SpecRequest& request) {
  v1::EmbedRequest proto;
  SpecRequestToProto(request, &proto);
  return SpecRequestFromProto(proto.preset(), proto.spec(), proto.dtype());
}

TEST(ConversionsTest, EveryFieldRoundTrips) {
  SpecRequest request;
  request.preset = "mine";
  request.dim = 96;
  request.max_period = 250.5;
  request.flip_sin_to_cos = false;
  request.downscale_freq_shift = 1.0;
  request.scale = 3.25;
  request.time_factor = 1000.0;
  request.repeat_only = true;
  request.layout = Layout::kInterleaved;
  request.exponent_order = ExponentOrder::kSlopeFirst;
  request.precision = Precision::kFloat64;
  request.dtype = DType::kBFloat16;
  request.timestep_dtype = DType::kFloat16;

  v1::EmbedRequest proto;
  SpecRequestToProto(request, &proto);
  EXPECT_EQ(proto.preset(), "mine");
  EXPECT_EQ(proto.spec().dim(), 96);
  EXPECT_EQ(proto.spec().max_period(), 250.5);
  ASSERT_TRUE(proto.spec().has_flip_sin_to_cos());
  EXPECT_FALSE(proto.spec().flip_sin_to_cos());
  EXPECT_EQ(proto.spec().downscale_freq_shift(), 1.0);
  EXPECT_EQ(proto.spec().scale(), 3.25);
  EXPECT_EQ(proto.spec().time_factor(), 1000.0);
  EXPECT_TRUE(proto.spec().repeat_only());
  EXPECT_EQ(proto.spec().layout(), v1::LAYOUT_INTERLEAVED);
  EXPECT_EQ(proto.spec().exponent_order(), v1::EXPONENT_ORDER_SLOPE_FIRST);
  EXPECT_EQ(proto.spec().precision(), v1::PRECISION_FP64);
  EXPECT_EQ(proto.spec().timestep_dtype(), v1::DTYPE_FP16);
  EXPECT_EQ(proto.dtype(), v1::DTYPE_BF16);

  absl::StatusOr<SpecRequest> back =
      SpecRequestFromProto(proto.preset(), proto.spec(), proto.dtype());
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameRequest(*back, request);
}

TEST(ConversionsTest, UnsetFieldsStayUnset) {
  v1::EmbedRequest proto;
  SpecRequestToProto(SpecRequest(), &proto);
  const v1::EmbeddingSpec& spec = proto.spec();
  EXPECT_FALSE(spec.has_dim());
  EXPECT_FALSE(spec.has_max_period());
  EXPECT_FALSE(spec.has_flip_sin_to_cos());
  EXPECT_FALSE(spec.has_downscale_freq_shift());
  EXPECT_FALSE(spec.has_scale());
  EXPECT_FALSE(spec.has_time_factor());
  EXPECT_FALSE(spec.has_repeat_only());
  EXPECT_EQ(spec.layout(), v1::LAYOUT_UNSPECIFIED);
  EXPECT_EQ(spec.exponent_order(), v1::EXPONENT_ORDER_UNSPECIFIED);
  EXPECT_EQ(spec.precision(), v1::PRECISION_UNSPECIFIED);
  EXPECT_EQ(spec.timestep_dtype(), v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(proto.dtype(), v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(spec.ByteSizeLong(), 0u);

  absl::StatusOr<SpecRequest> back = SpecRequestFromProto("", spec, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameRequest(*back, SpecRequest());
}

// One field at a time, each at the value that proto3 without presence
// would drop (false, 0): it must arrive set, and alone.
TEST(ConversionsTest, EachFieldAloneSurvivesAtItsZeroValue) {
  struct Case {
    const char* name;
    void (*set)(SpecRequest*);
  };
  const Case cases[] = {
      {"dim", [](SpecRequest* r) { r->dim = 0; }},
      {"max_period", [](SpecRequest* r) { r->max_period = 0.0; }},
      {"flip_sin_to_cos", [](SpecRequest* r) { r->flip_sin_to_cos = false; }},
      {"downscale_freq_shift",
       [](SpecRequest* r) { r->downscale_freq_shift = 0.0; }},
      {"scale", [](SpecRequest* r) { r->scale = 0.0; }},
      {"time_factor", [](SpecRequest* r) { r->time_factor = 0.0; }},
      {"repeat_only", [](SpecRequest* r) { r->repeat_only = false; }},
      {"layout", [](SpecRequest* r) { r->layout = Layout::kHalves; }},
      {"exponent_order",
       [](SpecRequest* r) { r->exponent_order = ExponentOrder::kDivideLast; }},
      {"precision", [](SpecRequest* r) { r->precision = Precision::kFloat32; }},
      {"dtype", [](SpecRequest* r) { r->dtype = DType::kFloat32; }},
      {"timestep_dtype",
       [](SpecRequest* r) { r->timestep_dtype = DType::kFloat32; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    SpecRequest request;
    c.set(&request);
    absl::StatusOr<SpecRequest> back = RoundTrip(request);
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSameRequest(*back, request);
  }
}

TEST(ConversionsTest, EnumsMapBothWays) {
  for (DType dtype :
       {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    auto back = DTypeFromProto(DTypeToProto(dtype), "dtype");
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, dtype);
  }
  for (Layout layout : {Layout::kHalves, Layout::kInterleaved}) {
    auto back = LayoutFromProto(LayoutToProto(layout), "layout");
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, layout);
  }
  for (ExponentOrder order :
       {ExponentOrder::kDivideLast, ExponentOrder::kSlopeFirst}) {
    auto back =
        ExponentOrderFromProto(ExponentOrderToProto(order), "exponent_order");
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, order);
  }
  for (Precision precision : {Precision::kFloat32, Precision::kFloat64}) {
    auto back = PrecisionFromProto(PrecisionToProto(precision), "precision");
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, precision);
  }
  // Every value the proto defines converts; UNSPECIFIED is "not set".
  // INT64 is only the per-token index output of a conditioning model, never
  // an embedding's dtype: refused naming the field.
  EXPECT_EQ(DTypeFromProto(v1::DTYPE_INT64, "dtype").status().code(),
            absl::StatusCode::kInvalidArgument);
  for (int i = 0; i < v1::DType_descriptor()->value_count(); ++i) {
    const int value = v1::DType_descriptor()->value(i)->number();
    if (value == v1::DTYPE_INT64) continue;
    auto dtype = DTypeFromProto(value, "dtype");
    ASSERT_TRUE(dtype.ok()) << value;
    EXPECT_EQ(dtype->has_value(), value != v1::DTYPE_UNSPECIFIED);
    if (dtype->has_value()) {
      EXPECT_EQ(DTypeToProto(**dtype), value);
    }
  }
  for (int i = 0; i < v1::Layout_descriptor()->value_count(); ++i) {
    const int value = v1::Layout_descriptor()->value(i)->number();
    auto layout = LayoutFromProto(value, "layout");
    ASSERT_TRUE(layout.ok()) << value;
    EXPECT_EQ(layout->has_value(), value != v1::LAYOUT_UNSPECIFIED);
  }
  for (int i = 0; i < v1::ExponentOrder_descriptor()->value_count(); ++i) {
    const int value = v1::ExponentOrder_descriptor()->value(i)->number();
    auto order = ExponentOrderFromProto(value, "exponent_order");
    ASSERT_TRUE(order.ok()) << value;
    EXPECT_EQ(order->has_value(), value != v1::EXPONENT_ORDER_UNSPECIFIED);
  }
  for (int i = 0; i < v1::Precision_descriptor()->value_count(); ++i) {
    const int value = v1::Precision_descriptor()->value(i)->number();
    auto precision = PrecisionFromProto(value, "precision");
    ASSERT_TRUE(precision.ok()) << value;
    EXPECT_EQ(precision->has_value(), value != v1::PRECISION_UNSPECIFIED);
  }
}

// proto3 enums are open: a peer may send any int32.  The error names the
// field so that the caller knows which one.
TEST(ConversionsTest, EnumValuesOutsideTheEnumNameTheField) {
  struct Case {
    const char* field;
    void (*set)(v1::EmbeddingSpec*, int*);
    int value;
  };
  const Case cases[] = {
      {"spec.layout",
       [](v1::EmbeddingSpec* s, int*) {
         s->set_layout(static_cast<v1::Layout>(7));
       },
       7},
      {"spec.exponent_order",
       [](v1::EmbeddingSpec* s, int*) {
         s->set_exponent_order(static_cast<v1::ExponentOrder>(3));
       },
       3},
      {"spec.precision",
       [](v1::EmbeddingSpec* s, int*) {
         s->set_precision(static_cast<v1::Precision>(-1));
       },
       -1},
      {"spec.timestep_dtype",
       [](v1::EmbeddingSpec* s, int*) {
         s->set_timestep_dtype(static_cast<v1::DType>(42));
       },
       42},
      {"dtype", [](v1::EmbeddingSpec*, int* dtype) { *dtype = 99; }, 99},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    v1::EmbeddingSpec spec;
    spec.set_dim(8);
    int dtype = v1::DTYPE_FP32;
    c.set(&spec, &dtype);
    absl::StatusOr<SpecRequest> request =
        SpecRequestFromProto("sd15", spec, dtype);
    EXPECT_EQ(request.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(request.status().message(),
                HasSubstr(absl::StrCat(c.field, " has an unknown enum value ",
                                       c.value)));
  }
  EXPECT_THAT(DTypeFromProto(5, "parts[2].dtype").status().message(),
              HasSubstr("parts[2].dtype"));
  EXPECT_EQ(LayoutFromProto(3, "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PrecisionFromProto(3, "x").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ConversionsTest, SpecToProtoMarksEveryFieldPresent) {
  // A preset's spec is complete: the fields at false and 0 are sent as set,
  // so a client reading ServerInfo sees the convention, not proto defaults.
  EmbeddingSpec spec;
  spec.flip_sin_to_cos = false;
  v1::EmbeddingSpec out;
  SpecToProto(spec, &out);
  EXPECT_FALSE(out.has_dim());  // 0: a preset without a default width
  EXPECT_TRUE(out.has_max_period());
  EXPECT_TRUE(out.has_flip_sin_to_cos());
  EXPECT_FALSE(out.flip_sin_to_cos());
  EXPECT_TRUE(out.has_downscale_freq_shift());
  EXPECT_TRUE(out.has_scale());
  EXPECT_TRUE(out.has_time_factor());
  EXPECT_TRUE(out.has_repeat_only());
  EXPECT_EQ(out.layout(), v1::LAYOUT_HALVES);
  EXPECT_EQ(out.exponent_order(), v1::EXPONENT_ORDER_DIVIDE_LAST);
  EXPECT_EQ(out.precision(), v1::PRECISION_FP32);
  EXPECT_EQ(out.timestep_dtype(), v1::DTYPE_FP32);

  spec.dim = 320;
  SpecToProto(spec, &out);
  EXPECT_EQ(out.dim(), 320);
}

Preset CustomPreset() {
  Preset preset;
  preset.name = "custom";
  preset.description = "every field off its default";
  preset.dim_overridable = true;
  preset.spec.dim = 64;
  preset.spec.max_period = 512;
  preset.spec.flip_sin_to_cos = false;
  preset.spec.downscale_freq_shift = 1;
  preset.spec.scale = 0.5;
  preset.spec.time_factor = 1000;
  preset.spec.repeat_only = false;
  preset.spec.layout = Layout::kInterleaved;
  preset.spec.exponent_order = ExponentOrder::kSlopeFirst;
  preset.spec.dtype = DType::kFloat16;
  preset.spec.precision = Precision::kFloat64;
  preset.spec.timestep_dtype = DType::kBFloat16;
  return preset;
}

void ExpectSamePreset(const Preset& a, const Preset& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.description, b.description);
  EXPECT_EQ(a.dim_overridable, b.dim_overridable);
  EXPECT_TRUE(a.spec == b.spec)
      << SpecDebugString(a.spec) << "\n vs " << SpecDebugString(b.spec);
}

TEST(ConversionsTest, PresetRoundTrips) {
  const Preset preset = CustomPreset();
  v1::Preset proto;
  PresetToProto(preset, &proto);
  EXPECT_EQ(proto.name(), "custom");
  EXPECT_EQ(proto.description(), "every field off its default");
  EXPECT_TRUE(proto.dim_overridable());
  EXPECT_EQ(proto.default_dtype(), v1::DTYPE_FP16);
  EXPECT_EQ(proto.spec().dim(), 64);
  absl::StatusOr<Preset> back = PresetFromProto(proto);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSamePreset(*back, preset);

  // Without a default width: dim stays 0 through the proto.
  Preset open = preset;
  open.spec.dim = 0;
  proto.Clear();
  PresetToProto(open, &proto);
  EXPECT_FALSE(proto.spec().has_dim());
  back = PresetFromProto(proto);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSamePreset(*back, open);
}

TEST(ConversionsTest, EveryBuiltInPresetRoundTrips) {
  // What GetServerInfo sends must read back as the same catalogue entry.
  const std::vector<Preset>& presets = BuiltInPresetCatalog().presets();
  ASSERT_FALSE(presets.empty());
  for (const Preset& preset : presets) {
    SCOPED_TRACE(preset.name);
    v1::Preset proto;
    PresetToProto(preset, &proto);
    absl::StatusOr<Preset> back = PresetFromProto(proto);
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSamePreset(*back, preset);
  }
}

TEST(ConversionsTest, PresetFromProtoDefaultsTheOptionalFields) {
  v1::Preset proto;
  proto.set_name("minimal");
  proto.mutable_spec()->set_dim(16);
  // Present at their zero values: presence is what counts.
  proto.mutable_spec()->set_flip_sin_to_cos(false);
  proto.mutable_spec()->set_downscale_freq_shift(0);
  absl::StatusOr<Preset> preset = PresetFromProto(proto);
  ASSERT_TRUE(preset.ok()) << preset.status();
  EmbeddingSpec expected;
  expected.dim = 16;
  expected.flip_sin_to_cos = false;
  expected.downscale_freq_shift = 0;
  EXPECT_TRUE(preset->spec == expected) << SpecDebugString(preset->spec);
  EXPECT_FALSE(preset->dim_overridable);
}

TEST(ConversionsTest, PresetFromProtoRequiresTheConvention) {
  v1::Preset proto;
  proto.set_name("p");
  proto.mutable_spec()->set_dim(16);
  proto.mutable_spec()->set_flip_sin_to_cos(true);
  absl::StatusOr<Preset> preset = PresetFromProto(proto);
  EXPECT_EQ(preset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(preset.status().message(), HasSubstr("downscale_freq_shift"));

  proto.mutable_spec()->clear_flip_sin_to_cos();
  proto.mutable_spec()->set_downscale_freq_shift(1);
  preset = PresetFromProto(proto);
  EXPECT_EQ(preset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(preset.status().message(), HasSubstr("flip_sin_to_cos"));

  proto.mutable_spec()->set_flip_sin_to_cos(true);
  EXPECT_TRUE(PresetFromProto(proto).ok());
}

TEST(ConversionsTest, PresetFromProtoRejectsBadEnums) {
  v1::Preset proto;
  proto.set_name("p");
  proto.mutable_spec()->set_dim(16);
  proto.mutable_spec()->set_flip_sin_to_cos(true);
  proto.mutable_spec()->set_downscale_freq_shift(0);
  proto.set_default_dtype(static_cast<v1::DType>(17));
  absl::StatusOr<Preset> preset = PresetFromProto(proto);
  EXPECT_EQ(preset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(preset.status().message(), HasSubstr("dtype"));
  EXPECT_THAT(preset.status().message(), HasSubstr("17"));

  proto.set_default_dtype(v1::DTYPE_FP32);
  proto.mutable_spec()->set_layout(static_cast<v1::Layout>(3));
  preset = PresetFromProto(proto);
  EXPECT_EQ(preset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(preset.status().message(), HasSubstr("spec.layout"));
}

}  // namespace
}  // namespace temb
