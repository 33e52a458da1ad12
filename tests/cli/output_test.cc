// The CLI's writers.  The end-to-end tests compare remote and in-process
// output byte for byte, so the exact text matters: each writer is pinned on
// small tensors, and FormatElement must give back the very same element.
#include "temb/cli/output.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "temb/kernels/dtype.h"

namespace temb::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Little-endian bytes of `values` (this is an x86/ARM little-endian host).
template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(T));
}

TensorView View(int64_t rows, int64_t cols, DType dtype,
                const std::string& data) {
  TensorView view;
  view.rows = rows;
  view.cols = cols;
  view.dtype = dtype;
  view.data = data;
  return view;
}

TEST(FormatElementTest, FloatAndDoubleUseShortestSafePrecision) {
  EXPECT_EQ(FormatElement(DType::kFloat32, 0.1f), "0.100000001");
  EXPECT_EQ(FormatElement(DType::kFloat32, 1.0f), "1");
  EXPECT_EQ(FormatElement(DType::kFloat32, -2.5f), "-2.5");
  EXPECT_EQ(FormatElement(DType::kFloat64, 0.1), "0.10000000000000001");
  EXPECT_EQ(FormatElement(DType::kFloat64, 1.0 / 3), "0.33333333333333331");
  // Enough digits to read back the same value, including awkward ones.
  for (double value : {1.0 / 3, 0.1, 1e-300, 123456789.125, -2.0 / 7}) {
    const float f = static_cast<float>(value);
    EXPECT_EQ(std::strtof(FormatElement(DType::kFloat32, f).c_str(), nullptr),
              f)
        << value;
    EXPECT_EQ(
        std::strtod(FormatElement(DType::kFloat64, value).c_str(), nullptr),
        value);
  }
}

TEST(FormatElementTest, HalfTypesPrintTheirExactDecimal) {
  struct Case {
    DType dtype;
    uint16_t bits;
    const char* text;
  };
  // Expected strings: Python's decimal.Decimal of each value.
  const Case cases[] = {
      {DType::kFloat16, 0x2e66, "0.0999755859375"},
      {DType::kFloat16, 0x7bff, "65504"},
      {DType::kFloat16, 0x6400, "1024"},
      {DType::kFloat16, 0xc100, "-2.5"},
      {DType::kFloat16, 0x3555, "0.333251953125"},
      {DType::kFloat16, 0x00a8, "0.000010013580322265625"},  // 1e-5 scale
      {DType::kFloat16, 0x0001, "5.9604644775390625e-8"},    // 2^-24
      {DType::kFloat16, 0x0000, "0"},
      {DType::kBFloat16, 0x3dcd, "0.10009765625"},
      {DType::kBFloat16, 0x3eab, "0.333984375"},
      {DType::kBFloat16, 0x60ad, "9.9727710148492263424e19"},
      {DType::kBFloat16, 0x3586, "9.9837779998779296875e-7"},
      {DType::kBFloat16, 0x4780, "65536"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    const double value = c.dtype == DType::kFloat16 ? HalfToFloat(c.bits)
                                                    : BFloat16ToFloat(c.bits);
    EXPECT_EQ(FormatElement(c.dtype, value), c.text);
  }
}

// Every finite fp16 and bf16 value prints as a decimal that reads back as
// exactly that value.
TEST(FormatElementTest, EveryFiniteHalfValueReadsBackExactly) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    int checked = 0;
    for (uint32_t bits = 0; bits <= 0xffff; bits += 7) {  // a spread sample
      const double value = dtype == DType::kFloat16
                               ? HalfToFloat(static_cast<uint16_t>(bits))
                               : BFloat16ToFloat(static_cast<uint16_t>(bits));
      if (!std::isfinite(value)) continue;
      const std::string text = FormatElement(dtype, value);
      char* end = nullptr;
      const double back = std::strtod(text.c_str(), &end);
      ASSERT_EQ(*end, '\0') << text;
      ASSERT_EQ(back, value) << text << " bits 0x" << std::hex << bits;
      ASSERT_EQ(std::signbit(back), std::signbit(value)) << text;
      ++checked;
    }
    EXPECT_GT(checked, 9000);
  }
}

