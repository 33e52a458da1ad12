#include "temb/kserve/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "temb/base/status_macros.h"
#include "temb/kserve/tensor_type.h"

namespace temb::kserve {
namespace {

using inference::InferParameter;
using Params = google::protobuf::Map<std::string, InferParameter>;

constexpr char kRegion[] = "shared_memory_region";
constexpr char kByteSize[] = "shared_memory_byte_size";
constexpr char kOffset[] = "shared_memory_offset";

absl::StatusOr<uint64_t> SizeParam(const Params& params, const char* key,
                                   const std::string& field, bool required) {
  const auto it = params.find(key);
  if (it == params.end()) {
    if (required) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, "parameters[\"", key, "\"] is required with ", kRegion));
    }
    return 0;
  }
  const InferParameter& p = it->second;
  if (p.parameter_choice_case() == InferParameter::kInt64Param &&
      p.int64_param() >= 0) {
    return static_cast<uint64_t>(p.int64_param());
  }
  if (p.parameter_choice_case() == InferParameter::kUint64Param) {
    return p.uint64_param();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, "parameters[\"", key, "\"] must be a non-negative integer"));
}

struct Placement {
  std::shared_ptr<const SharedMemoryRegion> region;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};

// The shared memory parameters of one tensor, checked against its region;
// nullopt-like empty region when the tensor names none.
absl::StatusOr<Placement> PlacementOf(const SharedMemoryRegistry& registry,
                                      Params* params,
                                      const std::string& field) {
  Placement placement;
  const auto it = params->find(kRegion);
  if (it == params->end()) {
    if (params->count(kByteSize) > 0 || params->count(kOffset) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "parameters: ", kByteSize, " and ", kOffset,
                       " need ", kRegion));
    }
    return placement;
  }
  if (it->second.parameter_choice_case() != InferParameter::kStringParam) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, "parameters[\"", kRegion, "\"] must be a string"));
  }
  absl::StatusOr<std::shared_ptr<const SharedMemoryRegion>> region =
      registry.Find(it->second.string_param());
  if (!region.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, "parameters[\"", kRegion, "\"]: ", region.status().message()));
  }
  ASSIGN_OR_RETURN(placement.byte_size,
                   SizeParam(*params, kByteSize, field, /*required=*/true));
  ASSIGN_OR_RETURN(placement.offset,
                   SizeParam(*params, kOffset, field, /*required=*/false));
  if (placement.offset > (*region)->byte_size() ||
      placement.byte_size > (*region)->byte_size() - placement.offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, "parameters: ", placement.byte_size, " bytes at offset ",
        placement.offset, " do not fit region \"", (*region)->name(), "\" (",
        (*region)->byte_size(), " bytes)"));
  }
  placement.region = *std::move(region);
  params->erase(kRegion);
  params->erase(kByteSize);
  params->erase(kOffset);
  return placement;
}

bool NamesRegion(const Params& params) { return params.count(kRegion) > 0; }

