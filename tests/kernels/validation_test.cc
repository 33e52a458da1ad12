// Every input the kernels refuse: the status code and the exact message
// (callers and logs rely on both), plus the edge cases that are accepted.
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "temb/kernels/embedding_spec.h"
#include "temb/kernels/frequencies.h"

namespace temb {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

EmbeddingSpec Spec(int dim) {
  EmbeddingSpec spec;
  spec.dim = dim;
  return spec;
}

void ExpectError(const absl::Status& status, absl::StatusCode code,
                 const std::string& message) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_EQ(std::string(status.message()), message);
}

TEST(ValidationTest, DimRange) {
  ExpectError(ValidateSpec(Spec(0), Limits()),
              absl::StatusCode::kInvalidArgument,
              "dim must be in [1, 16384], got 0");
  ExpectError(ValidateSpec(Spec(-3), Limits()),
              absl::StatusCode::kInvalidArgument,
              "dim must be in [1, 16384], got -3");
  ExpectError(ValidateSpec(Spec(16385), Limits()),
              absl::StatusCode::kResourceExhausted,
              "dim must be in [1, 16384], got 16385");
  Limits small;
  small.max_dim = 64;
  ExpectError(ValidateSpec(Spec(65), small),
              absl::StatusCode::kResourceExhausted,
              "dim must be in [1, 64], got 65");
  EXPECT_TRUE(ValidateSpec(Spec(1), Limits()).ok());
  EXPECT_TRUE(ValidateSpec(Spec(16384), Limits()).ok());
}

TEST(ValidationTest, ShiftThatZeroesTheDivisor) {
  for (int dim : {2, 3}) {
    EmbeddingSpec spec = Spec(dim);
    spec.downscale_freq_shift = 1.0;
    ExpectError(
        ValidateSpec(spec, Limits()), absl::StatusCode::kInvalidArgument,
        "dim / 2 - downscale_freq_shift must be non-zero (it divides the "
        "frequency exponent), got dim=" +
            std::to_string(dim) + " downscale_freq_shift=1");
  }
  EmbeddingSpec ddpm = Spec(4);
  ddpm.downscale_freq_shift = 1.0;
  EXPECT_TRUE(ValidateSpec(ddpm, Limits()).ok());
  EmbeddingSpec one = Spec(1);  // no frequencies at all: one zero column
  one.downscale_freq_shift = 1.0;
  EXPECT_TRUE(ValidateSpec(one, Limits()).ok());
}

TEST(ValidationTest, MaxPeriod) {
  for (double p : {0.0, -1.0}) {
    EmbeddingSpec spec = Spec(8);
    spec.max_period = p;
    ExpectError(ValidateSpec(spec, Limits()),
                absl::StatusCode::kInvalidArgument,
                std::string("max_period must be finite and > 0, got ") +
                    (p == 0 ? "0" : "-1"));
  }
  EmbeddingSpec spec = Spec(8);
  spec.max_period = std::nan("");
  ExpectError(ValidateSpec(spec, Limits()), absl::StatusCode::kInvalidArgument,
              "max_period must be finite and > 0, got nan");
  spec.max_period = std::numeric_limits<double>::infinity();
  ExpectError(ValidateSpec(spec, Limits()), absl::StatusCode::kInvalidArgument,
              "max_period must be finite and > 0, got inf");
  spec.repeat_only = true;  // repeat_only uses no frequency parameter
  EXPECT_TRUE(ValidateSpec(spec, Limits()).ok());
}

TEST(ValidationTest, NonFiniteParameters) {
  EmbeddingSpec spec = Spec(8);
  spec.downscale_freq_shift = std::nan("");
  ExpectError(ValidateSpec(spec, Limits()), absl::StatusCode::kInvalidArgument,
              "downscale_freq_shift must be finite, got nan");
  spec = Spec(8);
  spec.scale = -std::numeric_limits<double>::infinity();
  ExpectError(ValidateSpec(spec, Limits()), absl::StatusCode::kInvalidArgument,
              "scale must be finite, got -inf");
  spec = Spec(8);
  spec.time_factor = std::nan("");
  ExpectError(ValidateSpec(spec, Limits()), absl::StatusCode::kInvalidArgument,
              "time_factor must be finite, got nan");
}

TEST(ValidationTest, OddDimInterleaved) {
  EmbeddingSpec spec = Spec(7);
  spec.layout = Layout::kInterleaved;
  ExpectError(ValidateSpec(spec, Limits()), absl::StatusCode::kInvalidArgument,
              "dim must be even with layout=interleaved, got 7");
  spec.dim = 8;
  EXPECT_TRUE(ValidateSpec(spec, Limits()).ok());
}