TEST(ElementAtTest, WidensEachDtype) {
  const std::string f32 = Bytes<float>({1.5f, -0.25f});
  EXPECT_EQ(ElementAt(View(1, 2, DType::kFloat32, f32), 1), -0.25);
  const std::string f64 = Bytes<double>({0.1, 3.0});
  EXPECT_EQ(ElementAt(View(1, 2, DType::kFloat64, f64), 0), 0.1);
  const std::string f16 = Bytes<uint16_t>({0x3c00, 0xc100});  // 1, -2.5
  EXPECT_EQ(ElementAt(View(1, 2, DType::kFloat16, f16), 1), -2.5);
  const std::string bf16 = Bytes<uint16_t>({0x3f80, 0x3dcd});  // 1, ~0.1
  EXPECT_EQ(ElementAt(View(1, 2, DType::kBFloat16, bf16), 1), 0.10009765625);
}

TEST(ToJsonTest, ExactText) {
  const std::string data = Bytes<float>({0.0f, 1.0f, -0.5f, 0.1f, 2.0f, 3.0f});
  EXPECT_EQ(ToJson(View(2, 3, DType::kFloat32, data)),
            "{\"shape\": [2, 3], \"dtype\": \"fp32\", \"data\": "
            "[0, 1, -0.5, 0.100000001, 2, 3]}\n");

  const std::string half = Bytes<uint16_t>({0x2e66, 0x7bff});
  EXPECT_EQ(ToJson(View(1, 2, DType::kFloat16, half)),
            "{\"shape\": [1, 2], \"dtype\": \"fp16\", \"data\": "
            "[0.0999755859375, 65504]}\n");

  const std::string bf = Bytes<uint16_t>({0x3f80});
  EXPECT_EQ(ToJson(View(1, 1, DType::kBFloat16, bf)),
            "{\"shape\": [1, 1], \"dtype\": \"bf16\", \"data\": [1]}\n");

  const std::string f64 = Bytes<double>({0.1});
  EXPECT_EQ(ToJson(View(1, 1, DType::kFloat64, f64)),
            "{\"shape\": [1, 1], \"dtype\": \"fp64\", \"data\": "
            "[0.10000000000000001]}\n");

  // An empty batch keeps its width in the shape.
  EXPECT_EQ(ToJson(View(0, 320, DType::kFloat32, "")),
            "{\"shape\": [0, 320], \"dtype\": \"fp32\", \"data\": []}\n");
}

// The parts of a .npy file a reader checks.
struct Npy {
  std::string magic;
  int major = 0;
  int minor = 0;
  size_t header_length = 0;
  std::string header;
  std::string data;
};

Npy SplitNpy(const std::string& file) {
  Npy npy;
  npy.magic = file.substr(0, 6);
  npy.major = static_cast<uint8_t>(file[6]);
  npy.minor = static_cast<uint8_t>(file[7]);
  npy.header_length = static_cast<uint8_t>(file[8]) |
                      (static_cast<size_t>(static_cast<uint8_t>(file[9])) << 8);
  npy.header = file.substr(10, npy.header_length);
  npy.data = file.substr(10 + npy.header_length);
  return npy;
}

