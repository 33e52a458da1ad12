// EmbedService and ResolveSpec against a fake backend that records calls.
#include "temb/core/embed_service.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "temb/core/request_observer.h"
#include "temb/v1_convert/preset_catalog.h"

namespace temb {
namespace {

using ::testing::HasSubstr;

struct Call {
  EmbeddingSpec spec;
  std::vector<float> timesteps;
  size_t out_size;
};

// Records every call and fills the output with a recognisable byte pattern.
class FakeBackend final : public Backend {
 public:
  explicit FakeBackend(std::vector<Call>* calls) : calls_(calls) {}
  BackendKind kind() const override { return BackendKind::kCuda; }
  std::string device() const override { return "fake"; }
  absl::Status Compute(const EmbeddingSpec& spec,
                       absl::Span<const float> timesteps,
                       absl::Span<uint8_t> out) override {
    calls_->push_back({spec, {timesteps.begin(), timesteps.end()}, out.size()});
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = static_cast<uint8_t>(i * 7 + 1);
    return error_;
  }
  void set_error(absl::Status error) { error_ = std::move(error); }

 private:
  std::vector<Call>* calls_;
  absl::Status error_;
};

class EmbedServiceTest : public ::testing::Test {
 protected:
  EmbedServiceTest() {
    auto backend = std::make_unique<FakeBackend>(&calls_);
    backend_ = backend.get();
    Limits limits;
    limits.max_dim = 1024;
    limits.max_batch = 16;
    limits.max_output_bytes = 16 * 1024;
    EmbedService::Options options;
    options.limits = limits;
    service_ = std::make_unique<EmbedService>(
        std::move(backend), BuiltInPresetCatalog(), std::move(options));
  }

  static SpecRequest Explicit(int dim) {
    SpecRequest request;
    request.dim = dim;
    request.flip_sin_to_cos = true;
    request.downscale_freq_shift = 0.0;
    return request;
  }
  static SpecRequest Named(const std::string& preset) {
    SpecRequest request;
    request.preset = preset;
    return request;
  }
  absl::StatusOr<EmbeddingSpec> Resolve(const SpecRequest& request) {
    return ResolveSpec(request, service_->presets(), service_->limits());
  }

  std::vector<Call> calls_;
  FakeBackend* backend_;
  std::unique_ptr<EmbedService> service_;
};

TEST_F(EmbedServiceTest, PresetGivesItsConvention) {
  auto spec = Resolve(Named("sdxl"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(*spec, BuiltInPresetCatalog().Find("sdxl")->spec);
}

TEST_F(EmbedServiceTest, PresetAcceptsItsOwnDimPrecisionAndDtype) {
  SpecRequest request = Named("sd15");
  request.dim = 320;
  request.precision = Precision::kFloat64;
  request.dtype = DType::kBFloat16;
  auto spec = Resolve(request);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->dim, 320);
  EXPECT_EQ(spec->precision, Precision::kFloat64);
  EXPECT_EQ(spec->dtype, DType::kBFloat16);
  EXPECT_TRUE(spec->flip_sin_to_cos);
}

TEST_F(EmbedServiceTest, FixedDimPresetRejectsAnotherDim) {
  SpecRequest request = Named("sd15");
  request.dim = 256;
  auto spec = Resolve(request);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("\"sd15\""));
  EXPECT_THAT(spec.status().message(), HasSubstr("dim"));
  EXPECT_THAT(spec.status().message(), HasSubstr("320"));
}

TEST_F(EmbedServiceTest, OverridableDimPreset) {
  SpecRequest request = Named("transformer");
  auto spec = Resolve(request);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->dim, 512);
  request.dim = 64;
  spec = Resolve(request);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->dim, 64);
  EXPECT_EQ(spec->layout, Layout::kInterleaved);
  // The preset's rules still apply to the caller's dim.
  request.dim = 63;
  EXPECT_EQ(Resolve(request).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(EmbedServiceTest, GenericPresetNeedsDim) {
  auto spec = Resolve(Named("ldm"));
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("\"ldm\""));
  SpecRequest request = Named("diffusers-default");
  request.dim = 7;
  spec = Resolve(request);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->flip_sin_to_cos);
  EXPECT_EQ(spec->downscale_freq_shift, 1.0);
  // H - shift == 0 is caught for the caller's dim.
  request.dim = 2;
  spec = Resolve(request);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("downscale_freq_shift"));
}