TEST(ValidationTest, FrequencyOverflow) {
  EmbeddingSpec spec = Spec(4);
  spec.max_period = 1e-300;  // -ln(1e-300) * 1 / 2 = 345 > 88: frequencies grow
  ExpectError(ValidateSpec(spec, Limits()), absl::StatusCode::kInvalidArgument,
              "frequencies overflow: -ln(max_period) * (dim/2 - 1) / (dim/2 - "
              "downscale_freq_shift) must be <= 88, got 345.387764");
  spec = Spec(16);
  spec.downscale_freq_shift = 8.5;  // a negative divisor: growing too
  EXPECT_EQ(ValidateSpec(spec, Limits()).code(),
            absl::StatusCode::kInvalidArgument);
  spec = Spec(4);
  spec.max_period = 1e-30;  // 69 / 2: fine
  EXPECT_TRUE(ValidateSpec(spec, Limits()).ok());
}

// Decaying frequencies that underflow float32 are finite (tiny or zero), and
// diffusers computes them: so does temb (dim 16, shift 7.5: exp(-129)).
TEST(ValidationTest, UnderflowingFrequenciesAreComputed) {
  EmbeddingSpec spec = Spec(16);
  spec.downscale_freq_shift = 7.5;
  EXPECT_TRUE(ValidateSpec(spec, Limits()).ok());
  spec = Spec(4);
  spec.max_period = 1e300;  // exp(-345)
  EXPECT_TRUE(ValidateSpec(spec, Limits()).ok());
  const std::vector<float> t = {999.0f};
  EXPECT_TRUE(ValidateTimesteps(spec, t, Limits()).ok());
}

