// Live control of a conditioning model repository, as Triton's model
// control: the mode says who changes what is served while the server runs.
//   none      the repository is read once, at start; Load and Unload are
//             refused.
//   poll      the repository is looked at every poll interval: a folder
//             added is loaded, a changed one reloaded, a removed one taken
//             out of service; Load and Unload are refused.
//   explicit  Load (a folder, new or changed) and Unload (a model) are
//             taken; nothing changes otherwise.
// In every mode every folder loads at start, and the index lists the
// repository.  A reload serves the new weights once they are ready; a call
// in flight finishes on the weights it started with.
#ifndef TEMB_CORE_MODEL_CONTROL_H_
#define TEMB_CORE_MODEL_CONTROL_H_

#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "temb/core/conditioning_service.h"

namespace temb {

enum class ModelControlMode { kNone, kPoll, kExplicit };

// "none" | "poll" | "explicit"; INVALID_ARGUMENT naming them otherwise.
absl::StatusOr<ModelControlMode> ParseModelControlMode(absl::string_view text);
absl::string_view ModelControlModeName(ModelControlMode mode);

class ModelControl {
 public:
  // `service` outlives this.  In poll mode a thread rescans the repository
  // every `poll_interval` (positive) until destruction.
  ModelControl(ConditioningService* service, ModelControlMode mode,
               absl::Duration poll_interval);
  ~ModelControl();
  ModelControl(const ModelControl&) = delete;
  ModelControl& operator=(const ModelControl&) = delete;

  ModelControlMode mode() const { return mode_; }
  // Every folder of the repository with its state; `ready_only`: the
  // ready models alone.
  std::vector<ConditioningService::IndexEntry> Index(bool ready_only) const;
  // FAILED_PRECONDITION unless the mode is explicit; then as
  // ConditioningService::Reload and ::Unload.
  absl::Status Load(absl::string_view name);
  absl::Status Unload(absl::string_view name);

 private:
  absl::Status Allowed(absl::string_view what) const;

  ConditioningService* const service_;
  const ModelControlMode mode_;
  absl::Notification stop_;
  std::thread poller_;
};

}  // namespace temb

#endif  // TEMB_CORE_MODEL_CONTROL_H_
