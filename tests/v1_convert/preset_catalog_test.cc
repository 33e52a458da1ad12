// Preset catalogue parsing: the cases tests/core/presets_test.cc leaves
// out.  Limits given to ParsePresetCatalog/ReadPresetCatalog must be the
// ones applied, enum values are checked, and every error says where.
#include "temb/v1_convert/preset_catalog.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "temb/core/presets.h"
#include "temb/kernels/embedding_spec.h"

namespace temb {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kWide[] = R"pb(
  presets {
    name: "wide"
    spec { dim: 64 flip_sin_to_cos: true downscale_freq_shift: 0 }
  }
)pb";

TEST(PresetCatalogTest, DimIsCheckedAgainstTheGivenLimits) {
  Limits limits;
  limits.max_dim = 64;  // the boundary itself is allowed
  absl::StatusOr<PresetCatalog> catalog = ParsePresetCatalog(kWide, limits);
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  EXPECT_EQ(catalog->Find("wide")->spec.dim, 64);

  limits.max_dim = 63;
  catalog = ParsePresetCatalog(kWide, limits);
  // RESOURCE_EXHAUSTED for a request; for a catalogue it is a bad file.
  EXPECT_EQ(catalog.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(catalog.status().message(), HasSubstr("preset \"wide\""));
  EXPECT_THAT(catalog.status().message(), HasSubstr("63"));
}

TEST(PresetCatalogTest, LargeLimitsAdmitWhatTheDefaultsRefuse) {
  const std::string text = R"pb(
    presets {
      name: "huge"
      spec { dim: 20000 flip_sin_to_cos: true downscale_freq_shift: 0 }
    }
  )pb";
  EXPECT_EQ(ParsePresetCatalog(text).status().code(),
            absl::StatusCode::kInvalidArgument);
  Limits limits;
  limits.max_dim = 32768;
  absl::StatusOr<PresetCatalog> catalog = ParsePresetCatalog(text, limits);
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  EXPECT_EQ(catalog->Find("huge")->spec.dim, 20000);
}

// A preset without a default width is validated at limits.max_dim, so the
// same entry can be fine under one server's limits and not another's.
TEST(PresetCatalogTest, DimlessPresetIsCheckedAtMaxDim) {
  const std::string text = R"pb(
    presets {
      name: "open"
      spec { flip_sin_to_cos: false downscale_freq_shift: 4 }
      dim_overridable: true
    }
  )pb";
  EXPECT_TRUE(ParsePresetCatalog(text).ok());
  Limits limits;
  limits.max_dim = 8;  // H - shift = 8 / 2 - 4 = 0
  absl::StatusOr<PresetCatalog> catalog = ParsePresetCatalog(text, limits);
  EXPECT_EQ(catalog.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(catalog.status().message(), HasSubstr("preset \"open\""));
  EXPECT_THAT(catalog.status().message(), HasSubstr("downscale_freq_shift"));
}

