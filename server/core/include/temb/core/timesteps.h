// The one place timesteps become float32, the type the core computes from.
//
// Integers convert exactly up to 2^24 (as the contract says: integer
// timesteps become float32 first); doubles round once, to nearest.  Every
// frontend decodes its wire form through these.
#ifndef TEMB_CORE_TIMESTEPS_H_
#define TEMB_CORE_TIMESTEPS_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace temb {

// `values` (any container of numbers) as float32.
template <typename Values>
std::vector<float> TimestepsAsFloat32(const Values& values) {
  std::vector<float> out;
  out.reserve(values.size());
  for (const auto value : values) out.push_back(static_cast<float>(value));
  return out;
}

// Little-endian raw elements of type T (bytes.size() a multiple of
// sizeof(T)) as float32.  The host must be little-endian; the frontends
// check that at compile time.
template <typename T>
std::vector<float> TimestepsFromRawBytes(absl::string_view bytes) {
  std::vector<float> out(bytes.size() / sizeof(T));
  for (size_t i = 0; i < out.size(); ++i) {
    T value;
    std::memcpy(&value, bytes.data() + i * sizeof(T), sizeof(T));
    out[i] = static_cast<float>(value);
  }
  return out;
}

// Shaped timesteps (per token [B, L], Cosmos' [B, 1, T, 1, 1]): the shape of
// the embedding of `count` timesteps of width `dim`, timesteps_shape + [dim],
// or [count, dim] when timesteps_shape is empty.  INVALID_ARGUMENT naming
// `field` for a rank above kMaxTimestepsRank, a negative dimension, or a
// shape whose product is not `count`.  Limits apply to the element count.
inline constexpr int kMaxTimestepsRank = 5;
absl::StatusOr<std::vector<int64_t>> EmbeddingShape(
    absl::Span<const int64_t> timesteps_shape, int64_t count, int dim,
    absl::string_view field = "timesteps_shape");

}  // namespace temb

#endif  // TEMB_CORE_TIMESTEPS_H_
