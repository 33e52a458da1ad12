#include "temb/cli/output.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace temb::cli {
namespace {

// The exact decimal expansion of a binary value: glibc's printf is exact at
// any precision, so print enough digits and drop the trailing zeros.  750
// digits cover every double; fp16/bf16 values need far fewer.
std::string ExactDecimal(double value) {
  char buffer[800];
  std::snprintf(buffer, sizeof(buffer), "%.750e", value);
  std::string text = buffer;
  const size_t e = text.find('e');
  std::string mantissa = text.substr(0, e);
  const std::string exponent = text.substr(e + 1);
  while (!mantissa.empty() && mantissa.back() == '0') mantissa.pop_back();
  if (!mantissa.empty() && mantissa.back() == '.') mantissa.pop_back();
  const int exp10 = std::stoi(exponent);
  // Positional notation in the range where %g would use it too.
  std::string sign;
  if (mantissa[0] == '-') {
    sign = "-";
    mantissa.erase(0, 1);
  }
  std::string digits = mantissa;
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int count = static_cast<int>(digits.size());
  if (exp10 >= 0 && exp10 < 17) {
    if (exp10 + 1 >= count)
      return sign + digits + std::string(exp10 + 1 - count, '0');
    return sign + digits.substr(0, exp10 + 1) + "." + digits.substr(exp10 + 1);
  }
  if (exp10 < 0 && exp10 >= -5) {
    return sign + "0." + std::string(-exp10 - 1, '0') + digits;
  }
  return absl::StrCat(sign, mantissa, "e", exp10);
}

const char* NpyDescr(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "<f4";
    case DType::kFloat16:
      return "<f2";
    case DType::kBFloat16:
      return "<u2";
    case DType::kFloat64:
      return "<f8";
  }
  return "<f4";
}

}  // namespace

double ElementAt(const TensorView& tensor, int64_t i) {
  return ElementAsDouble(tensor.data.data(), tensor.dtype, i);
}

std::string FormatElement(DType dtype, double value) {
  // The server never sends these (it refuses what would produce them), but
  // a reader must not crash on them: JSON has no literal, so a string.
  if (std::isnan(value)) return "\"nan\"";
  if (std::isinf(value)) return value > 0 ? "\"inf\"" : "\"-inf\"";
  switch (dtype) {
    case DType::kFloat32:
      return absl::StrFormat("%.9g", value);
    case DType::kFloat64:
      return absl::StrFormat("%.17g", value);
    case DType::kFloat16:
    case DType::kBFloat16:
      return ExactDecimal(value);
  }
  return "";
}

std::string ToJson(const TensorView& tensor) {
  std::string out =
      absl::StrFormat(R"({"shape": [%s], "dtype": "%s", "data": [)",
                      ShapeText(tensor), DTypeName(tensor.dtype));
  const int64_t n = tensor.rows * tensor.cols;
  for (int64_t i = 0; i < n; ++i) {
    if (i > 0) out += ", ";
    out += FormatElement(tensor.dtype, ElementAt(tensor, i));
  }
  out += "]}\n";
  return out;
}

std::string ShapeText(const TensorView& tensor) {
  if (tensor.row_shape.empty()) {
    return absl::StrCat(tensor.rows, ", ", tensor.cols);
  }
  return absl::StrCat(absl::StrJoin(tensor.row_shape, ", "), ", ", tensor.cols);
}

std::string NpyHeader(const TensorView& tensor) {
  std::string header = absl::StrFormat(
      "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
      NpyDescr(tensor.dtype), ShapeText(tensor));
  // Magic (6) + version (2) + length (2) + header, padded with spaces and a
  // final newline to a multiple of 64 so that the data is aligned.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>((header.size() >> 8) & 0xff);
  out += header;
  return out;
}

std::string ToNpy(const TensorView& tensor) {
  std::string out = NpyHeader(tensor);
  out.append(tensor.data.data(), tensor.data.size());
  return out;
}

std::string ToTable(const TensorView& tensor,
                    absl::Span<const float> timesteps) {
  // Like NumPy's printing: wide rows show their first and last columns with
  // "..." between, so a 320-wide embedding still fits a terminal.
  constexpr int64_t kEdgeColumns = 4;
  const bool elide = tensor.cols > 2 * kEdgeColumns + 1;
  std::string out = absl::StrFormat("# shape [%s] dtype %s\n",
                                    ShapeText(tensor), DTypeName(tensor.dtype));
  for (int64_t r = 0; r < tensor.rows; ++r) {
    if (static_cast<size_t>(r) < timesteps.size()) {
      absl::StrAppendFormat(&out, "t=%-10g", timesteps[r]);
    }
    for (int64_t c = 0; c < tensor.cols; ++c) {
      if (elide && c == kEdgeColumns) {
        out += "           ...";
        c = tensor.cols - kEdgeColumns - 1;
        continue;
      }
      absl::StrAppendFormat(&out, " %13.6g",
                            ElementAt(tensor, r * tensor.cols + c));
    }
    out += '\n';
  }
  return out;
}

}  // namespace temb::cli
