// Writers for an embedding tensor: JSON, .npy and a human-readable table.
//
// Every writer is deterministic, so two runs that computed the same bytes
// print the same text; the end-to-end tests compare remote and in-process
// output byte for byte.
#ifndef TEMB_CLI_OUTPUT_H_
#define TEMB_CLI_OUTPUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "temb/kernels/dtype.h"

namespace temb::cli {

// A [rows, cols] row-major tensor of little-endian `dtype` elements, where
// rows may stand for a shape of several dimensions (shaped timesteps:
// [B, L] rows of cols give [B, L, cols]).
struct TensorView {
  int64_t rows = 0;
  int64_t cols = 0;
  DType dtype = DType::kFloat32;
  absl::string_view data;  // rows * cols * DTypeSize(dtype) bytes
  // The dimensions before cols when not just [rows]; their product is rows.
  std::vector<int64_t> row_shape;
};

// "2, 7, 256": the full shape, for the writers.
std::string ShapeText(const TensorView& tensor);

// Element i widened to double (exact for every dtype).
double ElementAt(const TensorView& tensor, int64_t i);

// A decimal that converts back to exactly the same element: "%.9g" for fp32,
// "%.17g" for fp64, and for fp16/bf16 the exact decimal expansion of the
// rounded value (short, since those types carry 11 and 8 significant bits).
std::string FormatElement(DType dtype, double value);

// {"shape": [..., cols], "dtype": "fp32", "data": [row-major values]}
std::string ToJson(const TensorView& tensor);

// A .npy (format version 1.0) file.  fp32/fp16/fp64 map to <f4/<f2/<f8.
// NumPy has no bfloat16 dtype, so bf16 is written as <u2 holding the raw
// bfloat16 bit patterns: the bytes are exactly what the server sent (no
// widening, no second conversion to get wrong) and a reader recovers the
// values exactly with `(a.astype(np.uint32) << 16).view(np.float32)`.
std::string ToNpy(const TensorView& tensor);
// The header alone: ToNpy(t) == NpyHeader(t) + t.data.  For writing a large
// tensor without copying it into one string first.
std::string NpyHeader(const TensorView& tensor);

// One line per row, values with 6 significant digits, for reading; rows
// wider than 9 columns show the first 4 and last 4 with "..." between.
std::string ToTable(const TensorView& tensor,
                    absl::Span<const float> timesteps);

}  // namespace temb::cli

#endif  // TEMB_CLI_OUTPUT_H_
