// The conditioning models' request path: a repository loaded model by model
// (a damaged one refused with its cause while the others serve), requests
// checked field by field, per-token timesteps answered as distinct rows
// and an index, the limits and the admission held before computing.
#include "temb/core/conditioning_service.h"

#include <sys/stat.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "temb/core/model_control.h"
#include "temb/kernels/linear_engine.h"
#include "test_checkpoints.h"

namespace temb {
namespace {

using models::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Message(const absl::Status& status) {
  return std::string(status.message());
}

// A repository with a good model "qwen", a damaged one "broken" and a good
// one named like a preset ("flux"), which the service loads as any other
// (the frontends give it the name).
class ConditioningServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"qwen", "broken", "flux"}) {
      ASSERT_EQ(mkdir(repository_.File(name).c_str(), 0755), 0);
    }
    models::WriteQwenCheckpoint(repository_.File("qwen"));
    models::WriteQwenCheckpoint(repository_.File("broken"), /*bad=*/2);
    models::WriteQwenCheckpoint(repository_.File("flux"));
  }

  std::unique_ptr<ConditioningService> Open(
      ConditioningService::Options options = {}) {
    auto service = std::make_unique<ConditioningService>(options);
    EXPECT_TRUE(service->OpenRepository(repository_.path()).ok());
    EXPECT_TRUE(service->WaitUntilLoaded(absl::Seconds(30)));
    return service;
  }

  TempDir repository_;
};

ConditionInput Timesteps(const std::vector<float>& values,
                         std::vector<int64_t> shape = {}) {
  ConditionInput input;
  input.name = "timesteps";
  input.field = "inputs[0]";
  input.values = values;
  input.shape = shape.empty()
                    ? std::vector<int64_t>{static_cast<int64_t>(values.size())}
                    : shape;
  return input;
}

TEST_F(ConditioningServiceTest, AnUnknownModelsMessageNamesAFewModelsOnly) {
  // 300 folders of 200-byte names: listing them all would pass gRPC's
  // 16 KiB metadata limit, and the caller would read RESOURCE_EXHAUSTED.
  for (int i = 0; i < 300; ++i) {
    const std::string name = absl::StrCat(std::string(196, 'm'), 1000 + i);
    ASSERT_EQ(mkdir(repository_.File(name).c_str(), 0755), 0);
  }
  auto service = Open();
  const std::string unknown = std::string(196, 'm') + "1042x";  // viewed
  ConditionRequest request;
  request.model = unknown;
  request.model_field = "model";
  const std::vector<float> t = {999.0f};
  request.inputs = {Timesteps(t)};
  const auto answer = service->Serve(request, nullptr);
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kNotFound);
  const std::string message = Message(answer.status());
  EXPECT_LT(message.size(), 1024u) << message;
  EXPECT_THAT(message, HasSubstr("303 models; the closest: "));
  EXPECT_THAT(message, HasSubstr(std::string(64, 'm') + "..."));
}

TEST_F(ConditioningServiceTest, EachModelLoadsOrFailsOnItsOwn) {
  auto service = Open();
  const auto models = service->Models();
  ASSERT_EQ(models.size(), 3u);
  EXPECT_EQ(models[0].name, "broken");
  EXPECT_EQ(models[0].state, ModelState::kFailed);
  EXPECT_THAT(models[0].message,
              AllOf(HasSubstr("broken"), HasSubstr("txt_mod")));
  EXPECT_EQ(models[1].name, "flux");
  EXPECT_EQ(models[1].state, ModelState::kReady);
  EXPECT_EQ(models[2].name, "qwen");
  EXPECT_EQ(models[2].state, ModelState::kReady);
  EXPECT_EQ(models[2].family, "qwen-image");
  EXPECT_EQ(models[2].width, 8);
  // The scheduler's timesteps, and the forward's timestep in their place.
  ASSERT_EQ(models[2].inputs.size(), 2u);
  EXPECT_EQ(models[2].inputs[0].name, "timesteps");
  EXPECT_EQ(models[2].inputs[1].name, "timestep");
  EXPECT_EQ(models[2].inputs[1].stands_for, "t_model");
  ASSERT_FALSE(models[2].outputs.empty());
  EXPECT_EQ(models[2].outputs[0].name, "temb");
  EXPECT_EQ(models[2].outputs[0].row_bytes, 8 * 4);

  const std::vector<float> t = {999.0f, 500.0f};
  ConditionRequest request;
  request.model = "broken";
  request.inputs = {Timesteps(t)};
  auto answer = service->Serve(request, nullptr);
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(answer.status()), HasSubstr("failed to load"));
  request.model = "../qwen";
  answer = service->Serve(request, nullptr);
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(answer.status()),
              HasSubstr("3 models; the closest: broken, flux, qwen"));
  request.model = "qwen";
  answer = service->Serve(request, nullptr);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->rows, 2);
  EXPECT_EQ(answer->outputs[0].shape, (std::vector<int64_t>{2, 8}));
}

