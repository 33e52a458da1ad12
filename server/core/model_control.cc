#include "temb/core/model_control.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace temb {

absl::StatusOr<ModelControlMode> ParseModelControlMode(absl::string_view text) {
  if (text == "none") return ModelControlMode::kNone;
  if (text == "poll") return ModelControlMode::kPoll;
  if (text == "explicit") return ModelControlMode::kExplicit;
  return absl::InvalidArgumentError(absl::StrCat(
      "must be none, poll or explicit, got \"", text.substr(0, 64), "\""));
}

absl::string_view ModelControlModeName(ModelControlMode mode) {
  switch (mode) {
    case ModelControlMode::kNone:
      return "none";
    case ModelControlMode::kPoll:
      return "poll";
    case ModelControlMode::kExplicit:
      return "explicit";
  }
  return "none";
}

ModelControl::ModelControl(ConditioningService* service, ModelControlMode mode,
                           absl::Duration poll_interval)
    : service_(service), mode_(mode) {
  if (mode_ == ModelControlMode::kPoll) {
    poller_ = std::thread([this, poll_interval] {
      while (!stop_.WaitForNotificationWithTimeout(poll_interval)) {
        service_->Rescan();
      }
    });
  }
}

ModelControl::~ModelControl() {
  stop_.Notify();
  if (poller_.joinable()) poller_.join();
}

std::vector<ConditioningService::IndexEntry> ModelControl::Index(
    bool ready_only) const {
  std::vector<ConditioningService::IndexEntry> index = service_->Index();
  if (!ready_only) return index;
  std::vector<ConditioningService::IndexEntry> ready;
  for (auto& entry : index) {
    if (entry.state == ModelState::kReady) ready.push_back(std::move(entry));
  }
  return ready;
}

absl::Status ModelControl::Allowed(absl::string_view what) const {
  if (mode_ == ModelControlMode::kExplicit) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, " needs --model_control_mode=explicit; this server's is ",
      ModelControlModeName(mode_),
      mode_ == ModelControlMode::kPoll
          ? " (it follows the repository's folders by itself)"
          : " (the repository was read at start)"));
}

absl::Status ModelControl::Load(absl::string_view name) {
  if (absl::Status allowed = Allowed("loading a model"); !allowed.ok()) {
    return allowed;
  }
  return service_->Reload(name);
}

absl::Status ModelControl::Unload(absl::string_view name) {
  if (absl::Status allowed = Allowed("unloading a model"); !allowed.ok()) {
    return allowed;
  }
  return service_->Unload(name);
}

}  // namespace temb