// A bf16 pipeline: sigma 0.8929 becomes bf16 0.89453125, times 1000 in
// float32 is 894.53125, rounded to bf16 is 896 (not 892.9).
TEST(ValidationTest, PipelineTimestepsRoundInTheirDType) {
  EmbeddingSpec spec = Spec(8);
  spec.time_factor = 1000;
  spec.timestep_dtype = DType::kBFloat16;
  std::vector<float> t = {0.8929f, 0.0f, -0.25f};
  ASSERT_TRUE(PipelineTimesteps(&spec, absl::MakeSpan(t)).ok());
  EXPECT_EQ(t, (std::vector<float>{896.0f, 0.0f, -250.0f}));
  EXPECT_EQ(spec.time_factor, 1.0);
  EXPECT_EQ(spec.timestep_dtype, DType::kFloat32);

  spec.time_factor = 1000;
  spec.timestep_dtype = DType::kFloat16;
  t = {0.8929f};  // fp16 0.89306640625 * 1000 = 893.0664 -> 893
  ASSERT_TRUE(PipelineTimesteps(&spec, absl::MakeSpan(t)).ok());
  EXPECT_EQ(t[0], 893.0f);

  spec.time_factor = 1000;
  spec.timestep_dtype = DType::kFloat16;
  t = {1.0f, 70.0f};  // 70000 > 65504
  ExpectError(PipelineTimesteps(&spec, absl::MakeSpan(t)),
              absl::StatusCode::kInvalidArgument,
              "timesteps[1] = 70 times time_factor 1000 overflows "
              "timestep_dtype fp16 (largest finite 65504)");

  // repeat_only copies t and never applies time_factor: t is only rounded.
  spec = Spec(8);
  spec.repeat_only = true;
  spec.time_factor = 1000;
  spec.timestep_dtype = DType::kFloat16;
  t = {0.8929f, 2.2e-38f};
  ASSERT_TRUE(PipelineTimesteps(&spec, absl::MakeSpan(t)).ok());
  EXPECT_EQ(t, (std::vector<float>{0.89306640625f, 0.0f}));
  EXPECT_EQ(spec.time_factor, 1000.0);

  spec = Spec(8);  // fp32: untouched
  t = {0.8929f};
  ASSERT_TRUE(PipelineTimesteps(&spec, absl::MakeSpan(t)).ok());
  EXPECT_EQ(t[0], 0.8929f);

  spec.timestep_dtype = DType::kFloat64;
  EXPECT_EQ(ValidateSpec(spec, Limits()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ValidationTest, NonFiniteTimestepsNameTheIndex) {
  const EmbeddingSpec spec = Spec(8);
  ExpectError(
      ValidateTimesteps(spec, std::vector<float>{0, 1, 2, kNan}, Limits()),
      absl::StatusCode::kInvalidArgument,
      "timesteps[3] must be finite, got nan");
  ExpectError(ValidateTimesteps(spec, std::vector<float>{kInf}, Limits()),
              absl::StatusCode::kInvalidArgument,
              "timesteps[0] must be finite, got inf");
  ExpectError(
      ValidateTimesteps(spec, std::vector<float>{5, -kInf, kNan}, Limits()),
      absl::StatusCode::kInvalidArgument,
      "timesteps[1] must be finite, got -inf");
  EmbeddingSpec repeat = spec;
  repeat.repeat_only = true;
  EXPECT_EQ(
      ValidateTimesteps(repeat, std::vector<float>{kNan}, Limits()).code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(ValidationTest, AngleOverflow) {
  EmbeddingSpec spec = Spec(8);
  spec.scale = 10.0;
  ExpectError(
      ValidateTimesteps(spec, std::vector<float>{1.0f, -3e38f, 2.0f}, Limits()),
      absl::StatusCode::kInvalidArgument,
      "timesteps[1] = -3.00000001e+38 overflows the angle time_factor * t * "
      "frequency * scale (time_factor=1, scale=10)");
  spec.scale = 1.0;
  spec.time_factor = 1000.0;
  EXPECT_EQ(ValidateTimesteps(spec, std::vector<float>{1e36f}, Limits()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      ValidateTimesteps(spec, std::vector<float>{1e34f}, Limits()).ok());
  spec.precision = Precision::kFloat64;
  spec.time_factor = 1e300;
  EXPECT_EQ(ValidateTimesteps(spec, std::vector<float>{1e10f}, Limits()).code(),
            absl::StatusCode::kInvalidArgument);
}

// The angle check bounds the largest frequency from the table's two ends;
// that must be the table's maximum whichever way the exponent runs
// (max_period below 1, or a shift beyond dim/2, makes it grow with i).
TEST(ValidationTest, LargestFrequencyIsTheTableMaximum) {
  struct Case {
    int dim;
    double max_period;
    double shift;
  };
  for (const Case& c :
       {Case{320, 10000, 0}, Case{321, 10000, 1}, Case{2, 10000, 0},
        Case{256, 0.01, 0}, Case{64, 10000, 40}, Case{64, 0.5, 40.5}}) {
    EmbeddingSpec spec = Spec(c.dim);
    spec.max_period = c.max_period;
    spec.downscale_freq_shift = c.shift;
    ASSERT_TRUE(ValidateSpec(spec, Limits()).ok()) << spec.dim;
    float max32 = 0;
    for (float f : Float32Frequencies(spec)) max32 = std::fmax(max32, f);
    double max64 = 0;
    for (double f : Float64Frequencies(spec)) max64 = std::fmax(max64, f);
    EXPECT_EQ(Float32LargestFrequency(spec), max32) << c.dim << " " << c.shift;
    EXPECT_EQ(Float64LargestFrequency(spec), max64) << c.dim << " " << c.shift;
  }
}

TEST(ValidationTest, BatchAndOutputLimits) {
  Limits limits;
  limits.max_batch = 4;
  const EmbeddingSpec spec = Spec(8);
  ExpectError(ValidateTimesteps(spec, std::vector<float>(5, 1.0f), limits),
              absl::StatusCode::kResourceExhausted,
              "batch size (number of timesteps) must be <= 4, got 5");
  EXPECT_TRUE(
      ValidateTimesteps(spec, std::vector<float>(4, 1.0f), limits).ok());

  Limits bytes;
  bytes.max_output_bytes = 100;
  ExpectError(
      ValidateTimesteps(Spec(32), std::vector<float>{1.0f}, bytes),
      absl::StatusCode::kResourceExhausted,
      "output size (batch * dim * dtype bytes) must be <= 100 bytes, got 128");
  EmbeddingSpec half = Spec(32);
  half.dtype = DType::kFloat16;  // 64 bytes fit
  EXPECT_TRUE(ValidateTimesteps(half, std::vector<float>{1.0f}, bytes).ok());
}

TEST(ValidationTest, RepeatOnlyValueMustFitTheDType) {
  EmbeddingSpec spec = Spec(4);
  spec.repeat_only = true;
  spec.dtype = DType::kFloat16;
  ExpectError(
      ValidateTimesteps(spec, std::vector<float>{1.0f, 70000.0f}, Limits()),
      absl::StatusCode::kInvalidArgument,
      "timesteps[1] = 70000 is not representable in dtype fp16 (repeat_only "
      "copies timesteps into the output)");
  EXPECT_TRUE(
      ValidateTimesteps(spec, std::vector<float>{65504.0f, -65519.0f}, Limits())
          .ok());
  spec.dtype = DType::kBFloat16;
  EXPECT_TRUE(
      ValidateTimesteps(spec, std::vector<float>{70000.0f}, Limits()).ok());
  EXPECT_EQ(
      ValidateTimesteps(spec, std::vector<float>{3.4e38f}, Limits()).code(),
      absl::StatusCode::kInvalidArgument);
  spec.dtype = DType::kFloat32;
  EXPECT_TRUE(
      ValidateTimesteps(spec, std::vector<float>{3.4e38f}, Limits()).ok());
}

TEST(ValidationTest, AcceptedEdgeCases) {
  EXPECT_TRUE(ValidateRequest(Spec(8), {}, Limits()).ok());  // empty batch
  EXPECT_TRUE(
      ValidateRequest(Spec(1), std::vector<float>{3.0f}, Limits()).ok());
  EXPECT_TRUE(
      ValidateRequest(Spec(7), std::vector<float>{-1e4f, 0.5f}, Limits()).ok());
  // ValidateRequest checks the spec first.
  EXPECT_EQ(
      ValidateRequest(Spec(0), std::vector<float>{kNan}, Limits()).message(),
      "dim must be in [1, 16384], got 0");
}

TEST(ValidationTest, OutputBytesSaturates) {
  EXPECT_EQ(OutputBytes(Spec(320), 2), 2560);
  EXPECT_EQ(OutputBytes(Spec(320), 0), 0);
  EXPECT_EQ(OutputBytes(Spec(16384), std::numeric_limits<int64_t>::max() / 2),
            std::numeric_limits<int64_t>::max());
}

}  // namespace
}  // namespace temb

namespace temb {
namespace {

// A spec's own frequency table replaces the formula: dim / 2 finite values.
TEST(ValidationTest, FrequencyTables) {
  EmbeddingSpec spec = Spec(8);
  spec.frequencies = std::make_shared<const std::vector<double>>(
      std::vector<double>{1.0, 0.5, -2.0});
  ExpectError(ValidateSpec(spec, Limits()), absl::StatusCode::kInvalidArgument,
              "frequencies must hold dim / 2 = 4 values, got 3");
  spec.frequencies = std::make_shared<const std::vector<double>>(
      std::vector<double>{1.0, 0.5, -2.0, 1e300});
  ExpectError(ValidateSpec(spec, Limits()), absl::StatusCode::kInvalidArgument,
              "frequencies[3] must be finite, got 1e+300");
  spec.precision = Precision::kFloat64;  // finite as a double
  EXPECT_TRUE(ValidateSpec(spec, Limits()).ok());
  spec.precision = Precision::kFloat32;
  spec.frequencies = std::make_shared<const std::vector<double>>(
      std::vector<double>{1.0, 0.5, -2.0, 3.0});
  spec.max_period = -1;  // plays no part with a table
  EXPECT_TRUE(ValidateSpec(spec, Limits()).ok());
  EXPECT_EQ(Float32Frequencies(spec), (std::vector<float>{1, 0.5, -2, 3}));
  EXPECT_EQ(Float32LargestFrequency(spec), 3.0f);
  // The angle check uses the largest magnitude: |-2| * t overflows first
  // only if it is the largest; here 3 * 2e38 does.
  const std::vector<float> t = {2e38f};
  EXPECT_EQ(ValidateTimesteps(spec, t, Limits()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ValidationTest, LogSpacedFrequenciesSpanTheirEnds) {
  const std::vector<double> table = LogSpacedFrequencies(128, 0.5, 10000.0);
  ASSERT_EQ(table.size(), 128u);
  EXPECT_NEAR(table.front(), 0.5, 1e-7);
  EXPECT_NEAR(table.back(), 10000.0, 1e-2);
  for (size_t i = 1; i < table.size(); ++i) {
    EXPECT_GT(table[i], table[i - 1]);  // ascending
    // Each step multiplies by (1e4 / 0.5)^(1/127) = 1.0811 (float32 ramp).
    EXPECT_NEAR(table[i] / table[i - 1], 1.08113, 1e-4);
  }
}

}  // namespace
}  // namespace temb