TEST_F(ConditioningServiceTest, RefusesBadRequestsNamingTheField) {
  auto service = Open();
  const std::vector<float> t = {999.0f, 500.0f};
  const std::vector<float> g = {3.5f};
  ConditionRequest request;
  request.model = "qwen";
  ConditionInput guidance;
  guidance.name = "guidance";
  guidance.field = "inputs[1]";
  guidance.values = g;
  guidance.shape = {1};
  request.inputs = {Timesteps(t), guidance};
  EXPECT_THAT(Message(service->Serve(request, nullptr).status()),
              AllOf(HasSubstr("inputs[1]"), HasSubstr("not an input"),
                    HasSubstr("inputs: timesteps")));
  request.inputs = {Timesteps(t, {3})};
  EXPECT_THAT(Message(service->Serve(request, nullptr).status()),
              AllOf(HasSubstr("inputs[0]"), HasSubstr("shape [3]")));
  request.inputs = {Timesteps(t, {int64_t{1} << 62, 4})};
  EXPECT_THAT(Message(service->Serve(request, nullptr).status()),
              HasSubstr("does not hold the 2 values"));
  // Every protocol's rank bound, here in the core: per token [B, L] up to
  // rank 5.
  request.inputs = {Timesteps(t, {1, 1, 1, 1, 1, 2})};
  EXPECT_THAT(
      Message(service->Serve(request, nullptr).status()),
      AllOf(HasSubstr("inputs[0]"), HasSubstr("has rank 6; at most 5")));
  request.inputs = {Timesteps(t, {1, 1, 1, 1, 2})};
  EXPECT_TRUE(service->Serve(request, nullptr).ok());
  request.inputs = {Timesteps(t), Timesteps(t)};
  EXPECT_THAT(Message(service->Serve(request, nullptr).status()),
              HasSubstr("given twice"));
  request.inputs = {};
  EXPECT_THAT(Message(service->Serve(request, nullptr).status()),
              HasSubstr("timesteps: required"));
  request.inputs = {Timesteps(t)};
  request.outputs = {"temb", "img_mod", "temb"};
  EXPECT_THAT(Message(service->Serve(request, nullptr).status()),
              AllOf(HasSubstr("outputs[2]"), HasSubstr("twice")));
  request.outputs = {"t_emb"};
  EXPECT_THAT(Message(service->Serve(request, nullptr).status()),
              AllOf(HasSubstr("outputs[0]"), HasSubstr("not an output")));
  const std::vector<float> bad = {1.0f, std::nanf("")};
  request.outputs = {};
  request.inputs = {Timesteps(bad)};
  EXPECT_THAT(Message(service->Serve(request, nullptr).status()),
              HasSubstr("must be finite"));
}

