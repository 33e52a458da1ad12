// A bounded, checked reader of safetensors files (the format diffusers'
// save_pretrained writes), and a small writer for results.
//
// Layout: 8 bytes little-endian N, then N bytes of JSON (an object mapping
// tensor names to {"dtype", "shape", "data_offsets": [begin, end]}, plus an
// optional "__metadata__" object of strings), then the data section; the
// offsets are relative to the data section.  The reader refuses, before
// trusting any byte of data:
//   * a file shorter than 8 bytes, a header length above
//     kMaxSafetensorsHeaderBytes or past the end of the file;
//   * a header that is not a JSON object of objects with exactly those
//     fields, of the right types;
//   * an unknown dtype, a negative or overflowing shape, offsets out of the
//     data section, begin > end, a size other than product(shape) * dtype
//     size, or two tensors whose bytes overlap.
// Every message names the file, the tensor and the field, e.g.
// `model.safetensors: tensor "norm_out.linear.weight": field data_offsets:
// end 4096 is past the data section (2048 bytes)`.
// Data is read with pread(2), tensor by tensor, so only the tensors a
// caller asks for occupy memory.
#ifndef TEMB_MODELS_SAFETENSORS_H_
#define TEMB_MODELS_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "temb/kernels/dtype.h"
#include "temb/models/weight_bytes.h"

namespace temb::models {

// How deep a model folder's JSON (config.json, temb.json, the index, a
// safetensors header) may nest arrays and objects, checked before it is
// parsed: released configs nest 3 levels, and nlohmann's parser recurses
// once per level.
inline constexpr int kMaxJsonDepth = 64;

// The largest header accepted (the same bound as the reference Rust reader):
// a header is a list of names and shapes, and a length field beyond this is
// a damaged or hostile file, not a large model.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{100} << 20;

// One tensor as the header declares it.
struct TensorEntry {
  std::string name;
  std::string dtype_name;      // as stored: "BF16", "F32", "I64", ...
  std::optional<DType> dtype;  // set for F32, F16, BF16, F64
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // offsets within the data section
  uint64_t end = 0;

  int64_t elements() const;
};

// The parsed header of a file with `data_bytes` bytes after it; `file` names
// the file in messages.  Exposed for tests of hostile headers.
absl::StatusOr<std::map<std::string, TensorEntry>> ParseSafetensorsHeader(
    absl::string_view file, absl::string_view header_json, uint64_t data_bytes);

class SafetensorsFile {
 public:
  // Opens `path` and checks its header (see the file comment).  The
  // message names the path as given.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_bytes() const { return file_bytes_; }
  // Nanoseconds since the epoch of the last modification.
  int64_t mtime_ns() const { return mtime_ns_; }
  const std::map<std::string, TensorEntry>& tensors() const { return tensors_; }
  const TensorEntry* Find(const std::string& name) const;

  // The tensor's bytes, exactly as stored (little-endian).  DATA_LOSS when
  // the file shrank or the read fails.
  absl::StatusOr<WeightBytes> Read(const TensorEntry& entry) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  int fd_ = -1;
  uint64_t file_bytes_ = 0;
  uint64_t data_start_ = 0;
  int64_t mtime_ns_ = 0;
  std::map<std::string, TensorEntry> tensors_;
};

// The safetensors name of a dtype: "F32", "F16", "BF16", "F64".
absl::string_view SafetensorsDTypeName(DType dtype);

// One tensor to write: its name, dtype, shape and little-endian bytes.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

// Writes `tensors` as a safetensors file at `path` (replacing it), in the
// given order; the header is padded with spaces to a multiple of 8 bytes.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<TensorToWrite>& tensors);

}  // namespace temb::models

#endif  // TEMB_MODELS_SAFETENSORS_H_
