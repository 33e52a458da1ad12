// Backend parity: every accelerated backend the registry can create must
// agree with the CPU backend on awkward shapes, every convention, every
// output dtype and both precisions.
//
// Both backends use the same host-computed frequency table, so they differ
// only in sin/cos: CUDA's sincosf is within 2 ulp, the CPU's within 1, hence
// a few fp32 ulp at most; fp16/bf16 within one unit of the format; repeat_only
// and the zero padding column bit-exact.  Without a usable device every test
// skips and says why (or fails, when TEMB_REQUIRE_CUDA is set).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "temb/kernels/backend.h"
#include "temb/kernels/dtype.h"
#include "temb/kernels/embedding_spec.h"
#include "temb/kernels/registry.h"

namespace temb {

// Readable parameters in test logs (gtest finds this by argument lookup).
void PrintTo(BackendChoice choice, std::ostream* os) {
  *os << (choice == BackendChoice::kCuda ? "cuda" : "other");
}

namespace {

constexpr int64_t kBatches[] = {1, 19, 989, 4096};
constexpr int kDims[] = {1, 2, 3, 15, 111, 320, 1280};
constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                             DType::kFloat64};
constexpr Precision kPrecisions[] = {Precision::kFloat32, Precision::kFloat64};
// Stop reporting after this many failing cases: one bug would otherwise
// print thousands of near-identical messages.
constexpr int kMaxReportedCases = 10;

// The registry says "...no usable CUDA device: <reason>"; keep the reason.
std::string UnusableReason(const absl::Status& status) {
  const std::string message(status.message());
  const std::string marker = "no usable CUDA device: ";
  const size_t pos = message.find(marker);
  return pos == std::string::npos ? message
                                  : message.substr(pos + marker.size());
}

// Deterministic timesteps in [-limit, limit]: first 0, fractional values and
// both extremes, then a mix of uniform reals and integers (diffusion steps).
std::vector<float> MakeTimesteps(int64_t count, double limit, uint32_t seed) {
  const double specials[] = {0.099925 * limit,
                             0.0,
                             -limit,
                             limit,
                             1.0,
                             -0.5,
                             0.125,
                             0.0261375 * limit,
                             -0.0999 * limit,
                             0.0042 * limit};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> real(-limit, limit);
  std::uniform_real_distribution<double> step(0.0, std::min(limit, 1000.0));
  std::vector<float> timesteps;
  timesteps.reserve(count);
  for (int64_t n = 0; n < count; ++n) {
    double t;
    if (n < static_cast<int64_t>(std::size(specials))) {
      t = specials[n];
    } else {
      t = n % 2 == 0 ? std::floor(step(rng)) : real(rng);
    }
    timesteps.push_back(static_cast<float>(t));
  }
  return timesteps;
}

// Halves and (even dims) interleaved layouts, both orders, shift 0 and 1,
// minus the combinations the API rejects (dim / 2 - shift == 0).
std::vector<EmbeddingSpec> Conventions(int dim) {
  std::vector<EmbeddingSpec> specs;
  for (Layout layout : {Layout::kHalves, Layout::kInterleaved}) {
    if (layout == Layout::kInterleaved && dim % 2 != 0) continue;
    for (bool flip : {false, true}) {
      for (double shift : {0.0, 1.0}) {
        if (dim / 2 > 0 && dim / 2 - shift == 0) continue;
        EmbeddingSpec spec;
        spec.dim = dim;
        spec.layout = layout;
        spec.flip_sin_to_cos = flip;
        spec.downscale_freq_shift = shift;
        specs.push_back(spec);
        // LongCat's family: the same convention with the slope first.
        if (layout == Layout::kHalves && !flip && shift == 1.0) {
          spec.exponent_order = ExponentOrder::kSlopeFirst;
          specs.push_back(spec);
        }
      }
    }
  }
  return specs;
}

// Ulps allowed between the two backends, in the format compared (see
// ComparedBits).
int64_t AllowedUlps(const EmbeddingSpec& spec) {
  if (spec.repeat_only) return 0;
  if (spec.dtype == DType::kFloat16 || spec.dtype == DType::kBFloat16) return 1;
  if (spec.precision == Precision::kFloat64) {
    // Both round a double within 2 ulp of sin/cos: one float ulp apart at
    // most, or a few double ulps for fp64 output.
    return spec.dtype == DType::kFloat64 ? 4 : 1;
  }
  return 4;  // sincosf <= 2 ulp, CPU <= 1 ulp
}

// An element as a sign-magnitude bit pattern of `width` bits in the format
// whose ulps are compared: the output format, except that fp64 outputs of
// float32 math are compared as the float they must exactly be.
struct ComparedBits {
  uint64_t bits = 0;
  int width = 0;
  bool valid = true;  // false: an fp64 output of float math is not a float
};

ComparedBits ReadCompared(const EmbeddingSpec& spec, const uint8_t* p) {
  ComparedBits out;
  switch (spec.dtype) {
    case DType::kFloat16:
    case DType::kBFloat16: {
      uint16_t v;
      std::memcpy(&v, p, sizeof v);
      out.bits = v;
      out.width = 16;
      return out;
    }
    case DType::kFloat32: {
      uint32_t v;
      std::memcpy(&v, p, sizeof v);
      out.bits = v;
      out.width = 32;
      return out;
    }
    case DType::kFloat64: {
      double d;
      std::memcpy(&d, p, sizeof d);
      if (spec.precision == Precision::kFloat64 && !spec.repeat_only) {
        std::memcpy(&out.bits, &d, sizeof d);
        out.width = 64;
        return out;
      }
      const float f = static_cast<float>(d);
      out.valid = static_cast<double>(f) == d;
      uint32_t v;
      std::memcpy(&v, &f, sizeof v);
      out.bits = v;
      out.width = 32;
      return out;
    }
  }
  return out;
}

// Maps sign-magnitude bits to integers whose difference counts ulps (+0 and
// -0 both map to 0).
int64_t Ordered(const ComparedBits& value) {
  const uint64_t sign = uint64_t{1} << (value.width - 1);
  const int64_t magnitude = static_cast<int64_t>(value.bits & (sign - 1));
  return (value.bits & sign) != 0 ? -magnitude : magnitude;
}

double Decode(DType dtype, const uint8_t* p) {
  return ElementAsDouble(p, dtype, 0);
}

bool AllZeroBytes(const uint8_t* p, size_t n) {
  return std::all_of(p, p + n, [](uint8_t b) { return b == 0; });
}

// Empty when `actual` matches `expected` (the CPU's) within tolerance;
// otherwise a count and the first few differences.
std::string Differences(const EmbeddingSpec& spec,
                        absl::Span<const float> timesteps,
                        const std::vector<uint8_t>& expected,
                        const std::vector<uint8_t>& actual) {
  const size_t size = DTypeSize(spec.dtype);
  const int64_t allowed = AllowedUlps(spec);
  const bool has_pad = !spec.repeat_only && spec.dim % 2 != 0;
  int64_t mismatches = 0;
  std::string report;
  for (size_t n = 0; n < timesteps.size(); ++n) {
    for (int j = 0; j < spec.dim; ++j) {
      const size_t offset = (n * spec.dim + j) * size;
      const uint8_t* e = expected.data() + offset;
      const uint8_t* a = actual.data() + offset;
      std::string why;
      if (has_pad && j == spec.dim - 1) {
        if (!AllZeroBytes(e, size) || !AllZeroBytes(a, size))
          why = "padding must be +0";
      } else {
        const ComparedBits ce = ReadCompared(spec, e);
        const ComparedBits ca = ReadCompared(spec, a);
        const int64_t ulps = std::abs(Ordered(ce) - Ordered(ca));
        if (!ce.valid || !ca.valid) {
          why = "fp64 output of float32 math is not a float";
        } else if (ulps > allowed) {
          why = absl::StrCat(ulps, " ulp, allowed ", allowed);
        }
      }
      if (why.empty()) continue;
      if (++mismatches <= 5) {
        absl::StrAppend(&report, "\n  row ", n, " (t=", timesteps[n], ") col ",
                        j, ": cpu=", Decode(spec.dtype, e),
                        " other=", Decode(spec.dtype, a), " (", why, ")");
      }
    }
  }
  if (mismatches == 0) return "";
  return absl::StrCat(mismatches, " element(s) differ:", report);
}

std::vector<uint8_t> ComputeWithSentinel(Backend& backend,
                                         const EmbeddingSpec& spec,
                                         absl::Span<const float> timesteps,
                                         absl::Status* status) {
  // A sentinel fill makes any element the backend forgets to write visible.
  std::vector<uint8_t> out(
      OutputBytes(spec, static_cast<int64_t>(timesteps.size())), 0xab);
  *status = backend.Compute(spec, timesteps, absl::MakeSpan(out));
  return out;
}

class BackendParityTest : public ::testing::TestWithParam<BackendChoice> {
 protected:
  void SetUp() override {
    if (GetParam() == BackendChoice::kCuda && !CudaUsable()) {
      const std::string reason =
          UnusableReason(CreateBackend(BackendChoice::kCuda).status());
      // GPU CI sets this so that a broken driver cannot pass as "skipped".
      if (std::getenv("TEMB_REQUIRE_CUDA") != nullptr) {
        FAIL()
            << "TEMB_REQUIRE_CUDA is set but there is no usable CUDA device: "
            << reason;
      }
      GTEST_SKIP() << "no usable CUDA device: " << reason;
    }
    absl::StatusOr<std::unique_ptr<Backend>> backend =
        CreateBackend(GetParam());
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
    absl::StatusOr<std::unique_ptr<Backend>> cpu =
        CreateBackend(BackendChoice::kCpu);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_ = std::move(*cpu);
  }

