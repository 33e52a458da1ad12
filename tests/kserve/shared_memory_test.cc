// System shared memory against owners and clients that misbehave: an object
// truncated after it was registered, a small tensor naming a large region,
// registrations past the limits.  Each must be an error, never a fault.
#include "temb/kserve/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace temb::kserve {
namespace {

using ::testing::HasSubstr;

// max_batch 65536 8-byte timesteps, the default server's largest input.
constexpr uint64_t kMaxInputBytes = uint64_t{65536} * 8;

// A POSIX shared memory object of `bytes` bytes, unlinked at the end.
class SharedObject {
 public:
  explicit SharedObject(off_t bytes)
      : key_(absl::StrCat("/temb-test-", getpid(), "-", counter_++)) {
    fd_ = shm_open(key_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(ftruncate(fd_, bytes), 0);
  }
  ~SharedObject() {
    close(fd_);
    shm_unlink(key_.c_str());
  }
  const std::string& key() const { return key_; }
  void Truncate(off_t bytes) { EXPECT_EQ(ftruncate(fd_, bytes), 0); }

 private:
  static inline int counter_ = 0;
  std::string key_;
  int fd_ = -1;
};

inference::ModelInferRequest InputInRegion(const std::string& region,
                                           int64_t rows, int64_t byte_size) {
  inference::ModelInferRequest request;
  auto* input = request.add_inputs();
  input->set_name("TIMESTEP");
  input->set_datatype("FP32");
  input->add_shape(rows);
  input->add_shape(1);
  auto& params = *input->mutable_parameters();
  params["shared_memory_region"].set_string_param(region);
  params["shared_memory_byte_size"].set_int64_param(byte_size);
  return request;
}

TEST(SharedMemoryTest, AnObjectTruncatedByItsOwnerIsAnErrorNotAFault) {
  SharedObject object(1 << 16);
  SharedMemoryRegistry registry;
  ASSERT_TRUE(registry.Register("in", object.key(), 0, 1 << 16).ok());
  object.Truncate(0);  // what SIGBUS'd a server reading through a mapping

  inference::ModelInferRequest request = InputInRegion("in", 4, 16);
  std::vector<SharedMemoryOutput> outputs;
  const absl::Status read = PrepareSharedMemory(registry, kMaxInputBytes,
                                                nullptr, &request, &outputs);
  EXPECT_EQ(read.code(), absl::StatusCode::kFailedPrecondition) << read;
  EXPECT_THAT(read.message(), HasSubstr("truncated"));

  absl::StatusOr<std::shared_ptr<const SharedMemoryRegion>> region =
      registry.Find("in");
  ASSERT_TRUE(region.ok());
  const absl::Status write = (*region)->Write(0, std::string(64, 'x'));
  EXPECT_EQ(write.code(), absl::StatusCode::kFailedPrecondition) << write;
  // Nothing was written past the end: the object stays empty.
  EXPECT_EQ((*region)->Read(0, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(SharedMemoryTest, ReadsAndWritesWhatTheRegionHolds) {
  SharedObject object(4096);
  SharedMemoryRegistry registry;
  ASSERT_TRUE(registry.Register("r", object.key(), 1000, 100).ok());
  absl::StatusOr<std::shared_ptr<const SharedMemoryRegion>> region =
      registry.Find("r");
  ASSERT_TRUE(region.ok());
  ASSERT_TRUE((*region)->Write(10, "temb").ok());
  absl::StatusOr<std::string> bytes = (*region)->Read(10, 4);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, "temb");
}

TEST(SharedMemoryTest, AnInputsByteSizeIsCheckedBeforeAnythingIsRead) {
  SharedObject object(64 << 20);
  SharedMemoryRegistry registry;
  ASSERT_TRUE(registry.Register("big", object.key(), 0, 64 << 20).ok());
  // A [1, 1] FP32 input takes 4 bytes, not the region's 64 MiB.
  inference::ModelInferRequest request = InputInRegion("big", 1, 64 << 20);
  std::vector<SharedMemoryOutput> outputs;
  const absl::Status status = PrepareSharedMemory(registry, kMaxInputBytes,
                                                  nullptr, &request, &outputs);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("inputs[0].parameters[\"shared_memory_byte_size\"] is "
                        "67108864, but the input's shape and datatype take 4 "
                        "bytes"));
  EXPECT_EQ(request.raw_input_contents_size(), 0);
}

TEST(SharedMemoryTest, AnInputIsBoundedAndHeldInAdmissionBeforeItIsRead) {
  SharedObject object(64 << 20);
  SharedMemoryRegistry registry;
  ASSERT_TRUE(registry.Register("big", object.key(), 0, 64 << 20).ok());
  // Shape and byte size agree, but no valid request is this wide.
  inference::ModelInferRequest wide =
      InputInRegion("big", (64 << 20) / 4, 64 << 20);
  std::vector<SharedMemoryOutput> outputs;
  const absl::Status status =
      PrepareSharedMemory(registry, kMaxInputBytes, nullptr, &wide, &outputs);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("the largest input this server "
                                          "takes is 524288"));
  EXPECT_EQ(wide.raw_input_contents_size(), 0);

  // Within it, the bytes are reserved from the request's admission first.
  AdmissionLimits limits;
  limits.max_queued_bytes = 1000;
  AdmissionController admission(limits);
  absl::StatusOr<AdmissionTicket> ticket =
      admission.Admit(100, absl::InfiniteFuture());
  ASSERT_TRUE(ticket.ok());
  inference::ModelInferRequest held = InputInRegion("big", 512, 2048);
  const absl::Status over =
      PrepareSharedMemory(registry, kMaxInputBytes, &*ticket, &held, &outputs);
  EXPECT_TRUE(IsOverloaded(over)) << over;
  EXPECT_EQ(held.raw_input_contents_size(), 0);
  inference::ModelInferRequest fits = InputInRegion("big", 200, 800);
  EXPECT_TRUE(
      PrepareSharedMemory(registry, kMaxInputBytes, &*ticket, &fits, &outputs)
          .ok());
  EXPECT_EQ(admission.held_bytes(), 900);
}

TEST(SharedMemoryTest, RegistrationsAreBoundedInNumberAndNameLength) {
  SharedObject object(4096);
  SharedMemoryLimits limits;
  limits.max_regions = 3;
  limits.max_name_bytes = 40;  // the test objects' keys are shorter
  SharedMemoryRegistry registry(limits);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(
        registry.Register(absl::StrCat("r", i), object.key(), 0, 16).ok());
  }
  const absl::Status full = registry.Register("r3", object.key(), 0, 16);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("at most 3"));
  ASSERT_TRUE(registry.Unregister("r0").ok());
  EXPECT_TRUE(registry.Register("r3", object.key(), 0, 16).ok());

  const absl::Status long_name =
      registry.Register(std::string(41, 'n'), object.key(), 0, 16);
  EXPECT_EQ(long_name.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(long_name.message(), HasSubstr("at most 40 bytes"));
}

// The lines of /proc/self/maps: the process's memory mappings.
int Mappings() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int count = 0;
  while (std::getline(maps, line)) ++count;
  return count;
}

TEST(SharedMemoryTest, RegisteringMapsNothing) {
  // A server that mapped each region ran out of mappings (about 65k) and
  // aborted; regions now hold descriptors, bounded by max_regions.
  SharedObject object(4096);
  SharedMemoryLimits limits;
  limits.max_regions = 512;
  SharedMemoryRegistry registry(limits);
  const int before = Mappings();
  for (int i = 0; i < 512; ++i) {
    ASSERT_TRUE(
        registry.Register(absl::StrCat("r", i), object.key(), 0, 4096).ok());
  }
  EXPECT_LT(Mappings() - before, 16);
  EXPECT_EQ(registry.Status("").value().size(), 512u);
}

}  // namespace
}  // namespace temb::kserve
