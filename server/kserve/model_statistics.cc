#include "temb/kserve/model_statistics.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "temb/base/quoted.h"
#include "temb/kserve/kserve_convert.h"

namespace temb::kserve {
namespace {

// Relaxed atomics, written and read under the entry's lock: a reader sees
// every counter of a request or none (perf_analyzer refuses statistics
// whose compute counts differ, and a half-recorded request made them).
struct Duration {
  std::atomic<uint64_t> count{0};
  std::atomic<uint64_t> ns{0};

  void Add(int64_t ns_value) {
    count.fetch_add(1, std::memory_order_relaxed);
    ns.fetch_add(static_cast<uint64_t>(ns_value < 0 ? 0 : ns_value),
                 std::memory_order_relaxed);
  }
  void Fill(inference::StatisticDuration* out) const {
    out->set_count(count.load(std::memory_order_relaxed));
    out->set_ns(ns.load(std::memory_order_relaxed));
  }
};

uint64_t NowMillisSinceEpoch() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count());
}

}  // namespace

struct InferenceStatistics::Entry {
  std::string name;
  // One request's counters change together (Record), and are read
  // together (Fill).
  mutable absl::Mutex mu;
  std::atomic<uint64_t> last_inference{0};
  std::atomic<uint64_t> inference_count{0};
  std::atomic<uint64_t> execution_count{0};
  Duration success;
  Duration fail;
  Duration phases[4];  // indexed by InferPhase
};

InferenceStatistics::InferenceStatistics(
    const std::vector<std::string>& models) {
  for (const std::string& name : models) {
    auto entry = std::make_unique<Entry>();
    entry->name = name;
    entries_.push_back(std::move(entry));
  }
}

InferenceStatistics::~InferenceStatistics() = default;

InferenceStatistics::Entry* InferenceStatistics::Find(
    absl::string_view name) const {
  for (const auto& entry : entries_) {
    if (entry->name == name) return entry.get();
  }
  return nullptr;
}

void InferenceStatistics::Record(absl::string_view model, bool success,
                                 int64_t batch, int64_t total_ns,
                                 const int64_t (&phase_ns)[4]) {
  Entry* entry = Find(model);
  if (entry == nullptr) return;
  absl::MutexLock lock(&entry->mu);
  if (!success) {
    entry->fail.Add(total_ns);
    return;
  }
  entry->success.Add(total_ns);
  for (int i = 0; i < 4; ++i) entry->phases[i].Add(phase_ns[i]);
  entry->inference_count.fetch_add(static_cast<uint64_t>(batch < 0 ? 0 : batch),
                                   std::memory_order_relaxed);
  entry->execution_count.fetch_add(1, std::memory_order_relaxed);
  entry->last_inference.store(NowMillisSinceEpoch(), std::memory_order_relaxed);
}

absl::Status InferenceStatistics::Fill(
    absl::string_view name, absl::string_view version,
    inference::ModelStatisticsResponse* response) const {
  std::vector<const Entry*> selected;
  if (name.empty()) {
    if (!version.empty() && version != kModelVersion) {
      return absl::NotFoundError(
          "every model has only version \"1\"; ask for version \"1\" or none");
    }
    for (const auto& entry : entries_) selected.push_back(entry.get());
  } else {
    const Entry* entry = Find(name);
    if (entry == nullptr) {
      return absl::NotFoundError(absl::StrCat("unknown model ", Quoted(name)));
    }
    if (!version.empty() && version != kModelVersion) {
      return absl::NotFoundError(absl::StrCat(
          "model ", Quoted(name), " has no version ", Quoted(version),
          "; its only version is \"", kModelVersion, "\""));
    }
    selected.push_back(entry);
  }
  for (const Entry* entry : selected) {
    absl::MutexLock lock(&entry->mu);
    inference::ModelStatistics* out = response->add_model_stats();
    out->set_name(entry->name);
    out->set_version(kModelVersion);
    out->set_last_inference(
        entry->last_inference.load(std::memory_order_relaxed));
    out->set_inference_count(
        entry->inference_count.load(std::memory_order_relaxed));
    out->set_execution_count(
        entry->execution_count.load(std::memory_order_relaxed));
    inference::InferStatistics* stats = out->mutable_inference_stats();
    entry->success.Fill(stats->mutable_success());
    entry->fail.Fill(stats->mutable_fail());
    entry->phases[static_cast<int>(InferPhase::kQueue)].Fill(
        stats->mutable_queue());
    entry->phases[static_cast<int>(InferPhase::kComputeInput)].Fill(
        stats->mutable_compute_input());
    entry->phases[static_cast<int>(InferPhase::kComputeInfer)].Fill(
        stats->mutable_compute_infer());
    entry->phases[static_cast<int>(InferPhase::kComputeOutput)].Fill(
        stats->mutable_compute_output());
    // No response cache: cache_hit and cache_miss stay zero (present, so
    // that clients reading them find them).
    stats->mutable_cache_hit();
    stats->mutable_cache_miss();
  }
  return absl::OkStatus();
}

}  // namespace temb::kserve
