// The admission gate and the bearer-token check, without gRPC.
#include "temb/core/admission.h"

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "temb/core/token_auth.h"

namespace temb {
namespace {

using ::testing::HasSubstr;

absl::Time Later() { return absl::Now() + absl::Seconds(60); }

class CountingObserver final : public RequestObserver {
 public:
  void OnStart(absl::string_view) override {}
  void OnFinish(const RequestRecord&) override {}
  void OnRejected(absl::string_view reason) override {
    reasons.emplace_back(reason);
  }
  void OnServingChanged(absl::string_view state) override {
    states.emplace_back(state);
  }
  std::vector<std::string> reasons;
  std::vector<std::string> states;
};

TEST(AdmissionTest, MaxInflightRefusesAtOnceAndFreesOnRelease) {
  CountingObserver observer;
  AdmissionController admission({/*max_inflight=*/2, 0}, &observer);
  auto a = admission.Admit(10, Later());
  auto b = admission.Admit(10, Later());
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = admission.Admit(10, Later());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("max_inflight (2)"));
  EXPECT_EQ(admission.inflight(), 2);
  *a = AdmissionTicket();  // released
  EXPECT_EQ(admission.inflight(), 1);
  EXPECT_TRUE(admission.Admit(10, Later()).ok());
  EXPECT_EQ(observer.reasons, std::vector<std::string>{"max_inflight"});
}

TEST(AdmissionTest, AnsweredTicketsFreeTheSlotButKeepTheirBytes) {
  AdmissionController admission({/*max_inflight=*/1, /*max_queued_bytes=*/100});
  auto a = admission.Admit(60, Later());
  ASSERT_TRUE(a.ok());
  a->MarkAnswered();
  a->MarkAnswered();  // idempotent
  EXPECT_EQ(admission.inflight(), 0);
  EXPECT_EQ(admission.held_bytes(), 60);
  // The slot is free, the bytes are not: a large call is refused by bytes.
  auto big = admission.Admit(50, Later());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(big.status().message(), HasSubstr("max_queued_bytes"));
  auto small = admission.Admit(40, Later());
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(admission.inflight(), 1);
  // Not idle until every ticket (and its unsent answer) is gone.
  EXPECT_FALSE(admission.WaitUntilIdle(absl::Now() + absl::Milliseconds(20),
                                       absl::ZeroDuration()));
  *a = AdmissionTicket();
  *small = AdmissionTicket();
  EXPECT_EQ(admission.inflight(), 0);
  EXPECT_EQ(admission.held_bytes(), 0);
  EXPECT_TRUE(admission.WaitUntilIdle(absl::Now() + absl::Seconds(1),
                                      absl::ZeroDuration()));
}

TEST(AdmissionTest, QueuedBytesCountRequestsAndReservedResponses) {
  AdmissionController admission({0, /*max_queued_bytes=*/1000});
  auto a = admission.Admit(100, Later());
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->Reserve(700).ok());
  EXPECT_EQ(admission.held_bytes(), 800);
  // The response of a second call would not fit; the call keeps its own.
  auto b = admission.Admit(100, Later());
  ASSERT_TRUE(b.ok());
  const absl::Status reserve = b->Reserve(200);
  EXPECT_EQ(reserve.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(reserve.message(), HasSubstr("max_queued_bytes (1000)"));
  EXPECT_EQ(admission.held_bytes(), 900);
  // A request alone larger than the budget is refused up front.
  EXPECT_EQ(admission.Admit(5000, Later()).status().code(),
            absl::StatusCode::kResourceExhausted);
  *a = AdmissionTicket();
  EXPECT_EQ(admission.held_bytes(), 100);
  *b = AdmissionTicket();
  EXPECT_EQ(admission.held_bytes(), 0);
  EXPECT_EQ(admission.inflight(), 0);
}

TEST(AdmissionTest, MovedTicketsReleaseExactlyOnce) {
  AdmissionController admission({1, 100});
  {
    auto a = admission.Admit(60, Later());
    ASSERT_TRUE(a.ok());
    AdmissionTicket moved = std::move(*a);
    AdmissionTicket again;
    again = std::move(moved);
    EXPECT_EQ(admission.inflight(), 1);
    EXPECT_EQ(admission.held_bytes(), 60);
  }
  EXPECT_EQ(admission.inflight(), 0);
  EXPECT_EQ(admission.held_bytes(), 0);
}

TEST(AdmissionTest, ExpiredDeadlineIsRefusedBeforeTheLimits) {
  CountingObserver observer;
  AdmissionController admission({1, 0}, &observer);
  auto held = admission.Admit(0, Later());
  auto expired = admission.Admit(0, absl::Now() - absl::Milliseconds(1));
  EXPECT_EQ(expired.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(observer.reasons, std::vector<std::string>{"deadline_exceeded"});
}

TEST(AdmissionTest, DrainingRefusesNewWorkAndNotifiesOnce) {
  CountingObserver observer;
  AdmissionController admission({}, &observer);
  int notified = 0;
  admission.SetNotServingListener([&](AdmissionController::State state) {
    EXPECT_EQ(state, AdmissionController::State::kDraining);
    ++notified;
  });
  auto in_flight = admission.Admit(1, Later());
  ASSERT_TRUE(in_flight.ok());
  admission.StartDraining();
  admission.StartDraining();
  admission.MarkBackendFailed(absl::InternalError("late"));  // stays draining
  EXPECT_EQ(notified, 1);
  EXPECT_EQ(admission.state(), AdmissionController::State::kDraining);
  for (const absl::Status& status :
       {admission.CheckServing(), admission.Admit(1, Later()).status()}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(status.message(), HasSubstr("server is draining"));
  }
  EXPECT_EQ(observer.states, (std::vector<std::string>{"serving", "draining"}));
}

TEST(AdmissionTest, BackendFailureIsStickyAndNamesTheCause) {
  AdmissionController admission;
  admission.MarkBackendFailed(absl::InternalError("cuda: device lost"));
  admission.StartDraining();
  EXPECT_EQ(admission.state(), AdmissionController::State::kBackendFailed);
  const absl::Status status = admission.CheckServing();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("cuda: device lost"));
}

TEST(AdmissionTest, WaitUntilIdleWaitsForInflightAndForQuiet) {
  AdmissionController admission;
  auto ticket = admission.Admit(1, Later());
  ASSERT_TRUE(ticket.ok());
  admission.StartDraining();
  // Still in flight: the wait ends at its deadline, not idle.
  EXPECT_FALSE(admission.WaitUntilIdle(absl::Now() + absl::Milliseconds(50),
                                       absl::ZeroDuration()));
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    *ticket = AdmissionTicket();
  });
  EXPECT_TRUE(admission.WaitUntilIdle(absl::Now() + absl::Seconds(30),
                                      absl::ZeroDuration()));
  release.join();
  // A refusal restarts the quiet period: a deadline inside it is not idle.
  EXPECT_FALSE(admission.CheckServing().ok());
  EXPECT_FALSE(admission.WaitUntilIdle(absl::Now() + absl::Milliseconds(20),
                                       absl::Seconds(30)));
  EXPECT_TRUE(admission.WaitUntilIdle(absl::Now() + absl::Seconds(30),
                                      absl::Milliseconds(10)));
}