TEST_F(ConditioningServiceTest, PerTokenTimestepsGiveDistinctRowsAndAnIndex) {
  auto service = Open();
  // [B = 2, L = 3] with two distinct values.
  const std::vector<float> tokens = {999.0f, 0.0f, 0.0f, 999.0f, 999.0f, 0.0f};
  ConditionRequest request;
  request.model = "qwen";
  request.inputs = {Timesteps(tokens, {2, 3})};
  request.outputs = {"norm_out"};
  auto answer = service->Serve(request, nullptr);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_EQ(answer->outputs.size(), 2u);
  EXPECT_EQ(answer->rows, 2);
  EXPECT_EQ(answer->outputs[0].shape, (std::vector<int64_t>{2, 16}));
  const ConditionOutput& index = answer->outputs[1];
  EXPECT_EQ(index.name, "index");
  EXPECT_TRUE(index.index);
  EXPECT_EQ(index.shape, (std::vector<int64_t>{2, 3}));
  std::vector<int64_t> rows(6);
  std::memcpy(rows.data(), index.data.data(), 48);
  EXPECT_EQ(rows, (std::vector<int64_t>{0, 1, 1, 0, 0, 1}));
  // Each distinct row is the row of the plain request.
  const std::vector<float> plain = {999.0f, 0.0f};
  request.inputs = {Timesteps(plain)};
  auto direct = service->Serve(request, nullptr);
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(direct->outputs[0].data, answer->outputs[0].data);
}

TEST_F(ConditioningServiceTest, LimitsAndAdmissionHoldBeforeComputing) {
  ConditioningService::Options options;
  options.limits.max_batch = 4;
  options.limits.max_output_bytes = 3 * 1024;
  auto service = Open(options);
  std::vector<float> t(5, 1.0f);
  ConditionRequest request;
  request.model = "qwen";
  request.inputs = {Timesteps(t)};
  auto answer = service->Serve(request, nullptr);
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(answer.status()), HasSubstr("max_batch=4"));
  // A row of every output: 8 + 2 * 2 * 48 + 16 floats = 864 bytes.
  t.assign(4, 1.0f);
  request.inputs = {Timesteps(t)};
  answer = service->Serve(request, nullptr);
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(answer.status()), HasSubstr("max_output_bytes=3072"));
  request.outputs = {"norm_out"};
  EXPECT_TRUE(service->Serve(request, nullptr).ok());

  // Admission: the answer and the working memory are reserved first.
  AdmissionLimits admission_limits;
  admission_limits.max_queued_bytes = 256;
  AdmissionController admission(admission_limits);
  auto ticket = admission.Admit(0, absl::InfiniteFuture());
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  answer = service->Serve(request, &*ticket);
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(answer.status()), HasSubstr("max_queued_bytes"));
}

TEST_F(ConditioningServiceTest, RepeatedScheduleComesFromTheCache) {
  auto service = Open();
  std::vector<float> schedule(50);
  for (int i = 0; i < 50; ++i) schedule[i] = 1000.0f - 20.0f * i + 0.25f;
  ConditionRequest request;
  request.model = "qwen";
  request.inputs = {Timesteps(schedule)};
  auto first = service->Serve(request, nullptr);
  ASSERT_TRUE(first.ok());
  const models::RowCacheStats before = service->cache_stats();
  EXPECT_EQ(before.misses, 50);
  auto second = service->Serve(request, nullptr);
  ASSERT_TRUE(second.ok());
  const models::RowCacheStats after = service->cache_stats();
  EXPECT_EQ(after.misses, 50);  // no row computed the second time
  EXPECT_EQ(after.hits, 50);
  for (size_t i = 0; i < first->outputs.size(); ++i) {
    EXPECT_EQ(first->outputs[i].data, second->outputs[i].data);
  }
}

// A LinearEngine whose every Forward throws `Thrown`: what a bug or an
// allocation failure deep in a computation looks like to the service.
template <typename Thrown>
class ThrowingLinearEngine final : public LinearEngine {
 public:
  absl::StatusOr<int> Upload(const LinearWeights& /*weights*/) override {
    return uploads_++;
  }
  absl::Status Forward(int /*id*/, absl::Span<const float> /*x*/,
                       int64_t /*rows*/, DType /*out_dtype*/,
                       absl::Span<float> /*out*/) override {
    if constexpr (std::is_same_v<Thrown, std::bad_alloc>) {
      throw std::bad_alloc();
    } else {
      throw Thrown("unordered_map::at");
    }
  }
  std::string name() const override { return "throwing"; }
  int64_t device_bytes() const override { return 0; }
  bool copies_weights() const override { return true; }

