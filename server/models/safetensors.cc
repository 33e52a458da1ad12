#include "temb/models/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "temb/base/file_reader.h"
#include "temb/base/quoted.h"
#include "temb/base/status_macros.h"

namespace temb::models {
namespace {

using ::nlohmann::json;

struct StoredDType {
  absl::string_view name;
  uint64_t bytes;
  std::optional<DType> dtype;
};

// Every dtype the format defines with a whole number of bytes.  Tensors of
// the others can sit in a file this reader opens; they are only refused when
// a caller asks for one.
constexpr StoredDType kStoredDTypes[] = {
    {"BOOL", 1, std::nullopt},     {"U8", 1, std::nullopt},
    {"I8", 1, std::nullopt},       {"F8_E5M2", 1, std::nullopt},
    {"F8_E4M3", 1, std::nullopt},  {"I16", 2, std::nullopt},
    {"U16", 2, std::nullopt},      {"F16", 2, DType::kFloat16},
    {"BF16", 2, DType::kBFloat16}, {"I32", 4, std::nullopt},
    {"U32", 4, std::nullopt},      {"F32", 4, DType::kFloat32},
    {"F64", 8, DType::kFloat64},   {"I64", 8, std::nullopt},
    {"U64", 8, std::nullopt},
};

const StoredDType* FindStoredDType(absl::string_view name) {
  for (const StoredDType& stored : kStoredDTypes) {
    if (stored.name == name) return &stored;
  }
  return nullptr;
}

std::string Where(absl::string_view file, absl::string_view tensor,
                  absl::string_view field) {
  return absl::StrCat(file, ": tensor ", Quoted(tensor), ": field ", field,
                      ": ");
}

absl::Status Invalid(absl::string_view file, absl::string_view tensor,
                     absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(Where(file, tensor, field), what));
}

// a * b, or nullopt on overflow of uint64_t.
std::optional<uint64_t> CheckedMul(uint64_t a, uint64_t b) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) {
    return std::nullopt;
  }
  return a * b;
}

absl::StatusOr<TensorEntry> ParseEntry(absl::string_view file,
                                       const std::string& name,
                                       const json& value, uint64_t data_bytes) {
  if (!value.is_object()) {
    return Invalid(file, name, "(entry)", "must be a JSON object");
  }
  for (const auto& item : value.items()) {
    if (item.key() != "dtype" && item.key() != "shape" &&
        item.key() != "data_offsets") {
      return Invalid(file, name, Quoted(item.key()), "unknown field");
    }
  }
  TensorEntry entry;
  entry.name = name;
  const auto dtype = value.find("dtype");
  if (dtype == value.end() || !dtype->is_string()) {
    return Invalid(file, name, "dtype", "missing or not a string");
  }
  entry.dtype_name = dtype->get<std::string>();
  const StoredDType* stored = FindStoredDType(entry.dtype_name);
  if (stored == nullptr) {
    return Invalid(file, name, "dtype",
                   absl::StrCat("unknown dtype ", Quoted(entry.dtype_name)));
  }
  entry.dtype = stored->dtype;

  const auto shape = value.find("shape");
  if (shape == value.end() || !shape->is_array()) {
    return Invalid(file, name, "shape", "missing or not an array");
  }
  uint64_t elements = 1;
  for (const json& dim : *shape) {
    if (!dim.is_number_unsigned() ||
        dim.get<uint64_t>() >
            static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Invalid(file, name, "shape",
                     absl::StrCat("dimensions must be non-negative integers, "
                                  "got ",
                                  dim.is_primitive()
                                      ? dim.dump()
                                      : "a " + std::string(dim.type_name())));
    }
    const std::optional<uint64_t> product =
        CheckedMul(elements, dim.get<uint64_t>());
    if (!product.has_value()) {
      return Invalid(file, name, "shape", "product of dimensions overflows");
    }
    elements = *product;
    entry.shape.push_back(static_cast<int64_t>(dim.get<uint64_t>()));
  }
  const std::optional<uint64_t> bytes = CheckedMul(elements, stored->bytes);
  if (!bytes.has_value()) {
    return Invalid(file, name, "shape", "size in bytes overflows");
  }

  const auto offsets = value.find("data_offsets");
  if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned()) {
    return Invalid(file, name, "data_offsets",
                   "missing or not two non-negative integers");
  }
  entry.begin = (*offsets)[0].get<uint64_t>();
  entry.end = (*offsets)[1].get<uint64_t>();
  if (entry.begin > entry.end) {
    return Invalid(
        file, name, "data_offsets",
        absl::StrCat("begin ", entry.begin, " is after end ", entry.end));
  }
  if (entry.end > data_bytes) {
    return Invalid(
        file, name, "data_offsets",
        absl::StrCat("end ", entry.end, " is past the data section (",
                     data_bytes, " bytes)"));
  }
  if (entry.end - entry.begin != *bytes) {
    return Invalid(
        file, name, "data_offsets",
        absl::StrCat("span of ", entry.end - entry.begin,
                     " bytes disagrees with dtype ", entry.dtype_name,
                     " and shape (", *bytes, " bytes)"));
  }
  return entry;
}

}  // namespace

int64_t TensorEntry::elements() const {
  int64_t n = 1;
  for (int64_t dim : shape) n *= dim;
  return n;
}