TEST(ToNpyTest, HeaderAndDataPerDtype) {
  struct Case {
    DType dtype;
    const char* descr;
    std::string data;
  };
  const Case cases[] = {
      {DType::kFloat32, "<f4", Bytes<float>({1, 2, 3, 4, 5, 6})},
      {DType::kFloat16, "<f2", Bytes<uint16_t>({1, 2, 3, 4, 5, 6})},
      // NumPy has no bfloat16: raw bit patterns as uint16.
      {DType::kBFloat16, "<u2", Bytes<uint16_t>({0x3f80, 2, 3, 4, 5, 6})},
      {DType::kFloat64, "<f8", Bytes<double>({1, 2, 3, 4, 5, 6})},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.descr);
    const std::string file = ToNpy(View(2, 3, c.dtype, c.data));
    const Npy npy = SplitNpy(file);
    EXPECT_EQ(npy.magic, "\x93NUMPY");
    EXPECT_EQ(npy.major, 1);
    EXPECT_EQ(npy.minor, 0);
    // The data starts 64-byte aligned, after a newline-terminated header.
    EXPECT_EQ((10 + npy.header_length) % 64, 0u);
    ASSERT_FALSE(npy.header.empty());
    EXPECT_EQ(npy.header.back(), '\n');
    EXPECT_THAT(npy.header,
                StartsWith(std::string("{'descr': '") + c.descr +
                           "', 'fortran_order': False, 'shape': (2, 3), }"));
    // Only spaces pad the dict to the newline.
    const std::string padding = npy.header.substr(
        npy.header.find('}') + 1, npy.header.size() - npy.header.find('}') - 2);
    EXPECT_EQ(padding.find_first_not_of(' '), std::string::npos);
    EXPECT_TRUE(npy.data == c.data) << "data must be the bytes as given";
  }
}

TEST(ToNpyTest, LargeShapesStillAlign) {
  // A longer shape text moves the padding, not the alignment.
  const std::string data(static_cast<size_t>(12345) * 2 * 4, '\0');
  const Npy npy = SplitNpy(ToNpy(View(12345, 2, DType::kFloat32, data)));
  EXPECT_THAT(npy.header, HasSubstr("'shape': (12345, 2)"));
  EXPECT_EQ((10 + npy.header_length) % 64, 0u);
  EXPECT_EQ(npy.data.size(), data.size());
}

TEST(ToTableTest, NarrowRowsShowEveryColumn) {
  const std::string data = Bytes<float>({0.0f, 1.0f, 0.5f, -1.0f});
  const std::vector<float> ts = {0.0f, 999.0f};
  EXPECT_EQ(ToTable(View(2, 2, DType::kFloat32, data), ts),
            "# shape [2, 2] dtype fp32\n"
            "t=0                      0             1\n"
            "t=999                  0.5            -1\n");
}

TEST(ToTableTest, WideRowsAreElided) {
  std::vector<float> values;
  for (int i = 0; i < 10; ++i) values.push_back(static_cast<float>(i));
  const std::string data = Bytes<float>(values);
  const std::string table = ToTable(View(1, 10, DType::kFloat32, data), {});
  const std::vector<std::string> lines =
      absl::StrSplit(table, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u);
  // First 4, "...", last 4; no "t=" without timesteps.
  const std::vector<std::string> fields =
      absl::StrSplit(lines[1], ' ', absl::SkipEmpty());
  EXPECT_THAT(fields, ::testing::ElementsAre("0", "1", "2", "3", "...", "6",
                                             "7", "8", "9"));

  // Nine columns still fit: nothing elided.
  const std::string nine =
      Bytes<float>(std::vector<float>(values.begin(), values.begin() + 9));
  const std::string narrow = ToTable(View(1, 9, DType::kFloat32, nine), {});
  EXPECT_THAT(narrow, ::testing::Not(HasSubstr("...")));
  EXPECT_THAT(narrow, HasSubstr(" 4 "));
}

TEST(ToTableTest, SixSignificantDigitsAndHalfTypes) {
  const std::string data = Bytes<uint16_t>({0x3555});  // fp16 0.333251953125
  const std::vector<float> ts = {0.5f};
  EXPECT_EQ(ToTable(View(1, 1, DType::kFloat16, data), ts),
            "# shape [1, 1] dtype fp16\n"
            "t=0.5             0.333252\n");
}

}  // namespace
}  // namespace temb::cli