TEST(PresetCatalogTest, SyntaxErrorsGiveLineAndColumn) {
  // The error sits on line 4 (1-based), at the value after "max_period:".
  const std::string text =
      "presets {\n"
      "  name: \"a\"\n"
      "  spec {\n"
      "    max_period: \"ten\"\n"
      "  }\n"
      "}\n";
  absl::StatusOr<PresetCatalog> catalog = ParsePresetCatalog(text);
  EXPECT_EQ(catalog.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(catalog.status().message()),
              StartsWith("preset catalogue: line 4, column 17: "));

  // Only the first error is reported.
  catalog = ParsePresetCatalog("presets { name: 1 }\nnope: 2\n");
  EXPECT_THAT(std::string(catalog.status().message()),
              StartsWith("preset catalogue: line 1, column "));
  EXPECT_THAT(catalog.status().message(), Not(HasSubstr("line 2")));

  // An unterminated message: the error is at the end of the text.
  catalog = ParsePresetCatalog("presets {\n  name: \"a\"\n");
  EXPECT_EQ(catalog.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(catalog.status().message(), HasSubstr("line 3"));
}

TEST(PresetCatalogTest, EnumValuesAreChecked) {
  // An unknown enum name is a syntax error...
  absl::StatusOr<PresetCatalog> catalog = ParsePresetCatalog(R"pb(
    presets {
      name: "a"
      spec { dim: 8 flip_sin_to_cos: true downscale_freq_shift: 0 }
      default_dtype: DTYPE_FP99
    }
  )pb");
  EXPECT_EQ(catalog.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(catalog.status().message(), HasSubstr("DTYPE_FP99"));
  EXPECT_THAT(std::string(catalog.status().message()),
              StartsWith("preset catalogue: line "));

  // ...and a number outside the (open) enum is refused by the conversion,
  // naming the preset and the field.
  catalog = ParsePresetCatalog(R"pb(
    presets {
      name: "b"
      spec { dim: 8 flip_sin_to_cos: true downscale_freq_shift: 0 layout: 7 }
    }
  )pb");
  EXPECT_EQ(catalog.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(catalog.status().message(), HasSubstr("preset \"b\""));
  EXPECT_THAT(catalog.status().message(), HasSubstr("spec.layout"));

  // The enum values by number work like their names.
  catalog = ParsePresetCatalog(R"pb(
    presets {
      name: "c"
      spec { dim: 8 flip_sin_to_cos: true downscale_freq_shift: 0 layout: 2 }
      default_dtype: 3
    }
  )pb");
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  EXPECT_EQ(catalog->Find("c")->spec.layout, Layout::kInterleaved);
  EXPECT_EQ(catalog->Find("c")->spec.dtype, DType::kBFloat16);
}

TEST(PresetCatalogTest, PresetOrderIsTheFileOrder) {
  absl::StatusOr<PresetCatalog> catalog = ParsePresetCatalog(R"pb(
    presets {
      name: "zeta"
      spec { dim: 8 flip_sin_to_cos: true downscale_freq_shift: 0 }
    }
    presets {
      name: "alpha"
      spec { dim: 4 flip_sin_to_cos: false downscale_freq_shift: 1 }
    }
  )pb");
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  ASSERT_EQ(catalog->presets().size(), 2u);
  EXPECT_EQ(catalog->presets()[0].name, "zeta");
  EXPECT_EQ(catalog->presets()[1].name, "alpha");
}

class ReadPresetCatalogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/temb_preset_catalog_test.XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    for (const std::string& path : written_) std::remove(path.c_str());
    rmdir(dir_.c_str());
  }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    written_.push_back(path);
    return path;
  }

  std::string dir_;
  std::vector<std::string> written_;
};

TEST_F(ReadPresetCatalogTest, MissingFileIsNotFoundNamingThePath) {
  const std::string path = dir_ + "/absent.textproto";
  absl::StatusOr<PresetCatalog> catalog = ReadPresetCatalog(path);
  EXPECT_EQ(catalog.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(catalog.status().message(), HasSubstr(path));
}

TEST_F(ReadPresetCatalogTest, DirectoryIsAnErrorNamingThePath) {
  absl::StatusOr<PresetCatalog> catalog = ReadPresetCatalog(dir_);
  EXPECT_FALSE(catalog.ok());
  EXPECT_NE(catalog.status().code(), absl::StatusCode::kInvalidArgument)
      << "a directory is not a malformed catalogue";
  EXPECT_THAT(catalog.status().message(), HasSubstr(dir_));
}

TEST_F(ReadPresetCatalogTest, PassesTheLimitsOn) {
  const std::string path = Write("wide.textproto", kWide);
  Limits limits;
  limits.max_dim = 32;
  absl::StatusOr<PresetCatalog> catalog = ReadPresetCatalog(path, limits);
  EXPECT_EQ(catalog.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(catalog.status().message()), StartsWith(path + ": "));
  EXPECT_THAT(catalog.status().message(), HasSubstr("preset \"wide\""));
  EXPECT_TRUE(ReadPresetCatalog(path).ok());
}

TEST_F(ReadPresetCatalogTest, SyntaxErrorNamesPathLineAndColumn) {
  const std::string path =
      Write("broken.textproto", "presets {\n  name: \"x\"\n  dim: 3\n}\n");
  absl::StatusOr<PresetCatalog> catalog = ReadPresetCatalog(path);
  EXPECT_EQ(catalog.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(catalog.status().message()),
              StartsWith(path + ": preset catalogue: line 3, column "));
  EXPECT_THAT(catalog.status().message(), HasSubstr("no field named \"dim\""));
}

}  // namespace
}  // namespace temb