TEST_F(EmbedServiceTest, PresetRejectsConventionFieldsNamingFieldAndPreset) {
  const std::vector<std::pair<std::string, void (*)(SpecRequest&)>> cases = {
      {"max_period", [](SpecRequest& r) { r.max_period = 10000.0; }},
      {"flip_sin_to_cos", [](SpecRequest& r) { r.flip_sin_to_cos = true; }},
      {"downscale_freq_shift",
       [](SpecRequest& r) { r.downscale_freq_shift = 0.0; }},
      {"scale", [](SpecRequest& r) { r.scale = 1.0; }},
      {"time_factor", [](SpecRequest& r) { r.time_factor = 1000.0; }},
      {"repeat_only", [](SpecRequest& r) { r.repeat_only = false; }},
      {"layout", [](SpecRequest& r) { r.layout = Layout::kHalves; }},
      {"exponent_order",
       [](SpecRequest& r) { r.exponent_order = ExponentOrder::kDivideLast; }},
  };
  for (const auto& [field, set] : cases) {
    SpecRequest request = Named("flux");
    set(request);
    auto spec = Resolve(request);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument)
        << field;
    EXPECT_THAT(spec.status().message(), HasSubstr(field));
    EXPECT_THAT(spec.status().message(), HasSubstr("\"flux\""));
  }
}

TEST_F(EmbedServiceTest, UnknownPresetIsNotFound) {
  auto spec = Resolve(Named("sd99"));
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(spec.status().message(), HasSubstr("sd99"));
  EXPECT_THAT(spec.status().message(), HasSubstr("sdxl"));  // lists known ones
}

TEST_F(EmbedServiceTest, ExplicitSpecRequiresTheThreeConventionFields) {
  for (const std::string missing :
       {"dim", "flip_sin_to_cos", "downscale_freq_shift"}) {
    SpecRequest request = Explicit(8);
    if (missing == "dim") request.dim.reset();
    if (missing == "flip_sin_to_cos") request.flip_sin_to_cos.reset();
    if (missing == "downscale_freq_shift") request.downscale_freq_shift.reset();
    auto spec = Resolve(request);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(spec.status().message(), HasSubstr("missing: " + missing));
    EXPECT_THAT(spec.status().message(), HasSubstr("diffusers"));
    EXPECT_THAT(spec.status().message(), HasSubstr("preset"));
  }
}

TEST_F(EmbedServiceTest, ExplicitSpecCarriesEveryField) {
  SpecRequest request = Explicit(6);
  request.flip_sin_to_cos = false;
  request.downscale_freq_shift = 1.0;
  request.max_period = 100.0;
  request.scale = 2.0;
  request.time_factor = 3.0;
  request.repeat_only = false;
  request.layout = Layout::kInterleaved;
  request.precision = Precision::kFloat64;
  request.dtype = DType::kFloat16;
  auto spec = Resolve(request);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EmbeddingSpec expected;
  expected.dim = 6;
  expected.flip_sin_to_cos = false;
  expected.downscale_freq_shift = 1.0;
  expected.max_period = 100.0;
  expected.scale = 2.0;
  expected.time_factor = 3.0;
  expected.layout = Layout::kInterleaved;
  expected.precision = Precision::kFloat64;
  expected.dtype = DType::kFloat16;
  EXPECT_EQ(*spec, expected);
}

TEST_F(EmbedServiceTest, ExplicitDefaultsAreEmbeddingSpecDefaults) {
  auto spec = Resolve(Explicit(8));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EmbeddingSpec expected;
  expected.dim = 8;
  EXPECT_EQ(*spec, expected);
}