absl::string_view SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "F16";
    case DType::kBFloat16:
      return "BF16";
    case DType::kFloat64:
      return "F64";
    default:
      return "F32";
  }
}

absl::StatusOr<std::map<std::string, TensorEntry>> ParseSafetensorsHeader(
    absl::string_view file, absl::string_view header_json,
    uint64_t data_bytes) {
  RETURN_IF_ERROR(CheckJsonDepth(header_json, kMaxJsonDepth,
                                 absl::StrCat(file, ": header")));
  const json header = json::parse(header_json.begin(), header_json.end(),
                                  /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": header: not valid JSON"));
  }
  if (!header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": header: must be a JSON object"));
  }
  std::map<std::string, TensorEntry> tensors;
  for (const auto& item : header.items()) {
    if (item.key() == "__metadata__") {
      if (!item.value().is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(
            file, ": header: field __metadata__: must be a JSON object"));
      }
      continue;
    }
    ASSIGN_OR_RETURN(TensorEntry entry,
                     ParseEntry(file, item.key(), item.value(), data_bytes));
    tensors.emplace(item.key(), std::move(entry));
  }
  // Overlap: sorted by begin, each non-empty tensor must end before the next
  // non-empty one starts.
  std::vector<const TensorEntry*> by_offset;
  for (const auto& [name, entry] : tensors) {
    if (entry.end > entry.begin) by_offset.push_back(&entry);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorEntry* a, const TensorEntry* b) {
              return a->begin < b->begin;
            });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return Invalid(
          file, by_offset[i]->name, "data_offsets",
          absl::StrCat("bytes [", by_offset[i]->begin, ", ", by_offset[i]->end,
                       ") overlap tensor ", Quoted(by_offset[i - 1]->name),
                       " [", by_offset[i - 1]->begin, ", ",
                       by_offset[i - 1]->end, ")"));
    }
  }
  return tensors;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  // Without blocking: a FIFO named as a shard is refused below, not waited
  // on (O_NONBLOCK changes nothing for a regular file's reads).
  file->fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (file->fd_ < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  struct stat info;
  if (::fstat(file->fd_, &info) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat ", path));
  }
  if (!S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file"));
  }
  file->file_bytes_ = static_cast<uint64_t>(info.st_size);
  file->mtime_ns_ = static_cast<int64_t>(info.st_mtim.tv_sec) * 1000000000 +
                    info.st_mtim.tv_nsec;
  if (file->file_bytes_ < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header length: the file has ", file->file_bytes_,
                     " bytes, fewer than the 8-byte header length"));
  }
  uint8_t length_bytes[8];
  if (::pread(file->fd_, length_bytes, 8, 0) != 8) {
    return absl::DataLossError(
        absl::StrCat(path, ": header length: short read"));
  }
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i)
    header_bytes = (header_bytes << 8) | length_bytes[i];
  if (header_bytes > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": header length: ", header_bytes,
        " bytes is above the limit of ", kMaxSafetensorsHeaderBytes));
  }
  if (header_bytes > file->file_bytes_ - 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": header length: ", header_bytes,
        " bytes is past the end of the file (", file->file_bytes_, " bytes)"));
  }
  std::string header(header_bytes, '\0');
  if (header_bytes > 0 && ::pread(file->fd_, header.data(), header_bytes, 8) !=
                              static_cast<ssize_t>(header_bytes)) {
    return absl::DataLossError(absl::StrCat(path, ": header: short read"));
  }
  file->data_start_ = 8 + header_bytes;
  ASSIGN_OR_RETURN(file->tensors_,
                   ParseSafetensorsHeader(
                       path, header, file->file_bytes_ - file->data_start_));
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

const TensorEntry* SafetensorsFile::Find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<WeightBytes> SafetensorsFile::Read(
    const TensorEntry& entry) const {
  WeightBytes data(entry.end - entry.begin);
  uint64_t done = 0;
  while (done < data.size()) {
    const ssize_t n =
        ::pread(fd_, data.data() + done, data.size() - done,
                static_cast<off_t>(data_start_ + entry.begin + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::DataLossError(absl::StrCat(
          Where(path_, entry.name, "data_offsets"),
          "cannot read the tensor's bytes (the file changed or failed)"));
    }
    done += static_cast<uint64_t>(n);
  }
  return data;
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<TensorToWrite>& tensors) {
  // nlohmann's ordered_json keeps the tensors in the caller's order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t offset = 0;
  for (const TensorToWrite& tensor : tensors) {
    header[tensor.name] = {
        {"dtype", std::string(SafetensorsDTypeName(tensor.dtype))},
        {"shape", tensor.shape},
        {"data_offsets", {offset, offset + tensor.data.size()}}};
    offset += tensor.data.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", path));
  }
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) {
    bytes[i] = static_cast<char>((uint64_t{text.size()} >> (8 * i)) & 0xff);
  }
  bytes += text;
  for (const TensorToWrite& tensor : tensors) {
    bytes.append(reinterpret_cast<const char*>(tensor.data.data()),
                 tensor.data.size());
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      ::close(fd);
      return absl::ErrnoToStatus(error, absl::StrCat("cannot write ", path));
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

}  // namespace temb::models
