// Triton's system shared memory extension for both KServe v2 frontends:
// clients register POSIX shared memory objects (shm_open keys) as named
// regions, then name a region, a byte size and an offset in a tensor's
// parameters instead of sending its bytes:
//   shared_memory_region     string  a registered region
//   shared_memory_byte_size  int64   bytes of the tensor in the region
//   shared_memory_offset     int64   where they start in the region (0)
// Inputs are read from the region (copied once, as they would be from a
// message); outputs are written into it, and the response then carries the
// output's metadata with those parameters and no data.
//
// No gRPC or HTTP types: the frontends call PrepareSharedMemory before
// kserve::Infer and FinishSharedMemory after it.  CUDA shared memory is not
// supported (registering it is INVALID_ARGUMENT).
#ifndef TEMB_KSERVE_SHARED_MEMORY_H_
#define TEMB_KSERVE_SHARED_MEMORY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "inference/grpc_service.pb.h"
#include "temb/core/admission.h"

namespace temb::kserve {

// One registered region: the shared memory object's descriptor and the
// byte range of it the client named.  Reads and writes go through the
// descriptor (pread/pwrite), never through a mapping, so an owner that
// truncates its object makes a request fail with an error instead of the
// server dying of SIGBUS, and registering maps no memory at all.  Closed
// when the last holder (the registry, or a request using it) lets go, so
// unregistering never pulls a region from under a request in flight.
class SharedMemoryRegion {
 public:
  ~SharedMemoryRegion();
  SharedMemoryRegion(const SharedMemoryRegion&) = delete;
  SharedMemoryRegion& operator=(const SharedMemoryRegion&) = delete;

  const std::string& name() const { return name_; }
  const std::string& key() const { return key_; }
  uint64_t offset() const { return offset_; }
  uint64_t byte_size() const { return byte_size_; }

  // Bytes [at, at + size) of the region (at + size <= byte_size()).
  // FAILED_PRECONDITION when the object is now shorter than that.
  absl::StatusOr<std::string> Read(uint64_t at, uint64_t size) const;
  // Writes `bytes` at `at` of the region (at + size <= byte_size());
  // FAILED_PRECONDITION when the object is now shorter (it is never grown).
  absl::Status Write(uint64_t at, absl::string_view bytes) const;

 private:
  friend class SharedMemoryRegistry;
  SharedMemoryRegion(std::string name, std::string key, uint64_t offset,
                     uint64_t byte_size, int fd)
      : name_(std::move(name)),
        key_(std::move(key)),
        offset_(offset),
        byte_size_(byte_size),
        fd_(fd) {}
  // FAILED_PRECONDITION unless the object still holds [at, at + size).
  absl::Status CheckStillHolds(uint64_t at, uint64_t size) const;

  std::string name_;
  std::string key_;
  uint64_t offset_;
  uint64_t byte_size_;
  int fd_;
};

// Bounds on what clients may register (each region holds one descriptor).
struct SharedMemoryLimits {
  int64_t max_regions = 64;
  size_t max_name_bytes = 256;  // the region's name and the object's key
};

// Thread-safe.
class SharedMemoryRegistry {
 public:
  explicit SharedMemoryRegistry(SharedMemoryLimits limits = {})
      : limits_(limits) {}

  // Registers bytes [offset, offset + byte_size) of the POSIX shared memory
  // object `key` (shm_open) as region `name`.  ALREADY_EXISTS for a name in
  // use; INVALID_ARGUMENT for an empty or too long name or key, a zero
  // size, or a range beyond the object; RESOURCE_EXHAUSTED past
  // max_regions (or when the process has no descriptor left); NOT_FOUND
  // when the object cannot be opened.
  absl::Status Register(const std::string& name, const std::string& key,
                        uint64_t offset, uint64_t byte_size);
  // Forgets region `name` (every region when empty).  NOT_FOUND for an
  // unknown name.
  absl::Status Unregister(const std::string& name);
  // Region `name` (every region when empty), by name.  NOT_FOUND for an
  // unknown name.
  absl::StatusOr<std::vector<std::shared_ptr<const SharedMemoryRegion>>> Status(
      const std::string& name) const;

  absl::StatusOr<std::shared_ptr<const SharedMemoryRegion>> Find(
      absl::string_view name) const;

 private:
  const SharedMemoryLimits limits_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const SharedMemoryRegion>, std::less<>>
      regions_;  // guarded by mu_
};

// Where one output goes (PrepareSharedMemory -> FinishSharedMemory).
struct SharedMemoryOutput {
  std::string name;  // the requested output
  std::shared_ptr<const SharedMemoryRegion> region;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};

// Replaces every input that names a region with its bytes from the region
// (raw_input_contents, in input order; the other inputs must then travel
// raw too), and takes the shared memory parameters off the requested
// outputs into `outputs`.  A request without shared memory parameters is
// left alone and `outputs` stays empty.  INVALID_ARGUMENT naming the field
// (unknown region, range beyond the region, a byte size that is not a
// non-negative int64, shared memory next to typed contents).  Before an
// input is read: its byte size must be what its shape and datatype take
// and at most `max_input_bytes` (RESOURCE_EXHAUSTED naming it), and its
// bytes are reserved from `ticket` (may be null), so that what regions
// hand in is held like message bytes.
absl::Status PrepareSharedMemory(const SharedMemoryRegistry& registry,
                                 uint64_t max_input_bytes,
                                 AdmissionTicket* ticket,
                                 inference::ModelInferRequest* request,
                                 std::vector<SharedMemoryOutput>* outputs);

// Writes each output named in `outputs` into its region and leaves its
// raw_output_contents entry empty (other outputs keep theirs, at the same
// index); its parameters then say where it went: shared_memory_region,
// shared_memory_byte_size (bytes written) and shared_memory_offset.
// INVALID_ARGUMENT when an output is larger than the byte size given.
absl::Status FinishSharedMemory(const std::vector<SharedMemoryOutput>& outputs,
                                inference::ModelInferResponse* response);

// True when any input or requested output of `request` names a region.
bool UsesSharedMemory(const inference::ModelInferRequest& request);

}  // namespace temb::kserve

#endif  // TEMB_KSERVE_SHARED_MEMORY_H_