 private:
  std::atomic<int> uploads_{0};
};

TEST_F(ConditioningServiceTest, WhatAComputationThrowsBecomesAStatus) {
  // An exception must not reach gRPC, which would answer UNIMPLEMENTED with
  // no message; the service stays up for the next request.
  const std::vector<float> timesteps = {500.0f};  // the input views it
  ConditionRequest request;
  request.model = "qwen";
  request.inputs = {Timesteps(timesteps)};

  ConditioningService::Options options;
  options.cache_bytes = 0;
  options.linear_engine =
      std::make_shared<ThrowingLinearEngine<std::out_of_range>>();
  auto service = Open(options);
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto answer = service->Serve(request, nullptr);
    EXPECT_EQ(answer.status().code(), absl::StatusCode::kInternal);
    EXPECT_THAT(Message(answer.status()),
                AllOf(HasSubstr("\"qwen\""), HasSubstr("failed to compute"),
                      HasSubstr("unordered_map::at")));
  }

  options.linear_engine =
      std::make_shared<ThrowingLinearEngine<std::bad_alloc>>();
  service = Open(options);
  auto answer = service->Serve(request, nullptr);
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(answer.status()),
              AllOf(HasSubstr("out of memory"), HasSubstr("\"qwen\"")));
}

// A LinearEngine whose first Upload waits until `release` is notified: the
// load of one model that does not end (a folder on a stalled disk).
class StallingLinearEngine final : public LinearEngine {
 public:
  absl::StatusOr<int> Upload(const LinearWeights& /*weights*/) override {
    if (uploads_.fetch_add(1) == 0) {
      stalled.Notify();
      release.WaitForNotification();
    }
    return 0;
  }
  absl::Status Forward(int /*id*/, absl::Span<const float> /*x*/,
                       int64_t /*rows*/, DType /*out_dtype*/,
                       absl::Span<float> /*out*/) override {
    return absl::OkStatus();
  }
  std::string name() const override { return "stalling"; }
  int64_t device_bytes() const override { return 0; }
  bool copies_weights() const override { return false; }

  absl::Notification stalled;
  absl::Notification release;

 private:
  std::atomic<int> uploads_{0};
};

TEST_F(ConditioningServiceTest, AStalledLoadDelaysNoOtherModel) {
  auto engine = std::make_shared<StallingLinearEngine>();
  ConditioningService::Options options;
  options.linear_engine = engine;
  options.load_threads = 2;
  absl::Mutex mu;
  std::vector<std::string> settled;
  options.on_settled = [&](const std::string& name, ModelState,
                           const std::string&) {
    absl::MutexLock lock(&mu);
    settled.push_back(name);
  };
  ConditioningService service(options);
  ASSERT_TRUE(service.OpenRepository(repository_.path()).ok());
  ASSERT_TRUE(
      engine->stalled.WaitForNotificationWithTimeout(absl::Seconds(30)));
  // One of the three is stalled; the other two settle beside it.
  auto two_settled = [&] { return settled.size() == 2; };
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(
        mu.AwaitWithTimeout(absl::Condition(&two_settled), absl::Seconds(30)));
  }
  EXPECT_TRUE(service.loading());
  engine->release.Notify();
  EXPECT_TRUE(service.WaitUntilLoaded(absl::Seconds(30)));
  // on_settled runs outside the service's lock, after the count.
  auto three_settled = [&] { return settled.size() == 3; };
  absl::MutexLock lock(&mu);
  EXPECT_TRUE(
      mu.AwaitWithTimeout(absl::Condition(&three_settled), absl::Seconds(30)));
}

TEST_F(ConditioningServiceTest, ALoadPastItsLimitFailsNamingIt) {
  ConditioningService::Options options;
  options.load_timeout = absl::Nanoseconds(1);
  auto service = Open(options);
  for (const ConditioningModelInfo& model : service->Models()) {
    if (model.name == "broken") continue;  // fails on its own
    EXPECT_EQ(model.state, ModelState::kFailed) << model.name;
    EXPECT_THAT(model.message,
                AllOf(HasSubstr(model.name), HasSubstr("took too long"),
                      HasSubstr("(the load limit is 1ns)")));
  }
}

