// Fuzzes the kernels API directly: an EmbeddingSpec and timesteps built from
// raw bytes -> ValidateRequest -> Compute on one of the CPU engines.
//
// Input layout (little-endian; fuzz/make_kernel_seeds.py writes seeds):
//   int16   dim
//   uint8   flags: bit 0 flip_sin_to_cos, bit 1 repeat_only,
//                  bit 2 interleaved layout, bit 3 fp64 precision,
//                  bits 4-5 dtype (DType value), bits 6-7 CPU engine
//                  (index into SupportedCpuIsas(), modulo its size)
//   uint8   more flags: bit 0 slope-first exponent order
//   double  max_period, downscale_freq_shift, scale, time_factor
//   float   timesteps[] (the rest; a trailing partial float is ignored)
//
// Valid requests must compute without error and satisfy CheckEmbedding;
// fp64-precision results must be byte-identical to the scalar engine's
// (cpu_backend.h promises that every engine agrees exactly there).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "embedding_checks.h"
#include "temb/kernels/cpu_backend.h"
#include "temb/kernels/embedding_spec.h"

namespace temb::fuzz {
namespace {

constexpr size_t kHeaderBytes = 2 + 1 + 1 + 4 * 8;

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  template <typename T>
  T Next() {
    T value;
    std::memcpy(&value, data_ + offset_, sizeof value);
    offset_ += sizeof value;
    return value;
  }
  size_t remaining() const { return size_ - offset_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t offset_ = 0;
};

// One backend per engine, created once: two threads so that large requests
// take the parallel path too.
const std::vector<std::unique_ptr<Backend>>& Engines() {
  static const auto* engines = [] {
    auto* list = new std::vector<std::unique_ptr<Backend>>();
    for (CpuIsa isa : SupportedCpuIsas()) {
      auto backend = CreateCpuBackendForIsa(isa, /*threads=*/2);
      TEMB_FUZZ_CHECK(backend.ok(), backend.status().ToString());
      list->push_back(*std::move(backend));
    }
    return list;
  }();
  return *engines;
}

std::string Compute(Backend& backend, const EmbeddingSpec& spec,
                    const std::vector<float>& timesteps) {
  std::string out(static_cast<size_t>(OutputBytes(spec, timesteps.size())),
                  '\0');
  const absl::Status status = backend.Compute(
      spec, timesteps,
      absl::MakeSpan(reinterpret_cast<uint8_t*>(out.data()), out.size()));
  TEMB_FUZZ_CHECK(
      status.ok(),
      absl::StrCat("Compute failed on a valid request: ", status.ToString(),
                   " for ", SpecDebugString(spec)));
  return out;
}

void Run(const uint8_t* data, size_t size) {
  if (size < kHeaderBytes) return;
  Reader in(data, size);
  EmbeddingSpec spec;
  spec.dim = in.Next<int16_t>();
  const uint8_t flags = in.Next<uint8_t>();
  spec.flip_sin_to_cos = flags & 1;
  spec.repeat_only = flags & 2;
  spec.layout = (flags & 4) ? Layout::kInterleaved : Layout::kHalves;
  spec.precision = (flags & 8) ? Precision::kFloat64 : Precision::kFloat32;
  spec.dtype = static_cast<DType>((flags >> 4) & 3);
  const uint8_t more_flags = in.Next<uint8_t>();
  spec.exponent_order = (more_flags & 1) ? ExponentOrder::kSlopeFirst
                                         : ExponentOrder::kDivideLast;
  spec.max_period = in.Next<double>();
  spec.downscale_freq_shift = in.Next<double>();
  spec.scale = in.Next<double>();
  spec.time_factor = in.Next<double>();
  std::vector<float> timesteps(in.remaining() / sizeof(float));
  for (float& t : timesteps) t = in.Next<float>();

  const absl::Status valid = ValidateRequest(spec, timesteps, FuzzLimits());
  if (!valid.ok()) {
    CheckRejection(valid);
    return;
  }
  const auto& engines = Engines();
  Backend& engine = *engines[(flags >> 6) % engines.size()];
  const std::string out = Compute(engine, spec, timesteps);
  CheckEmbedding(spec, timesteps, out);
  if (spec.precision == Precision::kFloat64) {
    TEMB_FUZZ_CHECK(
        out == Compute(*engines.front(), spec, timesteps),
        absl::StrCat("fp64 precision differs between ", engine.device(),
                     " and ", engines.front()->device(), " for ",
                     SpecDebugString(spec)));
  }
}

}  // namespace
}  // namespace temb::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  temb::fuzz::Run(data, size);
  return 0;
}