// An input's shared_memory_byte_size must be what its shape and datatype
// take.  INVALID_ARGUMENT naming the field otherwise (also for a shape or
// datatype that cannot be sized: the request would be refused anyway).
absl::Status CheckInputBytes(
    const inference::ModelInferRequest::InferInputTensor& input,
    uint64_t byte_size, const std::string& field) {
  const std::optional<TensorType> type = ParseTensorType(input.datatype());
  const uint64_t element = type.has_value() ? TensorTypeSize(*type) : 0;
  uint64_t expected = element;
  bool sized = element > 0;
  for (const int64_t extent : input.shape()) {
    if (extent < 0 ||
        (extent > 0 && expected > UINT64_MAX / static_cast<uint64_t>(extent))) {
      sized = false;
      break;
    }
    expected *= static_cast<uint64_t>(extent);
  }
  if (!sized) {
    return absl::InvalidArgumentError(absl::StrCat(
        field,
        "shape and datatype must give a fixed byte size for an input in "
        "shared memory"));
  }
  if (expected != byte_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, "parameters[\"", kByteSize, "\"] is ", byte_size,
        ", but the input's shape and datatype take ", expected, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

SharedMemoryRegion::~SharedMemoryRegion() { close(fd_); }

absl::Status SharedMemoryRegion::CheckStillHolds(uint64_t at,
                                                 uint64_t size) const {
  struct stat st;
  if (fstat(fd_, &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory region \"", name_,
                     "\": cannot read its object: ", std::strerror(errno)));
  }
  const uint64_t end = offset_ + at + size;
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) < end) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shared memory region \"", name_, "\": its object \"", key_,
        "\" now has ", static_cast<int64_t>(st.st_size), " bytes, fewer than ",
        end, " (truncated since it was registered)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> SharedMemoryRegion::Read(uint64_t at,
                                                     uint64_t size) const {
  RETURN_IF_ERROR(CheckStillHolds(at, size));
  std::string out(size, '\0');
  uint64_t done = 0;
  while (done < size) {
    const ssize_t n = pread(fd_, out.data() + done, size - done,
                            static_cast<off_t>(offset_ + at + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {  // shrunk after the check: an error, not a fault
      return absl::FailedPreconditionError(absl::StrCat(
          "shared memory region \"", name_, "\": read ", done, " of ", size,
          " bytes", n < 0 ? absl::StrCat(": ", std::strerror(errno)) : ""));
    }
    done += static_cast<uint64_t>(n);
  }
  return out;
}

absl::Status SharedMemoryRegion::Write(uint64_t at,
                                       absl::string_view bytes) const {
  // A write past the end would grow the object: checked first.  Should the
  // owner truncate it in between, the write stays within byte_size().
  RETURN_IF_ERROR(CheckStillHolds(at, bytes.size()));
  uint64_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = pwrite(fd_, bytes.data() + done, bytes.size() - done,
                             static_cast<off_t>(offset_ + at + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("shared memory region \"", name_, "\": wrote ", done,
                       " of ", bytes.size(), " bytes",
                       n < 0 ? absl::StrCat(": ", std::strerror(errno)) : ""));
    }
    done += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status SharedMemoryRegistry::Register(const std::string& name,
                                            const std::string& key,
                                            uint64_t offset,
                                            uint64_t byte_size) {
  if (name.empty() || key.empty() || byte_size == 0) {
    return absl::InvalidArgumentError(
        "a shared memory region needs a name, a key and a byte_size > 0");
  }
  if (name.size() > limits_.max_name_bytes ||
      key.size() > limits_.max_name_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a shared memory region's name and key must be at most ",
                     limits_.max_name_bytes, " bytes, got ", name.size(),
                     " and ", key.size()));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (regions_.count(name) > 0) {
      return absl::AlreadyExistsError(absl::StrCat(
          "shared memory region \"", name, "\" is already registered"));
    }
    if (static_cast<int64_t>(regions_.size()) >= limits_.max_regions) {
      return absl::ResourceExhaustedError(
          absl::StrCat("at most ", limits_.max_regions,
                       " shared memory regions may be registered "
                       "(--shm_max_regions); unregister one first"));
    }
  }
  const int fd = shm_open(key.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    if (errno == EMFILE || errno == ENFILE) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot open shared memory object \"", key,
                       "\": ", std::strerror(errno)));
    }
    return absl::NotFoundError(
        absl::StrCat("cannot open shared memory object \"", key,
                     "\": ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < 0 ||
      offset > static_cast<uint64_t>(st.st_size) ||
      byte_size > static_cast<uint64_t>(st.st_size) - offset) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory object \"", key, "\" has ",
                     static_cast<int64_t>(st.st_size), " bytes: ", byte_size,
                     " bytes at offset ", offset, " do not fit"));
  }
  std::shared_ptr<const SharedMemoryRegion> region(
      new SharedMemoryRegion(name, key, offset, byte_size, fd));
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<int64_t>(regions_.size()) >= limits_.max_regions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "at most ", limits_.max_regions,
        " shared memory regions may be registered (--shm_max_regions)"));
  }
  if (!regions_.emplace(name, std::move(region)).second) {
    return absl::AlreadyExistsError(absl::StrCat(
        "shared memory region \"", name, "\" is already registered"));
  }
  return absl::OkStatus();
}