TEST_F(ConditioningServiceTest, CallbacksRunOnceEveryModelSettled) {
  ConditioningService service({});
  absl::Notification loaded;
  bool loading_when_called = true;
  ASSERT_TRUE(service.OpenRepository(repository_.path()).ok());
  service.CallWhenLoaded([&] {
    loading_when_called = service.loading();
    loaded.Notify();
  });
  ASSERT_TRUE(loaded.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_FALSE(loading_when_called);
  // Registered after loading: called at once.
  bool called = false;
  service.CallWhenLoaded([&] { called = true; });
  EXPECT_TRUE(called);
  // Without a repository there is nothing to wait for.
  ConditioningService empty({});
  bool at_once = false;
  empty.CallWhenLoaded([&] { at_once = true; });
  EXPECT_TRUE(at_once);
}

// Each model folder's temb.json sets the dtype that model computes in; a
// bad one fails that model alone, naming the file and the field.
// The bytes of output "temb" for t = 500 of `model`, or the status.
absl::StatusOr<std::string> TembBytes(const ConditioningService& service,
                                      const std::string& model) {
  static const std::vector<float> kT = {500.0f};
  ConditionRequest request;
  request.model = model;
  request.inputs = {Timesteps(kT)};
  request.outputs = {"temb"};
  auto answer = service.Serve(request, nullptr);
  if (!answer.ok()) return answer.status();
  return answer->outputs[0].data;
}

TEST_F(ConditioningServiceTest, FoldersAddedChangedAndRemovedAreFollowed) {
  auto service = Open();
  const auto before = TembBytes(*service, "qwen");
  ASSERT_TRUE(before.ok()) << before.status();
  // Changed: the folder now asks for bf16; a rescan reloads it.
  models::WriteText(repository_.File("qwen/temb.json"),
                    R"({"torch_dtype": "bfloat16"})");
  // Added, and removed.
  ASSERT_EQ(mkdir(repository_.File("added").c_str(), 0755), 0);
  models::WriteQwenCheckpoint(repository_.File("added"));
  ASSERT_EQ(std::system(("rm -r " + repository_.File("flux")).c_str()), 0);
  service->Rescan();
  ASSERT_TRUE(service->WaitUntilLoaded(absl::Seconds(30)));
  const auto after = TembBytes(*service, "qwen");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->size() * 2, before->size());  // bf16 rows now
  EXPECT_TRUE(TembBytes(*service, "added").ok());
  EXPECT_EQ(TembBytes(*service, "flux").status().code(),
            absl::StatusCode::kNotFound);
  // Nothing changed since: a rescan loads nothing again.
  service->Rescan();
  EXPECT_FALSE(service->loading());
  std::vector<std::string> index;
  for (const auto& entry : service->Index()) {
    index.push_back(absl::StrCat(entry.name, ":", ModelStateName(entry.state)));
  }
  EXPECT_EQ(index, (std::vector<std::string>{"added:ready", "broken:failed",
                                             "qwen:ready"}));
}