// An open stream takes no in-flight slot and no bytes, but a drain waits
// for it to end (its next request is refused, which ends it); once draining,
// no stream opens.
TEST(AdmissionTest, OpenStreamsHoldTheDrainButNoSlots) {
  AdmissionController admission({/*max_inflight=*/1, 0});
  auto stream = admission.OpenStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ(admission.inflight(), 0);
  EXPECT_EQ(admission.held_bytes(), 0);
  auto request = admission.Admit(10, Later());
  ASSERT_TRUE(request.ok()) << request.status();  // the one slot is free
  *request = AdmissionTicket();

  admission.StartDraining();
  EXPECT_EQ(admission.OpenStream().status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_FALSE(admission.WaitUntilIdle(absl::Now() + absl::Milliseconds(50),
                                       absl::ZeroDuration()));
  std::thread end([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    *stream = AdmissionTicket();
  });
  EXPECT_TRUE(admission.WaitUntilIdle(absl::Now() + absl::Seconds(30),
                                      absl::ZeroDuration()));
  end.join();
  EXPECT_EQ(admission.inflight(), 0);
}

TEST(TokenVerifierTest, AcceptsOnlyListedBearerTokens) {
  auto verifier = TokenVerifier::FromTokens({"alpha-1", "", "  beta.2  "});
  ASSERT_TRUE(verifier.ok()) << verifier.status();
  EXPECT_TRUE(verifier->Verify("Bearer alpha-1").ok());
  EXPECT_TRUE(verifier->Verify("bearer beta.2").ok());
  for (const char* header :
       {"", "Bearer", "Bearer ", "Bearer alpha", "Bearer alpha-12",
        "Basic alpha-1", "alpha-1", "Bearer beta.2x", "Bearerbeta.2"}) {
    const absl::Status status = verifier->Verify(header);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << header;
    EXPECT_THAT(std::string(status.message()),
                ::testing::Not(HasSubstr("alpha")))
        << header;
  }
}

TEST(TokenVerifierTest, FileRules) {
  const std::string path = ::testing::TempDir() + "/tokens";
  std::ofstream(path) << "\n  first\r\nsecond\n\n";
  auto verifier = TokenVerifier::FromFile(path);
  ASSERT_TRUE(verifier.ok()) << verifier.status();
  EXPECT_TRUE(verifier->Verify("Bearer first").ok());
  EXPECT_TRUE(verifier->Verify("Bearer second").ok());
  std::ofstream(path) << "\n \n";
  EXPECT_EQ(TokenVerifier::FromFile(path).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::ofstream(path) << "two words\n";
  EXPECT_EQ(TokenVerifier::FromFile(path).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Every file flag reports an unreadable file alike (ReadFile): a missing
  // one is NOT_FOUND.
  EXPECT_EQ(TokenVerifier::FromFile(path + ".missing").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace temb
