// Frequency tables from files: a checkpoint's learned Fourier weights
// exported to .npy or .safetensors (Preset.frequencies_file).
#ifndef TEMB_V1_CONVERT_FREQUENCY_FILE_H_
#define TEMB_V1_CONVERT_FREQUENCY_FILE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace temb {

// The values of a one-dimensional float32 or float64 tensor, little-endian:
//   *.npy          NumPy format 1.0-3.0, descr '<f4' or '<f8', C order;
//   *.safetensors  dtype F32 or F64; `tensor` names it (may be empty when
//                  the file holds exactly one tensor).
// Shapes [N], [1, N] and [N, 1] are accepted.  ReadFile's codes when the
// file cannot be read; INVALID_ARGUMENT naming the file for anything else.
absl::StatusOr<std::vector<double>> ReadFrequencyFile(const std::string& path,
                                                      absl::string_view tensor);

}  // namespace temb

#endif  // TEMB_V1_CONVERT_FREQUENCY_FILE_H_