TEST_F(ConditioningServiceTest, ModelsLoadAndUnloadOnRequest) {
  auto service = Open();
  ASSERT_TRUE(TembBytes(*service, "qwen").ok());
  ASSERT_TRUE(service->Unload("qwen").ok());
  EXPECT_THAT(Message(TembBytes(*service, "qwen").status()),
              HasSubstr("is unloaded"));
  EXPECT_EQ(service->Index().back().reason, "unloaded");
  // A reload answers once the folder's weights serve.
  ASSERT_TRUE(service->Reload("qwen").ok());
  EXPECT_TRUE(TembBytes(*service, "qwen").ok());
  // A folder that does not load says why; the previous weights still serve.
  models::WriteQwenCheckpoint(repository_.File("qwen"), /*bad=*/2);
  const absl::Status failed = service->Reload("qwen");
  EXPECT_EQ(failed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(failed),
              AllOf(HasSubstr("the reload failed"), HasSubstr("txt_mod")));
  EXPECT_TRUE(TembBytes(*service, "qwen").ok());
  // A new folder loads by name; a name with no folder is NOT_FOUND.
  ASSERT_EQ(mkdir(repository_.File("late").c_str(), 0755), 0);
  models::WriteQwenCheckpoint(repository_.File("late"));
  EXPECT_TRUE(service->Reload("late").ok());
  EXPECT_TRUE(TembBytes(*service, "late").ok());
  EXPECT_EQ(service->Reload("nowhere").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(service->Reload("../qwen").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(service->Unload("nowhere").code(), absl::StatusCode::kNotFound);
}

TEST_F(ConditioningServiceTest, ModelControlFollowsItsMode) {
  auto service = Open();
  {
    ModelControl none(service.get(), ModelControlMode::kNone, absl::Seconds(1));
    EXPECT_THAT(Message(none.Load("qwen")),
                HasSubstr("needs --model_control_mode=explicit"));
    EXPECT_EQ(none.Unload("qwen").code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(none.Index(/*ready_only=*/true).size(), 2u);
    EXPECT_EQ(none.Index(/*ready_only=*/false).size(), 3u);
  }
  {
    // Poll mode finds a new folder by itself.
    ModelControl poll(service.get(), ModelControlMode::kPoll,
                      absl::Milliseconds(20));
    ASSERT_EQ(mkdir(repository_.File("polled").c_str(), 0755), 0);
    models::WriteQwenCheckpoint(repository_.File("polled"));
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (!TembBytes(*service, "polled").ok() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_TRUE(TembBytes(*service, "polled").ok());
    EXPECT_EQ(poll.Load("qwen").code(), absl::StatusCode::kFailedPrecondition);
  }
  ModelControl explicit_control(service.get(), ModelControlMode::kExplicit,
                                absl::Seconds(1));
  EXPECT_TRUE(explicit_control.Unload("qwen").ok());
  EXPECT_TRUE(explicit_control.Load("qwen").ok());
  EXPECT_EQ(ParseModelControlMode("sometimes").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ConditioningServiceRepositoryTest, EachFolderSetsItsOwnTorchDType) {
  TempDir repository;
  for (const char* name : {"as_stored", "in_bf16", "misspelt"}) {
    ASSERT_EQ(mkdir(repository.File(name).c_str(), 0755), 0);
    models::WriteQwenCheckpoint(repository.File(name));
  }
  models::WriteText(repository.File("in_bf16/temb.json"),
                    R"({"torch_dtype": "bfloat16"})");
  models::WriteText(repository.File("misspelt/temb.json"),
                    R"({"torch_type": "bfloat16"})");
  ConditioningService service({});
  ASSERT_TRUE(service.OpenRepository(repository.path()).ok());
  ASSERT_TRUE(service.WaitUntilLoaded(absl::Seconds(30)));
  const auto models = service.Models();
  ASSERT_EQ(models.size(), 3u);
  EXPECT_EQ(models[0].name, "as_stored");
  EXPECT_EQ(models[0].dtype, DType::kFloat32);
  EXPECT_EQ(models[1].name, "in_bf16");
  EXPECT_EQ(models[1].state, ModelState::kReady);
  EXPECT_EQ(models[1].dtype, DType::kBFloat16);
  EXPECT_EQ(models[1].weight_bytes * 2, models[0].weight_bytes);
  EXPECT_EQ(models[1].outputs[0].row_bytes, 8 * 2);
  EXPECT_EQ(models[2].state, ModelState::kFailed);
  EXPECT_THAT(models[2].message, AllOf(HasSubstr("misspelt/temb.json"),
                                       HasSubstr("field \"torch_type\"")));
}

TEST(ConditioningServiceRepositoryTest, RefusesAMissingRepository) {
  ConditioningService service({});
  EXPECT_EQ(service.OpenRepository("/nonexistent/models").code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(service.Models().empty());
}

}  // namespace
}  // namespace temb
