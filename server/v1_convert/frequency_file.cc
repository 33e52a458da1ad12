#include "temb/v1_convert/frequency_file.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "temb/base/file_reader.h"
#include "temb/base/status_macros.h"

// Tensors are little-endian on disk; memcpy decodes them only on a
// little-endian host.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "frequency files are read as little-endian");

namespace temb {
namespace {

absl::Status Invalid(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("frequency file \"", path, "\": ", what));
}

// The element count of a shape that is one-dimensional in effect.
absl::StatusOr<int64_t> VectorLength(const std::vector<int64_t>& shape,
                                     const std::string& path) {
  if (shape.size() == 1) return shape[0];
  if (shape.size() == 2 && (shape[0] == 1 || shape[1] == 1)) {
    return shape[0] * shape[1];
  }
  return Invalid(path, absl::StrCat("the table must have one dimension, got [",
                                    absl::StrJoin(shape, ", "), "]"));
}

absl::StatusOr<std::vector<double>> Decode(absl::string_view bytes,
                                           bool float64, int64_t count,
                                           const std::string& path) {
  const size_t size = float64 ? 8 : 4;
  if (count < 0 || bytes.size() != static_cast<uint64_t>(count) * size) {
    return Invalid(path, absl::StrCat("holds ", bytes.size(),
                                      " bytes of data for ", count, " values"));
  }
  std::vector<double> values(count);
  for (int64_t i = 0; i < count; ++i) {
    if (float64) {
      std::memcpy(&values[i], bytes.data() + 8 * i, 8);
    } else {
      float value;
      std::memcpy(&value, bytes.data() + 4 * i, 4);
      values[i] = value;
    }
  }
  return values;
}

// NumPy's format: magic, version, header length, a Python dict literal
// ({'descr': '<f4', 'fortran_order': False, 'shape': (128,), }), data.
absl::StatusOr<std::vector<double>> ReadNpy(const std::string& contents,
                                            const std::string& path) {
  if (contents.size() < 10 || contents.compare(0, 6, "\x93NUMPY") != 0) {
    return Invalid(path, "not a .npy file");
  }
  const int major = static_cast<unsigned char>(contents[6]);
  size_t header_length;
  size_t offset;
  if (major == 1) {
    header_length = static_cast<unsigned char>(contents[8]) |
                    static_cast<unsigned char>(contents[9]) << 8;
    offset = 10;
  } else if ((major == 2 || major == 3) && contents.size() >= 12) {
    uint32_t length;
    std::memcpy(&length, contents.data() + 8, 4);
    header_length = length;
    offset = 12;
  } else {
    return Invalid(path, absl::StrCat("unsupported .npy version ", major));
  }
  if (contents.size() < offset + header_length) {
    return Invalid(path, "truncated .npy header");
  }
  const std::string header = contents.substr(offset, header_length);
  bool float64;
  if (absl::StrContains(header, "'descr': '<f8'")) {
    float64 = true;
  } else if (absl::StrContains(header, "'descr': '<f4'")) {
    float64 = false;
  } else {
    return Invalid(path,
                   "the .npy dtype must be little-endian float32 or "
                   "float64 ('<f4' or '<f8')");
  }
  if (!absl::StrContains(header, "'fortran_order': False")) {
    return Invalid(path, "the .npy array must be in C order");
  }
  const size_t open = header.find("'shape': (");
  const size_t close = header.find(')', open);
  if (open == std::string::npos || close == std::string::npos) {
    return Invalid(path, "the .npy header has no shape");
  }
  std::vector<int64_t> shape;
  const size_t start = open + 10;
  for (absl::string_view token : absl::StrSplit(
           header.substr(start, close - start), ',', absl::SkipWhitespace())) {
    int64_t extent;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(token), &extent)) {
      return Invalid(path, "the .npy shape is malformed");
    }
    shape.push_back(extent);
  }
  ASSIGN_OR_RETURN(int64_t count, VectorLength(shape, path));
  return Decode(absl::string_view(contents).substr(offset + header_length),
                float64, count, path);
}

// safetensors: an 8-byte little-endian header length, a JSON header mapping
// tensor names to {dtype, shape, data_offsets}, then the data.
absl::StatusOr<std::vector<double>> ReadSafetensors(const std::string& contents,
                                                    const std::string& path,
                                                    absl::string_view tensor) {
  uint64_t header_length = 0;
  if (contents.size() < 8) return Invalid(path, "not a .safetensors file");
  std::memcpy(&header_length, contents.data(), 8);
  if (header_length > contents.size() - 8) {
    return Invalid(path, "truncated .safetensors header");
  }
  const nlohmann::json header = nlohmann::json::parse(
      contents.begin() + 8, contents.begin() + 8 + header_length, nullptr,
      /*allow_exceptions=*/false);
  if (!header.is_object())
    return Invalid(path, "malformed .safetensors header");
  std::vector<std::string> names;
  for (const auto& [name, value] : header.items()) {
    if (name != "__metadata__") names.push_back(name);
  }
  std::string chosen(tensor);
  if (chosen.empty()) {
    if (names.size() != 1) {
      return Invalid(path, absl::StrCat("holds ", names.size(),
                                        " tensors: name one with "
                                        "frequencies_tensor (",
                                        absl::StrJoin(names, ", "), ")"));
    }
    chosen = names[0];
  }
  if (!header.contains(chosen) || !header[chosen].is_object()) {
    return Invalid(path, absl::StrCat("has no tensor \"", chosen, "\" (",
                                      absl::StrJoin(names, ", "), ")"));
  }
  const nlohmann::json& entry = header[chosen];
  const std::string dtype = entry.value("dtype", "");
  if (dtype != "F32" && dtype != "F64") {
    return Invalid(path, absl::StrCat("tensor \"", chosen,
                                      "\" must be F32 or F64, got ", dtype));
  }
  const nlohmann::json& offsets = entry["data_offsets"];
  const nlohmann::json& shape_json = entry["shape"];
  if (!offsets.is_array() || offsets.size() != 2 || !shape_json.is_array()) {
    return Invalid(path, "malformed .safetensors tensor entry");
  }
  std::vector<int64_t> shape;
  for (const auto& extent : shape_json) {
    if (!extent.is_number_integer()) return Invalid(path, "malformed shape");
    shape.push_back(extent.get<int64_t>());
  }
  ASSIGN_OR_RETURN(int64_t count, VectorLength(shape, path));
  const uint64_t begin = offsets[0].get<uint64_t>();
  const uint64_t end = offsets[1].get<uint64_t>();
  const uint64_t data_size = contents.size() - 8 - header_length;
  if (begin > end || end > data_size) {
    return Invalid(path, "tensor data outside the file");
  }
  return Decode(absl::string_view(contents).substr(8 + header_length + begin,
                                                   end - begin),
                dtype == "F64", count, path);
}

}  // namespace

absl::StatusOr<std::vector<double>> ReadFrequencyFile(
    const std::string& path, absl::string_view tensor) {
  ASSIGN_OR_RETURN(std::string contents, ReadFile(path, "frequency file"));
  if (absl::EndsWith(path, ".npy")) return ReadNpy(contents, path);
  if (absl::EndsWith(path, ".safetensors")) {
    return ReadSafetensors(contents, path, tensor);
  }
  return Invalid(path, "must end in .npy or .safetensors");
}

}  // namespace temb
