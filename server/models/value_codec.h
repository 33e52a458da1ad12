// Values as bytes: a row of float32 values holding dtype values encoded as
// the little-endian elements the frontends send (and the row cache keeps),
// and decoded back.
#ifndef TEMB_MODELS_VALUE_CODEC_H_
#define TEMB_MODELS_VALUE_CODEC_H_

#include <cstdint>
#include <string>

#include "temb/kernels/dtype.h"

namespace temb::models {

// Appends `count` values as elements of `dtype` (fp32, bf16 or fp16; each
// value already representable in it) to `out`.
void AppendEncoded(const float* values, int64_t count, DType dtype,
                   std::string* out);

// Decodes `count` little-endian elements of `dtype` into float32 values.
void DecodeInto(const char* bytes, int64_t count, DType dtype, float* out);

}  // namespace temb::models

#endif  // TEMB_MODELS_VALUE_CODEC_H_