absl::Status SharedMemoryRegistry::Unregister(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (name.empty()) {
    regions_.clear();
    return absl::OkStatus();
  }
  if (regions_.erase(name) == 0) {
    return absl::NotFoundError(
        absl::StrCat("no shared memory region \"", name, "\" is registered"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::shared_ptr<const SharedMemoryRegion>>>
SharedMemoryRegistry::Status(const std::string& name) const {
  std::vector<std::shared_ptr<const SharedMemoryRegion>> out;
  if (!name.empty()) {
    ASSIGN_OR_RETURN(std::shared_ptr<const SharedMemoryRegion> region,
                     Find(name));
    out.push_back(std::move(region));
    return out;
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [unused, region] : regions_) out.push_back(region);
  return out;
}

absl::StatusOr<std::shared_ptr<const SharedMemoryRegion>>
SharedMemoryRegistry::Find(absl::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = regions_.find(name);
  if (it == regions_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no shared memory region \"", name, "\" is registered"));
  }
  return it->second;
}

bool UsesSharedMemory(const inference::ModelInferRequest& request) {
  for (const auto& input : request.inputs()) {
    if (NamesRegion(input.parameters())) return true;
  }
  for (const auto& output : request.outputs()) {
    if (NamesRegion(output.parameters())) return true;
  }
  return false;
}

absl::Status PrepareSharedMemory(const SharedMemoryRegistry& registry,
                                 uint64_t max_input_bytes,
                                 AdmissionTicket* ticket,
                                 inference::ModelInferRequest* request,
                                 std::vector<SharedMemoryOutput>* outputs) {
  outputs->clear();
  if (!UsesSharedMemory(*request)) return absl::OkStatus();
  // Raw contents for every input: from the region, or the next entry of
  // the request's own raw_input_contents (inputs in shared memory have no
  // entry there, as in Triton).
  bool any_input = false;
  for (const auto& input : request->inputs()) {
    any_input = any_input || NamesRegion(input.parameters());
  }
  std::vector<std::string> raw;
  int next_raw = 0;
  for (int i = 0; any_input && i < request->inputs_size(); ++i) {
    auto* input = request->mutable_inputs(i);
    const std::string field = absl::StrCat("inputs[", i, "].");
    ASSIGN_OR_RETURN(Placement placement,
                     PlacementOf(registry, input->mutable_parameters(), field));
    if (placement.region != nullptr) {
      // Checked before anything is read: a small tensor naming a large
      // region must not cost a large copy.
      RETURN_IF_ERROR(CheckInputBytes(*input, placement.byte_size, field));
      if (placement.byte_size > max_input_bytes) {
        return absl::ResourceExhaustedError(absl::StrCat(
            field, "parameters[\"", kByteSize, "\"] is ", placement.byte_size,
            " bytes; the largest input this server takes is ", max_input_bytes,
            " (max_batch 8-byte timesteps)"));
      }
      if (ticket != nullptr) {
        RETURN_IF_ERROR(
            ticket->Reserve(static_cast<int64_t>(placement.byte_size)));
      }
      ASSIGN_OR_RETURN(
          std::string bytes,
          placement.region->Read(placement.offset, placement.byte_size));
      raw.push_back(std::move(bytes));
    } else if (next_raw < request->raw_input_contents_size()) {
      raw.push_back(std::move(*request->mutable_raw_input_contents(next_raw)));
      ++next_raw;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          field,
          "contents: next to inputs in shared memory, the other inputs "
          "travel as raw (binary) data"));
    }
  }
  if (any_input && next_raw != request->raw_input_contents_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "raw_input_contents has ", request->raw_input_contents_size(),
        " entries for ", next_raw, " inputs not in shared memory"));
  }
  if (any_input) {
    request->clear_raw_input_contents();
    for (std::string& bytes : raw) {
      request->add_raw_input_contents(std::move(bytes));
    }
  }

  for (int o = 0; o < request->outputs_size(); ++o) {
    auto* output = request->mutable_outputs(o);
    ASSIGN_OR_RETURN(Placement placement,
                     PlacementOf(registry, output->mutable_parameters(),
                                 absl::StrCat("outputs[", o, "].")));
    if (placement.region == nullptr) continue;
    outputs->push_back({output->name(), std::move(placement.region),
                        placement.offset, placement.byte_size});
  }
  return absl::OkStatus();
}

absl::Status FinishSharedMemory(const std::vector<SharedMemoryOutput>& outputs,
                                inference::ModelInferResponse* response) {
  for (const SharedMemoryOutput& target : outputs) {
    for (int i = 0; i < response->outputs_size(); ++i) {
      auto* output = response->mutable_outputs(i);
      if (output->name() != target.name) continue;
      if (i >= response->raw_output_contents_size()) {
        return absl::InternalError(
            absl::StrCat("output \"", target.name, "\" has no data"));
      }
      std::string* bytes = response->mutable_raw_output_contents(i);
      if (bytes->size() > target.byte_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("output \"", target.name, "\" has ", bytes->size(),
                         " bytes, more than its shared_memory_byte_size (",
                         target.byte_size, ")"));
      }
      RETURN_IF_ERROR(target.region->Write(target.offset, *bytes));
      auto& params = *output->mutable_parameters();
      params[kRegion].set_string_param(target.region->name());
      params[kByteSize].set_int64_param(static_cast<int64_t>(bytes->size()));
      if (target.offset != 0) {
        params[kOffset].set_int64_param(static_cast<int64_t>(target.offset));
      }
      bytes->clear();
    }
  }
  return absl::OkStatus();
}

}  // namespace temb::kserve