  // Runs one case on both backends and records a failure on mismatch.
  // Returns false once too many cases have failed, to stop the caller's loop.
  bool ExpectParity(const EmbeddingSpec& spec,
                    const std::vector<float>& timesteps) {
    ++cases_;
    const absl::Status valid = ValidateRequest(spec, timesteps, Limits());
    EXPECT_TRUE(valid.ok()) << valid << " for " << SpecDebugString(spec);
    absl::Status status;
    const std::vector<uint8_t> expected =
        ComputeWithSentinel(*cpu_, spec, timesteps, &status);
    EXPECT_TRUE(status.ok()) << "cpu: " << status;
    const std::vector<uint8_t> actual =
        ComputeWithSentinel(*backend_, spec, timesteps, &status);
    EXPECT_TRUE(status.ok()) << backend_->device() << ": " << status;
    const std::string differences =
        Differences(spec, timesteps, expected, actual);
    EXPECT_EQ(differences, "")
        << SpecDebugString(spec) << " batch=" << timesteps.size();
    if (!valid.ok() || !status.ok() || !differences.empty()) ++failed_cases_;
    return failed_cases_ < kMaxReportedCases;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Backend> cpu_;
  int cases_ = 0;
  int failed_cases_ = 0;
};

TEST_P(BackendParityTest, DescribesItsDevice) {
  EXPECT_EQ(BackendKindName(backend_->kind()),
            GetParam() == BackendChoice::kCuda ? "cuda" : "cpu");
  const std::string device = backend_->device();
  EXPECT_FALSE(device.empty());
  if (GetParam() == BackendChoice::kCuda) {
    EXPECT_NE(device.find("(sm_"), std::string::npos) << device;
  }
}

TEST_P(BackendParityTest, Fp32AllShapesLayoutsOrdersAndShifts) {
  for (int dim : kDims) {
    for (int64_t batch : kBatches) {
      const std::vector<float> timesteps =
          MakeTimesteps(batch, 1e4, 7919u * dim + batch);
      for (const EmbeddingSpec& spec : Conventions(dim)) {
        if (!ExpectParity(spec, timesteps)) return;
      }
    }
  }
  // 39 conventions over the dims (invalid shift combinations left out), for
  // each of the 4 batches: proof that the loops above really ran.
  EXPECT_EQ(cases_, 156);
}

TEST_P(BackendParityTest, EveryDTypeAndPrecision) {
  for (int dim : kDims) {
    for (int64_t batch : {int64_t{19}, int64_t{989}}) {
      const std::vector<float> timesteps =
          MakeTimesteps(batch, 1e4, 104729u * dim + batch);
      for (EmbeddingSpec spec : Conventions(dim)) {
        for (DType dtype : kDTypes) {
          for (Precision precision : kPrecisions) {
            spec.dtype = dtype;
            spec.precision = precision;
            if (!ExpectParity(spec, timesteps)) return;
          }
        }
      }
    }
  }
}

TEST_P(BackendParityTest, ScaleTimeFactorAndMaxPeriod) {
  struct Params {
    double scale;
    double time_factor;
    double max_period;
    double t_limit;  // Flux feeds t in [0, 1] and multiplies by 1000
  };
  const Params kParams[] = {
      {1.7, 1.0, 10000.0, 1e4},
      {1.0, 1000.0, 10000.0, 10.0},
      {0.25, 1000.0, 10000.0, 10.0},
      {1.0, 1.0, 100.0, 1e4},
  };
  for (const Params& p : kParams) {
    for (int dim : kDims) {
      for (int64_t batch : {int64_t{19}, int64_t{989}}) {
        const std::vector<float> timesteps =
            MakeTimesteps(batch, p.t_limit, 31u * dim + batch);
        for (EmbeddingSpec spec : Conventions(dim)) {
          // The LDM and DDPM pairings of order and shift are enough here.
          if (spec.flip_sin_to_cos == (spec.downscale_freq_shift != 0))
            continue;
          spec.scale = p.scale;
          spec.time_factor = p.time_factor;
          spec.max_period = p.max_period;
          for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
            for (Precision precision : kPrecisions) {
              spec.dtype = dtype;
              spec.precision = precision;
              if (!ExpectParity(spec, timesteps)) return;
            }
          }
        }
      }
    }
  }
}

TEST_P(BackendParityTest, RepeatOnlyIsBitExact) {
  for (int dim : kDims) {
    for (int64_t batch : kBatches) {
      const std::vector<float> timesteps =
          MakeTimesteps(batch, 1e4, 7u * dim + batch);
      EmbeddingSpec spec;
      spec.dim = dim;
      spec.repeat_only = true;
      for (DType dtype : kDTypes) {
        for (Precision precision : kPrecisions) {
          spec.dtype = dtype;
          spec.precision = precision;
          if (!ExpectParity(spec, timesteps)) return;
        }
      }
    }
  }
}

// t = 0 must give exactly [1..1, 0..0] (cos first) and a +0 pad, on the
// backend alone: no tolerance, no reference needed.
TEST_P(BackendParityTest, ZeroTimestepGivesExactOnesAndZeros) {
  const std::vector<float> zeros(5, 0.0f);
  for (int dim : {111, 320}) {
    for (DType dtype : kDTypes) {
      for (Precision precision : kPrecisions) {
        EmbeddingSpec spec;
        spec.dim = dim;
        spec.dtype = dtype;
        spec.precision = precision;
        absl::Status status;
        const std::vector<uint8_t> out =
            ComputeWithSentinel(*backend_, spec, zeros, &status);
        ASSERT_TRUE(status.ok()) << status;
        const size_t size = DTypeSize(dtype);
        for (size_t n = 0; n < zeros.size(); ++n) {
          for (int j = 0; j < dim; ++j) {
            const uint8_t* p = out.data() + (n * dim + j) * size;
            if (j < spec.half_dim()) {
              ASSERT_EQ(Decode(dtype, p), 1.0)
                  << SpecDebugString(spec) << " col " << j;
            } else {
              ASSERT_TRUE(AllZeroBytes(p, size))
                  << SpecDebugString(spec) << " col " << j;
            }
          }
        }
      }
    }
  }
}

TEST_P(BackendParityTest, EmptyBatchIsValid) {
  for (DType dtype : kDTypes) {
    EmbeddingSpec spec;
    spec.dim = 320;
    spec.dtype = dtype;
    const absl::Status status = backend_->Compute(
        spec, absl::Span<const float>(), absl::Span<uint8_t>());
    EXPECT_TRUE(status.ok()) << status;
  }
}

// Several threads computing at once (so the backend must hand each its own
// stream and buffers, and grow them) get exactly what one thread gets.
TEST_P(BackendParityTest, ConcurrentCallsGiveIdenticalResults) {
  struct Job {
    EmbeddingSpec spec;
    std::vector<float> timesteps;
    std::vector<uint8_t> serial;
  };
  std::vector<Job> jobs;
  const int kJobDims[] = {320, 1280, 111, 2, 15, 256};
  const int64_t kJobBatches[] = {19, 4096, 989, 1, 2048, 7};
  for (int k = 0; k < 12; ++k) {
    Job job;
    job.spec.dim = kJobDims[k % std::size(kJobDims)];
    job.spec.dtype = kDTypes[k % std::size(kDTypes)];
    job.spec.precision = kPrecisions[(k / 4) % 2];
    job.spec.flip_sin_to_cos = k % 3 != 0;
    job.timesteps =
        MakeTimesteps(kJobBatches[k % std::size(kJobBatches)], 1e4, 1000u + k);
    absl::Status status;
    job.serial =
        ComputeWithSentinel(*backend_, job.spec, job.timesteps, &status);
    ASSERT_TRUE(status.ok()) << status;
    jobs.push_back(std::move(job));
  }

  constexpr int kThreads = 8;
  constexpr int kRounds = 6;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<absl::Status> errors(kThreads);
  std::vector<std::thread> threads;
  for (int w = 0; w < kThreads; ++w) {
    threads.emplace_back([&, w] {
      for (int r = 0; r < kRounds; ++r) {
        for (size_t i = 0; i < jobs.size(); ++i) {
          const Job& job =
              jobs[(i * 5 + w + r) % jobs.size()];  // different orders
          absl::Status status;
          const std::vector<uint8_t> out =
              ComputeWithSentinel(*backend_, job.spec, job.timesteps, &status);
          if (!status.ok()) {
            errors[w] = status;
            return;
          }
          if (out != job.serial) ++mismatches[w];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int w = 0; w < kThreads; ++w) {
    EXPECT_TRUE(errors[w].ok()) << "thread " << w << ": " << errors[w];
    EXPECT_EQ(mismatches[w], 0) << "thread " << w;
  }
  for (const Job& job : jobs) {
    if (!ExpectParity(job.spec, job.timesteps)) return;
  }
}

// A backend that lends output memory computes the same bytes into it as into
// ordinary memory.
TEST_P(BackendParityTest, LentOutputMemoryGivesTheSameBytes) {
  EmbeddingSpec spec;
  spec.dim = 1280;
  for (int64_t batch : {int64_t{13}, int64_t{989}}) {  // 65 KiB and 4.8 MiB
    const std::vector<float> timesteps = MakeTimesteps(batch, 1e4, 77u + batch);
    const size_t bytes = OutputBytes(spec, batch);
    std::unique_ptr<HostBuffer> lent = backend_->AllocateOutput(bytes);
    if (lent == nullptr)
      GTEST_SKIP() << backend_->device() << " lends no output memory";
    ASSERT_EQ(lent->bytes().size(), bytes);
    std::fill(lent->bytes().begin(), lent->bytes().end(), 0xab);
    ASSERT_TRUE(backend_->Compute(spec, timesteps, lent->bytes()).ok());
    absl::Status status;
    const std::vector<uint8_t> ordinary =
        ComputeWithSentinel(*backend_, spec, timesteps, &status);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_TRUE(
        std::equal(ordinary.begin(), ordinary.end(), lent->bytes().begin()))
        << "batch " << batch;
  }
}

// Lent memory is bounded: past the budget the backend says no (callers then
// use ordinary memory), and memory given back serves other sizes.
TEST_P(BackendParityTest, LentOutputMemoryIsBounded) {
  constexpr size_t kLarge = size_t{64} << 20;
  std::vector<std::unique_ptr<HostBuffer>> held;
  for (int i = 0; i < 64; ++i) {  // 4 GiB asked for
    std::unique_ptr<HostBuffer> lent = backend_->AllocateOutput(kLarge);
    if (lent == nullptr) break;
    held.push_back(std::move(lent));
  }
  if (held.empty())
    GTEST_SKIP() << backend_->device() << " lends no output memory";
  EXPECT_LT(held.size(), 64u) << "lent memory has no bound";
  held.clear();
  // The kept 64 MiB buffers make room for a different size.
  EXPECT_NE(backend_->AllocateOutput(size_t{100} << 20), nullptr);
}

// --backend=auto: the same device for large outputs, the CPU below the
// threshold, each giving exactly its own bytes; a threshold of 0 keeps every
// request on the device.
TEST_P(BackendParityTest, AutoSendsSmallOutputsToTheCpu) {
  BackendOptions options;
  options.gpu_min_output_bytes = int64_t{64} << 10;
  absl::StatusOr<std::unique_ptr<Backend>> routed =
      CreateBackend(BackendChoice::kAuto, options);
  ASSERT_TRUE(routed.ok()) << routed.status();
  Backend& router = **routed;
  EXPECT_EQ(router.kind(), backend_->kind());
  EXPECT_EQ(router.KindFor(options.gpu_min_output_bytes - 1),
            BackendKind::kCpu);
  EXPECT_EQ(router.KindFor(options.gpu_min_output_bytes), backend_->kind());

  EmbeddingSpec spec;
  spec.dim = 320;
  for (int64_t batch : {int64_t{19}, int64_t{989}}) {  // 24 KiB and 1.2 MiB
    const std::vector<float> timesteps = MakeTimesteps(batch, 1e4, 31u + batch);
    absl::Status status;
    const std::vector<uint8_t> routed_out =
        ComputeWithSentinel(router, spec, timesteps, &status);
    ASSERT_TRUE(status.ok()) << status;
    Backend& expected_backend =
        OutputBytes(spec, batch) < options.gpu_min_output_bytes ? *cpu_
                                                                : *backend_;
    EXPECT_EQ(routed_out,
              ComputeWithSentinel(expected_backend, spec, timesteps, &status))
        << "batch " << batch;
  }

  options.gpu_min_output_bytes = 0;
  routed = CreateBackend(BackendChoice::kAuto, options);
  ASSERT_TRUE(routed.ok()) << routed.status();
  EXPECT_EQ((*routed)->KindFor(1), backend_->kind());
}

INSTANTIATE_TEST_SUITE_P(
    Accelerated, BackendParityTest, ::testing::Values(BackendChoice::kCuda),
    [](const ::testing::TestParamInfo<BackendChoice>& param) {
      return param.param == BackendChoice::kCuda ? std::string("cuda")
                                                 : std::string("other");
    });

}  // namespace
}  // namespace temb
