// AdmissionController: the one gate every request of every frontend passes
// before any work is done for it.
//
// It knows whether the server accepts work at all (serving, draining after
// SIGTERM, or stopped by a failed backend), and it bounds the work held at
// once: requests admitted and not yet answered (max_inflight) and the bytes
// of their requests and responses (max_queued_bytes).  A request beyond a
// limit is refused at once with RESOURCE_EXHAUSTED naming the limit: nothing
// ever waits in an unbounded queue, so memory stays bounded however many
// clients call.  No gRPC types: frontends translate their calls into
// Admit(bytes, deadline) and hold the ticket until the answer is sent.
#ifndef TEMB_CORE_ADMISSION_H_
#define TEMB_CORE_ADMISSION_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "temb/core/request_observer.h"

namespace temb {

struct AdmissionLimits {
  // Requests admitted and not yet answered (being validated or computed).
  // A request whose answer is handed to gRPC no longer counts here, only its
  // bytes do: under load gRPC may finish sending answers well after the
  // client has them, and counting those would refuse calls that a client
  // with bounded concurrency never really has outstanding.  0: unlimited.
  int64_t max_inflight = 0;
  // Bytes of the requests plus the responses of admitted requests.
  // 0: unlimited.
  int64_t max_queued_bytes = 0;
};

class AdmissionController;

// True for a refusal because the server is busy right now (max_inflight,
// max_queued_bytes): worth retrying later, unlike a request over a size
// limit, which is RESOURCE_EXHAUSTED too.  Marked by a status payload, so
// that a protocol maps it (HTTP 429) without reading the message.
bool IsOverloaded(const absl::Status& status);
// RESOURCE_EXHAUSTED with `message`, marked as an overload.
absl::Status OverloadedError(std::string message);

// An admitted request: holds one in-flight slot and its bytes until it is
// destroyed (or reset by assigning an empty ticket); or an open stream (see
// AdmissionController::OpenStream), which holds neither.  Move-only; an
// empty (default-constructed) ticket holds nothing.
class AdmissionTicket {
 public:
  AdmissionTicket() = default;
  AdmissionTicket(AdmissionTicket&& other) noexcept;
  AdmissionTicket& operator=(AdmissionTicket&& other) noexcept;
  ~AdmissionTicket();

  // Adds `bytes` to what this request holds, e.g. its response once the
  // size is known and before it is allocated.  RESOURCE_EXHAUSTED naming
  // max_queued_bytes when that would exceed the limit (the ticket then keeps
  // what it held).  A no-op on an empty ticket.
  absl::Status Reserve(int64_t bytes);

  // The answer is computed and handed over for sending: frees the in-flight
  // slot now, keeps the bytes until the ticket goes.  Idempotent.
  void MarkAnswered();

  bool empty() const { return controller_ == nullptr; }

 private:
  friend class AdmissionController;
  AdmissionTicket(AdmissionController* controller, int64_t bytes)
      : controller_(controller), bytes_(bytes) {}
  void Release();

  AdmissionController* controller_ = nullptr;
  int64_t bytes_ = 0;
  bool answered_ = false;
};

// Thread-safe.
class AdmissionController {
 public:
  enum class State { kServing, kDraining, kBackendFailed };

  // `observer` (may be null, must outlive this) hears OnRejected for every
  // refusal and OnServingChanged for every state change.
  explicit AdmissionController(AdmissionLimits limits = {},
                               RequestObserver* observer = nullptr);
  // Every ticket must be gone first.
  ~AdmissionController();

  // OK while serving; UNAVAILABLE "server is draining" or "the backend
  // failed ..." otherwise.  For calls that do no computation (metadata).
  absl::Status CheckServing();

  // Admits one request carrying `bytes` (its request message).  In order:
  // UNAVAILABLE when not serving; DEADLINE_EXCEEDED when `deadline` has
  // passed (the request is never computed); RESOURCE_EXHAUSTED naming
  // max_inflight or max_queued_bytes.  Never blocks.
  absl::StatusOr<AdmissionTicket> Admit(int64_t bytes, absl::Time deadline);

  // For opening a stream: UNAVAILABLE when not serving; otherwise a ticket
  // to hold while the stream is open.  It takes no in-flight slot and no
  // bytes, but a drain waits for it like for a request (WaitUntilIdle):
  // the stream's next request is refused with UNAVAILABLE, which ends the
  // stream and sends its client to a serving replica, where stopping gRPC
  // would cancel it instead.
  absl::StatusOr<AdmissionTicket> OpenStream();

  State state() const;
  bool serving() const { return state() == State::kServing; }
  int64_t inflight() const;
  int64_t held_bytes() const;
  const AdmissionLimits& limits() const { return limits_; }

  // Serving -> draining: every later call is refused with UNAVAILABLE.
  // Idempotent; a failed backend stays failed.
  void StartDraining();
  // Serving -> backend failed, for good: the process needs a restart (or a
  // working device).  `cause` goes into every later refusal.
  void MarkBackendFailed(const absl::Status& cause);

  // Called (outside the lock) on every state change away from serving.  Set
  // once, before requests arrive.
  void SetNotServingListener(std::function<void(State)> listener);

  // Blocks until every ticket is gone (answers sent, streams ended) and no
  // call was refused for `quiet`
  // (the clients have noticed and gone elsewhere), or until `deadline`.
  // True when idle.  Meant for draining: see App::Shutdown.
  bool WaitUntilIdle(absl::Time deadline, absl::Duration quiet);

 private:
  friend class AdmissionTicket;

  absl::Status RefuseLocked(absl::string_view reason, absl::Status status);
  absl::Status NotServingLocked();
  absl::Status ReserveLocked(int64_t held_by_caller, int64_t bytes);
  void EndInflightLocked();
  void Release(int64_t bytes, bool answered);
  void ChangeState(State to, const absl::Status& cause);

  const AdmissionLimits limits_;
  RequestObserver* const observer_;
  std::function<void(State)> listener_;

  mutable std::mutex mu_;
  std::condition_variable idle_;
  State state_ = State::kServing;  // guarded by mu_
  std::string failure_;            // guarded by mu_
  int64_t inflight_ = 0;           // guarded by mu_
  int64_t tickets_ = 0;            // live tickets; guarded by mu_
  int64_t bytes_ = 0;              // guarded by mu_
  absl::Time last_refused_ = absl::InfinitePast();  // guarded by mu_
};

absl::string_view AdmissionStateName(AdmissionController::State state);

}  // namespace temb

#endif  // TEMB_CORE_ADMISSION_H_
