// The preset catalogue: the built-in entries against the contract table
// (docs/semantics.md, presets.textproto) and the rejection of malformed
// catalogues.
#include "temb/core/presets.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "temb/v1_convert/preset_catalog.h"

namespace temb {
namespace {

using ::testing::HasSubstr;

struct Expected {
  const char* name;
  int dim;  // 0: the caller chooses
  bool dim_overridable;
  bool flip_sin_to_cos;
  double shift;
  Layout layout;
  double time_factor;
  Precision precision;
  double scale = 1.0;
  double max_period = 10000.0;
  ExponentOrder exponent_order = ExponentOrder::kDivideLast;
};

constexpr Layout kH = Layout::kHalves;
constexpr Precision kF32 = Precision::kFloat32;
constexpr ExponentOrder kSlopeFirst = ExponentOrder::kSlopeFirst;

TEST(PresetsTest, BuiltInCatalogueMatchesTheContract) {
  const Expected table[] = {
      {"sd15", 320, false, true, 0, kH, 1, kF32},
      {"sd21", 320, false, true, 0, kH, 1, kF32},
      {"sdxl", 320, false, true, 0, kH, 1, kF32},
      {"sdxl-add-time", 256, false, true, 0, kH, 1, kF32},
      {"ddpm", 128, false, false, 1, kH, 1, kF32},
      {"dit", 256, false, true, 0, kH, 1, kF32},
      {"dit-diffusers", 256, false, true, 1, kH, 1, kF32},
      {"pixart", 256, false, true, 0, kH, 1, kF32},
      {"sd3", 256, false, true, 0, kH, 1, kF32},
      {"hunyuan-video", 256, false, true, 0, kH, 1, kF32},
      {"wan", 256, false, true, 0, kH, 1, Precision::kFloat64},
      {"wan-diffusers", 256, false, true, 0, kH, 1, kF32},
      {"flux", 256, false, true, 0, kH, 1000, kF32},
      {"transformer", 512, true, false, 0, Layout::kInterleaved, 1, kF32},
      {"ldm", 0, true, true, 0, kH, 1, kF32},
      {"diffusers-default", 0, true, false, 1, kH, 1, kF32},
      // Today's families (diffusers 0.42.1); tests/models runs diffusers.
      {"flux2", 256, false, true, 0, kH, 1000, kF32},
      {"qwen-image", 256, false, true, 0, kH, 1, kF32, 1000},
      {"auraflow", 256, false, true, 0, kH, 1, kF32, 1000},
      {"z-image", 256, false, true, 0, kH, 1000, kF32},
      {"lumina2", 256, false, true, 0, kH, 1, kF32},
      {"hidream", 256, false, true, 0, kH, 1, kF32},
      {"sana", 256, false, true, 0, kH, 1, kF32},
      {"ltx-video", 256, false, true, 0, kH, 1, kF32},
      {"ltx2", 256, false, true, 0, kH, 1, kF32},
      {"cogvideox", 1920, true, true, 0, kH, 1, kF32},
      {"cosmos", 4096, true, true, 0, kH, 1, kF32},
      {"kandinsky5", 2048, true, true, 0, kH, 1, kF32},
      {"kandinsky3", 192, false, false, 1, kH, 1, kF32},
      {"ernie-image", 3072, false, false, 0, kH, 1, kF32},
      {"chroma", 16, false, true, 0, kH, 1000, kF32},
      {"skyreels-v2", 256, false, true, 0, kH, 1, Precision::kFloat64},
      {"hunyuan-video-1.5", 256, false, true, 0, kH, 1, kF32},
      {"hunyuan-dit", 256, false, true, 0, kH, 1, kF32},
      {"mochi", 256, false, true, 0, kH, 1, kF32},
      {"allegro", 256, false, true, 0, kH, 1, kF32},
      {"latte", 256, false, true, 0, kH, 1, kF32},
      {"omnigen", 256, false, true, 0, kH, 1, kF32},
      {"bria", 256, false, true, 0, kH, 1, kF32},
      {"prx", 256, false, true, 0, kH, 1, kF32, 1000},
      {"ace-step", 256, false, true, 0, kH, 1000, kF32},
      {"longcat-audio-dit", 256, false, false, 1, kH, 1000, kF32, 1, 10000,
       kSlopeFirst},
      {"t5-film", 768, true, false, 1, kH, 2000, kF32, 1, 2000},
      // Its own (log-spaced) table; shift plays no part and stays 0.
      {"stable-audio-3", 256, false, true, 0, kH, 1, kF32, 6.283185307179586},
      {"flux3", 256, false, true, 0, kH, 1000, kF32},
      {"ideogram4", 4608, false, false, 1, kH, 10000, kF32, 1, 10000,
       kSlopeFirst},
      {"stable-cascade", 64, false, false, 1, kH, 10000, kF32, 1, 10000,
       kSlopeFirst},
      {"rfd4-proteina", 256, false, false, 1, kH, 2000, kF32, 1, 2000,
       kSlopeFirst},
      {"cogview4", 4096, true, true, 0, kH, 1, kF32},
      {"cogview3-plus", 2560, true, true, 0, kH, 1, kF32},
      {"glm-image", 512, true, true, 0, kH, 1, kF32},
      {"nucleusmoe-image", 2048, true, true, 0, kH, 1, kF32, 1000},
      {"cosmos3", 256, false, true, 0, kH, 0.001, kF32},
      {"krea2", 256, false, true, 0, kH, 1000, kF32},
      {"qwen-image-2.1", 256, false, true, 0, kH, 1000, kF32},
      {"bria-fibo2", 256, false, true, 0, kH, 1000, kF32},
  };
  const PresetCatalog& catalog = BuiltInPresetCatalog();
  EXPECT_EQ(catalog.presets().size(), std::size(table));
  for (const Expected& e : table) {
    SCOPED_TRACE(e.name);
    const Preset* preset = catalog.Find(e.name);
    ASSERT_NE(preset, nullptr);
    EXPECT_EQ(preset->name, e.name);
    EXPECT_EQ(preset->spec.dim, e.dim);
    EXPECT_EQ(preset->dim_overridable, e.dim_overridable);
    EXPECT_EQ(preset->spec.flip_sin_to_cos, e.flip_sin_to_cos);
    EXPECT_EQ(preset->spec.downscale_freq_shift, e.shift);
    EXPECT_EQ(preset->spec.layout, e.layout);
    EXPECT_EQ(preset->spec.time_factor, e.time_factor);
    EXPECT_EQ(preset->spec.precision, e.precision);
    EXPECT_EQ(preset->spec.max_period, e.max_period);
    EXPECT_EQ(preset->spec.scale, e.scale);
    EXPECT_EQ(preset->spec.exponent_order, e.exponent_order);
    EXPECT_FALSE(preset->spec.repeat_only);
    EXPECT_EQ(preset->spec.dtype, DType::kFloat32);
    EXPECT_THAT(preset->description, HasSubstr("Source:"));
    EXPECT_EQ(preset->spec.frequencies != nullptr, e.name == "stable-audio-3");
  }
  EXPECT_EQ(catalog.Find("nope"), nullptr);
}

TEST(PresetsTest, ParsesACustomCatalogue) {
  auto catalog = ParsePresetCatalog(R"pb(
    presets {
      name: "mine"
      description: "half precision LDM"
      spec { dim: 64 flip_sin_to_cos: true downscale_freq_shift: 0 scale: 2 }
      default_dtype: DTYPE_FP16
    }
    presets {
      name: "any"
      spec { flip_sin_to_cos: false downscale_freq_shift: 1 max_period: 100 }
      dim_overridable: true
    }
  )pb");
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  ASSERT_EQ(catalog->presets().size(), 2u);
  const Preset& mine = catalog->presets()[0];
  EXPECT_EQ(mine.name, "mine");
  EXPECT_EQ(mine.description, "half precision LDM");
  EXPECT_EQ(mine.spec.dim, 64);
  EXPECT_EQ(mine.spec.scale, 2.0);
  EXPECT_EQ(mine.spec.dtype, DType::kFloat16);
  EXPECT_FALSE(mine.dim_overridable);
  const Preset* any = catalog->Find("any");
  ASSERT_NE(any, nullptr);
  EXPECT_EQ(any->spec.dim, 0);
  EXPECT_EQ(any->spec.max_period, 100.0);
  EXPECT_TRUE(any->dim_overridable);
}

TEST(PresetsTest, RejectsBadCataloguesNamingThePreset) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"presets {\n  name: \"broken\"\n  spec { dim: }\n}\n",
       "line 3, column 15"},
      {R"pb(presets { name: "x" bogus_field: 1 })pb", "bogus_field"},
      {R"pb(presets {
              spec { dim: 8 flip_sin_to_cos: true downscale_freq_shift: 0 }
            })pb",
       "empty name"},
      {R"pb(presets {
              name: "twice"
              spec { dim: 8 flip_sin_to_cos: true downscale_freq_shift: 0 }
            }
            presets {
              name: "twice"
              spec { dim: 8 flip_sin_to_cos: true downscale_freq_shift: 0 }
            })pb",
       "duplicate preset \"twice\""},
      {R"pb(presets {
              name: "noflip"
              spec { dim: 8 downscale_freq_shift: 0 }
            })pb",
       "preset \"noflip\": spec must set flip_sin_to_cos"},
      {R"pb(presets {
              name: "noshift"
              spec { dim: 8 flip_sin_to_cos: true }
            })pb",
       "preset \"noshift\""},
      {R"pb(presets {
              name: "nodim"
              spec { flip_sin_to_cos: true downscale_freq_shift: 0 }
            })pb",
       "preset \"nodim\": spec.dim is required"},
      {R"pb(presets {
              name: "nan"
              spec { dim: 2 flip_sin_to_cos: false downscale_freq_shift: 1 }
            })pb",
       "preset \"nan\": dim / 2 - downscale_freq_shift must be non-zero"},
      {R"pb(presets {
              name: "odd"
              spec {
                dim: 7
                flip_sin_to_cos: false
                downscale_freq_shift: 0
                layout: LAYOUT_INTERLEAVED
              }
            })pb",
       "preset \"odd\": dim must be even"},
      {R"pb(presets {
              name: "period"
              spec {
                dim: 8
                flip_sin_to_cos: true
                downscale_freq_shift: 0
                max_period: -1
              }
            })pb",
       "preset \"period\": max_period"},
      {R"pb(presets {
              name: "huge"
              spec { dim: 100000 flip_sin_to_cos: true downscale_freq_shift: 0 }
            })pb",
       "preset \"huge\": dim must be in"},
  };
  for (const Case& c : cases) {
    auto catalog = ParsePresetCatalog(c.text);
    EXPECT_EQ(catalog.status().code(), absl::StatusCode::kInvalidArgument)
        << c.text;
    EXPECT_THAT(catalog.status().message(), HasSubstr(c.message));
  }
}

TEST(PresetsTest, FromFile) {
  const std::string path =
      ::testing::TempDir() + "/temb_presets_test.textproto";
  {
    std::ofstream file(path);
    file << R"pb(presets {
                   name: "bad"
                   spec { dim: 3 flip_sin_to_cos: true downscale_freq_shift: 1 }
                 })pb";
  }
  auto bad = ReadPresetCatalog(path);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr(path));
  EXPECT_THAT(bad.status().message(), HasSubstr("preset \"bad\""));
  {
    std::ofstream file(path);
    file << R"pb(presets {
                   name: "good"
                   spec { dim: 4 flip_sin_to_cos: true downscale_freq_shift: 1 }
                 })pb";
  }
  auto good = ReadPresetCatalog(path);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_NE(good->Find("good"), nullptr);
  std::remove(path.c_str());

  auto missing = ReadPresetCatalog(path + ".missing");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace temb
