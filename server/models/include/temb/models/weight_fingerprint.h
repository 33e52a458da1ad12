// A short fingerprint of a weight tensor, so that a client holding the same
// model can tell that a served conditioning model reads the same weights
// (the offload patch checks it before it frees its own copy).
//
// Definition (client/python/temb/_offload.py computes the same): the first
// 16 hex digits of SHA-256 over
//   the dtype's safetensors name ("F32", "BF16", "F16"), "\n",
//   the tensor's byte count in decimal, "\n",
//   its bytes (little-endian, in the dtype the model computes with): all of
//   them up to kFingerprintWholeBytes, else kFingerprintWindows windows of
//   kFingerprintWindowBytes at offsets i * (bytes - window) / (windows - 1),
//   i = 0 .. windows - 1 (integer division).
// Sampling keeps it cheap for a 12 GiB model; any other training run or
// fine-tune of a tensor changes every window.  Not a defence against a
// crafted checkpoint: the operator chooses the model repository.
#ifndef TEMB_MODELS_WEIGHT_FINGERPRINT_H_
#define TEMB_MODELS_WEIGHT_FINGERPRINT_H_

#include <cstdint>
#include <string>

#include "absl/types/span.h"
#include "temb/kernels/dtype.h"

namespace temb::models {

inline constexpr int64_t kFingerprintWholeBytes = 65536;
inline constexpr int64_t kFingerprintWindowBytes = 4096;
inline constexpr int64_t kFingerprintWindows = 16;

std::string WeightFingerprint(DType dtype, absl::Span<const uint8_t> bytes);

}  // namespace temb::models

#endif  // TEMB_MODELS_WEIGHT_FINGERPRINT_H_
