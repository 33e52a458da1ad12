// Fuzzes the safetensors header parser with whole files: an 8-byte
// little-endian header length, the header, the data section.
//
// Any input must be refused with a status or accepted with entries that
// keep the reader's promises: every tensor's bytes inside the data
// section, begin <= end, end - begin == product(shape) * dtype size, and no
// two tensors overlapping.  A length above the bound or past the end is
// refused before the header is read, as SafetensorsFile::Open does.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "temb/models/safetensors.h"

namespace temb::fuzz {
namespace {

void Fail(const char* what) {
  std::fprintf(stderr, "safetensors_header invariant failed: %s\n", what);
  std::abort();
}

uint64_t ElementBytes(const std::string& name) {
  if (name == "F64" || name == "I64" || name == "U64") return 8;
  if (name == "F32" || name == "I32" || name == "U32") return 4;
  if (name == "F16" || name == "BF16" || name == "I16" || name == "U16") {
    return 2;
  }
  return 1;
}

}  // namespace
}  // namespace temb::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using temb::fuzz::Fail;
  if (size < 8) return 0;
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | data[i];
  if (header_bytes > temb::models::kMaxSafetensorsHeaderBytes ||
      header_bytes > size - 8) {
    return 0;
  }
  const uint64_t data_bytes = size - 8 - header_bytes;
  auto parsed = temb::models::ParseSafetensorsHeader(
      "fuzz.safetensors",
      std::string(reinterpret_cast<const char*>(data + 8), header_bytes),
      data_bytes);
  if (!parsed.ok()) {
    if (parsed.status().message().find("fuzz.safetensors") ==
        std::string::npos) {
      Fail("an error that does not name the file");
    }
    return 0;
  }
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [name, entry] : *parsed) {
    if (entry.begin > entry.end || entry.end > data_bytes) {
      Fail("a tensor outside the data section");
    }
    uint64_t bytes = temb::fuzz::ElementBytes(entry.dtype_name);
    for (int64_t dim : entry.shape) {
      if (dim < 0) Fail("a negative dimension");
      bytes *= static_cast<uint64_t>(dim);
    }
    if (bytes != entry.end - entry.begin) Fail("a size that disagrees");
    if (entry.end > entry.begin) spans.emplace_back(entry.begin, entry.end);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].second) Fail("overlapping tensors");
  }
  return 0;
}
