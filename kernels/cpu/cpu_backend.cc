#include "cpu/cpu_backend.h"

#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "temb/kernels/frequencies.h"

namespace temb {
namespace {

// Writes `count` values of type T (float or double) as spec.dtype.
template <typename T>
void StoreRow(const T* values, int count, DType dtype, uint8_t* out) {
  switch (dtype) {
    case DType::kFloat32:
      for (int j = 0; j < count; ++j) {
        const float v = static_cast<float>(values[j]);
        std::memcpy(out + 4 * j, &v, 4);
      }
      return;
    case DType::kFloat64:
      for (int j = 0; j < count; ++j) {
        const double v = static_cast<double>(values[j]);
        std::memcpy(out + 8 * j, &v, 8);
      }
      return;
    case DType::kFloat16:
      for (int j = 0; j < count; ++j) {
        const uint16_t v = sizeof(T) == 8 ? DoubleToHalf(values[j])
                                          : FloatToHalf(static_cast<float>(values[j]));
        std::memcpy(out + 2 * j, &v, 2);
      }
      return;
    case DType::kBFloat16:
      for (int j = 0; j < count; ++j) {
        const uint16_t v = sizeof(T) == 8 ? DoubleToBFloat16(values[j])
                                          : FloatToBFloat16(static_cast<float>(values[j]));
        std::memcpy(out + 2 * j, &v, 2);
      }
      return;
  }
}

// Places sin/cos of frequency i at their columns for the spec's layout.
template <typename T>
void PlacePair(const EmbeddingSpec& spec, int i, T sin_a, T cos_a, T* row) {
  const T first = spec.flip_sin_to_cos ? cos_a : sin_a;
  const T second = spec.flip_sin_to_cos ? sin_a : cos_a;
  if (spec.layout == Layout::kInterleaved) {
    row[2 * i] = first;
    row[2 * i + 1] = second;
  } else {
    row[i] = first;
    row[spec.half_dim() + i] = second;
  }
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads)
      : threads_(threads > 0 ? threads
                             : std::max(1u, std::thread::hardware_concurrency())) {}

  BackendKind kind() const override { return BackendKind::kCpu; }
  std::string device() const override {
    return absl::StrCat("cpu scalar, ", threads_, " threads");
  }

  absl::Status Compute(const EmbeddingSpec& spec, absl::Span<const float> timesteps,
                       absl::Span<uint8_t> out) override {
    const int64_t rows = static_cast<int64_t>(timesteps.size());
    const int64_t row_bytes = spec.row_bytes();
    if (spec.precision == Precision::kFloat64 && !spec.repeat_only) {
      const std::vector<double> freqs = Float64Frequencies(spec);
      std::vector<double> row(spec.dim, 0.0);
      for (int64_t n = 0; n < rows; ++n) {
        const double t = static_cast<double>(timesteps[n]) * spec.time_factor;
        for (int i = 0; i < spec.half_dim(); ++i) {
          const double a = t * freqs[i] * spec.scale;
          PlacePair(spec, i, std::sin(a), std::cos(a), row.data());
        }
        StoreRow(row.data(), spec.dim, spec.dtype, out.data() + n * row_bytes);
      }
      return absl::OkStatus();
    }
    const std::vector<float> freqs =
        spec.repeat_only ? std::vector<float>() : Float32Frequencies(spec);
    const float time_factor = static_cast<float>(spec.time_factor);
    const float scale = static_cast<float>(spec.scale);
    std::vector<float> row(spec.dim, 0.0f);
    for (int64_t n = 0; n < rows; ++n) {
      if (spec.repeat_only) {
        std::fill(row.begin(), row.end(), timesteps[n]);
      } else {
        const float t =
            spec.time_factor == 1.0 ? timesteps[n] : time_factor * timesteps[n];
        for (int i = 0; i < spec.half_dim(); ++i) {
          const float a = Float32Angle(t, freqs[i], scale, spec.scale != 1.0);
          PlacePair(spec, i, std::sin(a), std::cos(a), row.data());
        }
      }
      StoreRow(row.data(), spec.dim, spec.dtype, out.data() + n * row_bytes);
    }
    return absl::OkStatus();
  }

 private:
  const int threads_;
};

}  // namespace

std::unique_ptr<Backend> CreateCpuBackend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace temb
