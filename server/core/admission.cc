#include "temb/core/admission.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace temb {

AdmissionTicket::AdmissionTicket(AdmissionTicket&& other) noexcept
    : controller_(std::exchange(other.controller_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      answered_(std::exchange(other.answered_, false)) {}

AdmissionTicket& AdmissionTicket::operator=(AdmissionTicket&& other) noexcept {
  if (this != &other) {
    Release();
    controller_ = std::exchange(other.controller_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    answered_ = std::exchange(other.answered_, false);
  }
  return *this;
}

AdmissionTicket::~AdmissionTicket() { Release(); }

void AdmissionTicket::Release() {
  if (controller_ == nullptr) return;
  std::exchange(controller_, nullptr)
      ->Release(std::exchange(bytes_, 0), std::exchange(answered_, false));
}

void AdmissionTicket::MarkAnswered() {
  if (controller_ == nullptr || answered_) return;
  answered_ = true;
  std::lock_guard<std::mutex> lock(controller_->mu_);
  controller_->EndInflightLocked();
}

absl::Status AdmissionTicket::Reserve(int64_t bytes) {
  if (controller_ == nullptr || bytes <= 0) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(controller_->mu_);
  absl::Status status = controller_->ReserveLocked(bytes_, bytes);
  if (status.ok()) bytes_ += bytes;
  return status;
}

absl::string_view AdmissionStateName(AdmissionController::State state) {
  switch (state) {
    case AdmissionController::State::kServing:
      return "serving";
    case AdmissionController::State::kDraining:
      return "draining";
    case AdmissionController::State::kBackendFailed:
      return "backend_failed";
  }
  return "unknown";
}

AdmissionController::AdmissionController(AdmissionLimits limits,
                                         RequestObserver* observer)
    : limits_(limits), observer_(observer) {
  if (observer_ != nullptr) observer_->OnServingChanged("serving");
}

AdmissionController::~AdmissionController() = default;

namespace {

// The payload that marks an overload; its value is unused.
constexpr absl::string_view kOverloadedPayload = "temb/overloaded";

}  // namespace

absl::Status OverloadedError(std::string message) {
  absl::Status status = absl::ResourceExhaustedError(std::move(message));
  status.SetPayload(kOverloadedPayload, absl::Cord());
  return status;
}

bool IsOverloaded(const absl::Status& status) {
  return absl::IsResourceExhausted(status) &&
         status.GetPayload(kOverloadedPayload).has_value();
}

absl::Status AdmissionController::RefuseLocked(absl::string_view reason,
                                               absl::Status status) {
  if (observer_ != nullptr) observer_->OnRejected(reason);
  return status;
}

absl::Status AdmissionController::NotServingLocked() {
  // Remembered so that a drain can wait until clients stop knocking.
  last_refused_ = absl::Now();
  if (state_ == State::kDraining) {
    return RefuseLocked("draining",
                        absl::UnavailableError("server is draining"));
  }
  return RefuseLocked(
      "backend_failed",
      absl::UnavailableError(absl::StrCat(
          "the backend failed and the server stopped serving: ", failure_)));
}

absl::Status AdmissionController::CheckServing() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::kServing) return NotServingLocked();
  return absl::OkStatus();
}

absl::Status AdmissionController::ReserveLocked(int64_t held_by_caller,
                                                int64_t bytes) {
  if (limits_.max_queued_bytes > 0 &&
      bytes_ + bytes > limits_.max_queued_bytes) {
    return RefuseLocked(
        "max_queued_bytes",
        OverloadedError(absl::StrCat(
            "server overloaded: max_queued_bytes (", limits_.max_queued_bytes,
            ") reached; admitted calls hold ", bytes_ - held_by_caller,
            " bytes and this call needs ", held_by_caller + bytes,
            "; retry later or with a smaller batch")));
  }
  bytes_ += bytes;
  return absl::OkStatus();
}

absl::StatusOr<AdmissionTicket> AdmissionController::Admit(
    int64_t bytes, absl::Time deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::kServing) return NotServingLocked();
  if (deadline <= absl::Now()) {
    return RefuseLocked(
        "deadline_exceeded",
        // Worded as gRPC words its own expiry (see call_gate.cc).
        absl::DeadlineExceededError("Deadline Exceeded before the call was "
                                    "admitted; nothing was computed"));
  }
  if (limits_.max_inflight > 0 && inflight_ >= limits_.max_inflight) {
    return RefuseLocked(
        "max_inflight",
        OverloadedError(absl::StrCat(
            "server overloaded: max_inflight (", limits_.max_inflight,
            ") calls are already in flight; retry later")));
  }
  if (bytes < 0) bytes = 0;
  if (absl::Status status = ReserveLocked(0, bytes); !status.ok()) {
    return status;
  }
  ++inflight_;
  ++tickets_;
  return AdmissionTicket(this, bytes);
}

absl::StatusOr<AdmissionTicket> AdmissionController::OpenStream() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::kServing) return NotServingLocked();
  ++tickets_;
  AdmissionTicket ticket(this, 0);
  ticket.answered_ = true;  // holds no in-flight slot
  return ticket;
}

void AdmissionController::EndInflightLocked() { --inflight_; }

void AdmissionController::Release(int64_t bytes, bool answered) {
  std::lock_guard<std::mutex> lock(mu_);
  bytes_ -= bytes;
  if (!answered) EndInflightLocked();
  if (--tickets_ == 0) idle_.notify_all();
}

AdmissionController::State AdmissionController::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

int64_t AdmissionController::inflight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return inflight_;
}

int64_t AdmissionController::held_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

void AdmissionController::SetNotServingListener(
    std::function<void(State)> listener) {
  listener_ = std::move(listener);
}

void AdmissionController::ChangeState(State to, const absl::Status& cause) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::kServing) return;
    state_ = to;
    if (!cause.ok()) failure_ = std::string(cause.message());
  }
  if (observer_ != nullptr) observer_->OnServingChanged(AdmissionStateName(to));
  if (listener_) listener_(to);
}

void AdmissionController::StartDraining() {
  ChangeState(State::kDraining, absl::OkStatus());
}

void AdmissionController::MarkBackendFailed(const absl::Status& cause) {
  ChangeState(State::kBackendFailed, cause);
}

bool AdmissionController::WaitUntilIdle(absl::Time deadline,
                                        absl::Duration quiet) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    const absl::Time now = absl::Now();
    const absl::Time quiet_from = last_refused_ + quiet;
    if (tickets_ == 0 && now >= quiet_from) return true;
    if (now >= deadline) return false;
    // Woken early by the last release; otherwise when the quiet period of
    // the latest refusal would end.
    const absl::Time wake =
        tickets_ == 0 ? std::min(deadline, quiet_from) : deadline;
    idle_.wait_until(lock, absl::ToChronoTime(wake));
  }
}

}  // namespace temb