TEST_F(EmbedServiceTest, DimLimits) {
  EXPECT_EQ(Resolve(Explicit(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto too_wide = Resolve(Explicit(1025));
  EXPECT_EQ(too_wide.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(too_wide.status().message(), HasSubstr("1024"));
  SpecRequest request = Named("transformer");  // default 512 fits
  request.dim = 2048;
  EXPECT_EQ(Resolve(request).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(EmbedServiceTest, EmbedReturnsWhatTheBackendWroteWithTheRightSize) {
  const std::vector<float> timesteps = {0.0f, 1.5f, 999.0f};
  for (DType dtype :
       {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    calls_.clear();
    SpecRequest request = Named("dit");
    request.dtype = dtype;
    auto embedding = service_->Embed(request, timesteps);
    ASSERT_TRUE(embedding.ok()) << embedding.status();
    const size_t expected_bytes = 3 * 256 * DTypeSize(dtype);
    EXPECT_EQ(embedding->data.size(), expected_bytes);
    EXPECT_EQ(embedding->rows, 3);
    EXPECT_EQ(embedding->spec.dim, 256);
    EXPECT_EQ(embedding->spec.dtype, dtype);
    EXPECT_EQ(embedding->backend, BackendKind::kCuda);
    ASSERT_EQ(calls_.size(), 1u);
    EXPECT_EQ(calls_[0].out_size, expected_bytes);
    EXPECT_EQ(calls_[0].timesteps, timesteps);
    EXPECT_EQ(calls_[0].spec, embedding->spec);
    for (size_t i = 0; i < expected_bytes; ++i) {
      ASSERT_EQ(static_cast<uint8_t>(embedding->data[i]),
                static_cast<uint8_t>(i * 7 + 1));
    }
  }
}

// repeat_only copies t: only dim is needed.
TEST_F(EmbedServiceTest, RepeatOnlyNeedsOnlyDim) {
  SpecRequest request;
  request.dim = 4;
  request.repeat_only = true;
  auto spec = Resolve(request);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->repeat_only);
  EXPECT_EQ(spec->dim, 4);
}

// timestep_dtype: the backend computes the bf16 pipeline's timesteps with
// time_factor 1; the caller sees the spec it asked for.
TEST_F(EmbedServiceTest, TimestepDTypeGivesTheBackendThePipelinesTimesteps) {
  SpecRequest request = Named("flux");
  request.timestep_dtype = DType::kBFloat16;
  request.dtype = DType::kBFloat16;
  const std::vector<float> sigmas = {0.8929f, 1.0f};
  auto embedding = service_->Embed(request, sigmas);
  ASSERT_TRUE(embedding.ok()) << embedding.status();
  EXPECT_EQ(embedding->spec.time_factor, 1000.0);
  EXPECT_EQ(embedding->spec.timestep_dtype, DType::kBFloat16);
  ASSERT_EQ(calls_.size(), 1u);
  EXPECT_EQ(calls_[0].timesteps, (std::vector<float>{896.0f, 1000.0f}));
  EXPECT_EQ(calls_[0].spec.time_factor, 1.0);
  EXPECT_EQ(calls_[0].spec.timestep_dtype, DType::kFloat32);

  request.timestep_dtype = DType::kFloat16;
  const std::vector<float> too_large = {70.0f};
  auto refused = service_->Embed(request, too_large);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("overflows timestep_dtype"));
}

TEST_F(EmbedServiceTest, EmptyBatchIsValidAndEmpty) {
  auto embedding = service_->Embed(Named("sd15"), {});
  ASSERT_TRUE(embedding.ok()) << embedding.status();
  EXPECT_EQ(embedding->rows, 0);
  EXPECT_TRUE(embedding->data.empty());
}

TEST_F(EmbedServiceTest, InvalidRequestsNeverReachTheBackend) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> one = {1.0f};
  struct Case {
    SpecRequest request;
    std::vector<float> timesteps;
    absl::StatusCode code;
    std::string message;
  };
  SpecRequest wide = Explicit(1024);
  wide.dtype = DType::kFloat64;  // 8 KiB per row: 3 rows exceed 16 KiB
  SpecRequest conflicting = Named("sdxl");
  conflicting.scale = 2.0;
  const std::vector<Case> cases = {
      {Named("nope"), one, absl::StatusCode::kNotFound, "nope"},
      {conflicting, one, absl::StatusCode::kInvalidArgument, "scale"},
      {Explicit(-1), one, absl::StatusCode::kInvalidArgument, "dim"},
      {Explicit(8),
       {1.0f, nan},
       absl::StatusCode::kInvalidArgument,
       "timesteps[1]"},
      {Explicit(8), std::vector<float>(17, 1.0f),
       absl::StatusCode::kResourceExhausted, "batch"},
      {wide,
       {1.0f, 2.0f, 3.0f},
       absl::StatusCode::kResourceExhausted,
       "output size"},
  };
  for (const Case& c : cases) {
    auto embedding = service_->Embed(c.request, c.timesteps);
    EXPECT_EQ(embedding.status().code(), c.code) << embedding.status();
    EXPECT_THAT(embedding.status().message(), HasSubstr(c.message));
  }
  EXPECT_TRUE(calls_.empty());
}

TEST_F(EmbedServiceTest, BackendErrorsPropagate) {
  backend_->set_error(absl::UnavailableError("device lost"));
  auto embedding = service_->Embed(Named("sd15"), std::vector<float>{1.0f});
  EXPECT_EQ(embedding.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(embedding.status().message(), HasSubstr("device lost"));
}

// ---- Serve: a whole request, the one call of every frontend ---------------

RequestPart Part(std::string name, const std::vector<float>& timesteps,
                 int index) {
  RequestPart part;
  part.name = std::move(name);
  part.field = absl::StrCat("parts[", index, "]");
  part.timesteps = timesteps;
  return part;
}

TEST_F(EmbedServiceTest, ServeAnswersFluxTimestepAndGuidanceFromItsPreset) {
  const std::vector<float> t = {0.5f, 0.25f};
  const std::vector<float> g = {3.5f};
  Request request;
  request.spec = Named("flux");
  request.parts = {Part("timestep", t, 0), Part("guidance", g, 1)};
  absl::StatusOr<Response> response = service_->Serve(request);
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->parts.size(), 2u);
  EXPECT_EQ(response->parts[0].name, "timestep");
  EXPECT_EQ(response->parts[1].name, "guidance");
  EXPECT_THAT(response->parts[0].shape, ::testing::ElementsAre(2, 256));
  EXPECT_THAT(response->parts[1].shape, ::testing::ElementsAre(1, 256));
  EXPECT_EQ(response->rows, 3);
  EXPECT_EQ(response->output_bytes, 3 * 256 * 4);
  // Each part computed with its own convention: flux's parts scale t.
  ASSERT_EQ(calls_.size(), 2u);
  EXPECT_EQ(calls_[0].spec.time_factor, 1000.0);
  EXPECT_EQ(response->parts[1].embedding.data.size(), 256u * 4);
}

TEST_F(EmbedServiceTest, ServeOfOneEmbeddingUsesTheRequestsSpecAndShape) {
  const std::vector<float> t = {1, 2, 3, 4, 5, 6};
  const std::vector<int64_t> shape = {2, 3};
  Request request;
  request.spec = Explicit(8);
  request.named_parts = false;
  RequestPart whole;
  whole.timesteps = t;
  whole.timesteps_shape = shape;
  request.parts.push_back(whole);
  absl::StatusOr<Response> response = service_->Serve(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_THAT(response->parts[0].shape, ::testing::ElementsAre(2, 3, 8));
  // An unnamed request's errors are not prefixed; its shape field is bare.
  const std::vector<int64_t> wrong = {4, 2};
  request.parts[0].timesteps_shape = wrong;
  EXPECT_THAT(std::string(service_->Serve(request).status().message()),
              ::testing::StartsWith("timesteps_shape"));
  request.parts[0].timesteps_shape = {};
  request.spec = Explicit(4096);
  absl::Status status = service_->Serve(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(status.message()), ::testing::StartsWith("dim"));
}

TEST_F(EmbedServiceTest, ServeNamesTheFailingPartAndKeepsTheCode) {
  const std::vector<float> t = {1.0f};
  Request request;
  request.spec = Named("flux");
  request.parts = {Part("timestep", t, 0), Part("guidance", t, 1)};
  request.parts[1].spec.dim = 100000;
  const absl::Status status = service_->Serve(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              ::testing::StartsWith("parts[1] (\"guidance\"): "));
}

TEST_F(EmbedServiceTest, ServeEnforcesEveryRequestLimitBeforeComputing) {
  const std::vector<float> t = {1.0f};
  Request request;
  request.spec = Named("sd15");
  const std::string long_id(kMaxRequestIdBytes + 1, 'r');
  request.request_id = long_id;
  request.request_id_field = "id";
  request.parts = {Part("a", t, 0)};
  EXPECT_THAT(service_->Serve(request).status().message(),
              HasSubstr("id must be at most 1024 bytes, got 1025"));
  request.request_id = "";

  request.parts.clear();
  for (int i = 0; i <= kMaxParts; ++i) {
    request.parts.push_back(Part(absl::StrCat("p", i), t, i));
  }
  request.parts_field = "inputs";
  EXPECT_THAT(service_->Serve(request).status().message(),
              HasSubstr("inputs must hold at most 64, got 65"));

  request.parts = {Part(std::string(kMaxPartNameBytes + 1, 'n'), t, 0)};
  EXPECT_THAT(service_->Serve(request).status().message(),
              HasSubstr("parts[0].name must be at most 256 bytes"));

  // Names that differ only in case are one part given twice.
  request.parts = {Part("guidance", t, 0), Part("timestep", t, 1),
                   Part("GUIDANCE", t, 2)};
  const absl::Status twice = service_->Serve(request).status();
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(twice.message(),
              HasSubstr("parts[2].name: part \"GUIDANCE\" given twice (as "
                        "parts[0])"));
  EXPECT_TRUE(calls_.empty());
}

TEST_F(EmbedServiceTest, ServeRefusesAnAnswerOverMaxOutputBytesAsAWhole) {
  // Each part is 12 KiB, under the 16 KiB limit; the two together are not.
  const std::vector<float> t(12, 1.0f);
  Request request;
  request.spec = Explicit(256);
  request.parts = {Part("a", t, 0), Part("b", t, 1)};
  request.parts[0].spec = Explicit(256);
  request.parts[1].spec = Explicit(256);
  const absl::Status status = service_->Serve(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(),
              HasSubstr("the parts' outputs together must be <= 16384 bytes "
                        "(max_output_bytes), got 24576 up to parts[1]"));
}

TEST_F(EmbedServiceTest, ServeWritesEachPartWhereItsAllocatorSays) {
  class Recording final : public OutputAllocator {
   public:
    absl::Span<uint8_t> Allocate(size_t bytes) override {
      memory.resize(bytes);
      return absl::MakeSpan(memory);
    }
    void Adopt(std::unique_ptr<HostBuffer>) override {}
    std::vector<uint8_t> memory;
  };
  const std::vector<float> t = {1.0f, 2.0f};
  Request request;
  request.spec = Named("flux");
  request.parts = {Part("timestep", t, 0), Part("guidance", t, 1)};
  Recording first;
  OutputAllocator* const outputs[] = {&first, nullptr};
  absl::StatusOr<Response> response =
      service_->Serve(request, nullptr, outputs);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(first.memory.size(), 2u * 256 * 4);
  EXPECT_TRUE(response->parts[0].embedding.data.empty());
  EXPECT_EQ(response->parts[1].embedding.data.size(), 2u * 256 * 4);
  OutputAllocator* const too_few[] = {&first};
  EXPECT_EQ(service_->Serve(request, nullptr, too_few).status().code(),
            absl::StatusCode::kInternal);
}

class RecordingObserver final : public RequestObserver {
 public:
  void OnStart(absl::string_view method) override {
    starts.emplace_back(method);
  }
  void OnFinish(const RequestRecord& record) override {
    finishes.push_back({std::string(record.method), record.status->code(),
                        record.batch, record.output_bytes,
                        std::string(record.request_id)});
    EXPECT_GE(record.latency_seconds, 0.0);
  }
  struct Finish {
    std::string method;
    absl::StatusCode code;
    int64_t batch;
    int64_t bytes;
    std::string request_id;
  };
  std::vector<std::string> starts;
  std::vector<Finish> finishes;
};

TEST(RequestTimerTest, ReportsOnceWithTheOutcome) {
  RecordingObserver observer;
  {
    RequestTimer timer(&observer, "Embed");
    timer.Finish(absl::OkStatus(), 4, 1024, "r1");
  }
  { RequestTimer abandoned(&observer, "EmbedStream"); }
  ASSERT_EQ(observer.starts.size(), 2u);
  ASSERT_EQ(observer.finishes.size(), 2u);
  EXPECT_EQ(observer.finishes[0].method, "Embed");
  EXPECT_EQ(observer.finishes[0].code, absl::StatusCode::kOk);
  EXPECT_EQ(observer.finishes[0].batch, 4);
  EXPECT_EQ(observer.finishes[0].bytes, 1024);
  EXPECT_EQ(observer.finishes[0].request_id, "r1");
  EXPECT_EQ(observer.finishes[1].method, "EmbedStream");
  EXPECT_EQ(observer.finishes[1].code, absl::StatusCode::kUnknown);
}

TEST(RequestTimerTest, ObserverListForwardsToAll) {
  RecordingObserver a, b;
  ObserverList list({&a, &b});
  RequestTimer(&list, "Embed").Finish(absl::NotFoundError("x"));
  EXPECT_EQ(a.finishes.size(), 1u);
  EXPECT_EQ(b.finishes.size(), 1u);
  EXPECT_EQ(b.finishes[0].code, absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace temb
