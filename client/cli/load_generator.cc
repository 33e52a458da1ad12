#include "temb/cli/load_generator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <random>
#include <thread>
#include <utility>

namespace temb::cli {

int64_t LoadResult::requests() const {
  int64_t total = ok;
  for (const auto& [code, count] : errors) total += count;
  return total;
}

int64_t LoadResult::LatencyQuantileNs(double q) const {
  if (latencies_ns.empty()) return 0;
  const double rank = std::ceil(q * static_cast<double>(latencies_ns.size()));
  const size_t index = static_cast<size_t>(std::max(rank, 1.0)) - 1;
  return latencies_ns[std::min(index, latencies_ns.size() - 1)];
}

// One stream slot: the stream that currently serves it, replaced by a fresh
// one when it ends (for example when the server drains).
struct LoadGenerator::StreamSlot {
  std::mutex mu;
  std::shared_ptr<StreamReactor> reactor;
};

// One EmbedStream.  Requests queue up behind the single outstanding write
// gRPC allows; answers arrive in order, so a FIFO of scheduled start times
// pairs each answer with its call.  Keeps itself alive until OnDone.
class LoadGenerator::StreamReactor
    : public grpc::ClientBidiReactor<v1::EmbedRequest,
                                     v1::EmbedStreamResponse> {
 public:
  StreamReactor(LoadGenerator* owner, int slot) : owner_(owner), slot_(slot) {}

  void Start(std::shared_ptr<StreamReactor> self) {
    self_ = std::move(self);
    const LoadOptions& o = owner_->options_;
    if (o.requests == 0) {
      // The stream lives for the whole run; a hung server still ends it.
      context_.set_deadline(
          absl::ToChronoTime(absl::Now() + o.warmup + o.duration +
                             owner_->client_->options().deadline));
    }
    owner_->client_->AddCallMetadata(&context_);
    owner_->client_->NextStub()->async()->EmbedStream(&context_, this);
    StartRead(&response_);
    StartCall();
  }

  // False when this stream has ended or is closing: open a new one.
  bool Send(Clock::time_point intended) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || closing_) return false;
    awaiting_.push_back(intended);
    if (writing_) {
      ++unwritten_;
    } else {
      writing_ = true;
      StartWrite(&owner_->request_);
    }
    return true;
  }

  // No more requests: lets the server end the stream once it has answered.
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || closing_) return;
    closing_ = true;
    if (!writing_) StartWritesDone();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ok) {  // the stream broke; OnDone fails what is still waiting
      writing_ = false;
      return;
    }
    if (unwritten_ > 0) {
      --unwritten_;
      StartWrite(&owner_->request_);
    } else {
      writing_ = false;
      if (closing_) StartWritesDone();
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // end of stream; OnDone follows
    const int code = response_.has_error() ? response_.error().code() : 0;
    Clock::time_point intended;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (awaiting_.empty()) return;  // an answer nobody asked for: ignore
      intended = awaiting_.front();
      awaiting_.pop_front();
    }
    owner_->OnComplete(intended, slot_, code);
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    std::deque<Clock::time_point> orphans;
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
      orphans.swap(awaiting_);
    }
    // A stream that ended cleanly with calls unanswered broke the protocol.
    const int code = status.ok() ? grpc::StatusCode::INTERNAL
                                 : static_cast<int>(status.error_code());
    for (Clock::time_point intended : orphans) {
      owner_->OnComplete(intended, slot_, code);
    }
    LoadGenerator* owner = owner_;
    // Released after the lock below: may delete this.
    std::shared_ptr<StreamReactor> keep = std::move(self_);
    // Notify under the lock: once Run() sees zero live streams the
    // generator (and its condition variable) may be destroyed.
    std::lock_guard<std::mutex> lock(owner->mu_);
    --owner->live_streams_;
    owner->cv_.notify_all();
  }

 private:
  LoadGenerator* const owner_;
  const int slot_;
  grpc::ClientContext context_;
  v1::EmbedStreamResponse response_;
  std::shared_ptr<StreamReactor> self_;

  std::mutex mu_;
  std::deque<Clock::time_point> awaiting_;  // sent or queued, unanswered
  int64_t unwritten_ = 0;  // queued behind the outstanding write
  bool writing_ = false;
  bool closing_ = false;
  bool finished_ = false;
};

LoadGenerator::LoadGenerator(Client* client, v1::EmbedRequest request,
                             LoadOptions options)
    : LoadGenerator(client, std::move(request), std::nullopt, options) {}

LoadGenerator::LoadGenerator(Client* client, v1::ConditionRequest request,
                             LoadOptions options)
    : LoadGenerator(client, v1::EmbedRequest(), std::move(request), options) {}

LoadGenerator::LoadGenerator(Client* client, v1::EmbedRequest request,
                             std::optional<v1::ConditionRequest> condition,
                             LoadOptions options)
    : client_(client),
      request_(std::move(request)),
      condition_(std::move(condition)),
      options_(options) {
  for (int i = 0; i < std::max(options_.concurrency, 1); ++i) {
    slots_.push_back(std::make_unique<StreamSlot>());
  }
}

LoadGenerator::~LoadGenerator() = default;

bool LoadGenerator::Admit(Clock::time_point intended) {
  if (intended < measure_start_) return true;  // warm-up: made, not counted
  if (options_.requests > 0) {
    return admitted_.fetch_add(1, std::memory_order_relaxed) <
           options_.requests;
  }
  return intended < end_;
}

void LoadGenerator::Issue(Clock::time_point intended, int slot) {
  if (options_.mode == LoadOptions::Mode::kStream) {
    StreamSlot& s = *slots_[slot];
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.reactor == nullptr || !s.reactor->Send(intended)) {
      s.reactor = std::make_shared<StreamReactor>(this, slot);
      {
        std::lock_guard<std::mutex> count_lock(mu_);
        ++live_streams_;
      }
      s.reactor->Start(s.reactor);
      s.reactor->Send(intended);
    }
    return;
  }
  if (condition_.has_value()) {
    struct ConditionCall {
      grpc::ClientContext context;
      v1::ConditionResponse response;
    };
    auto* call = new ConditionCall;
    client_->ConfigureContext(&call->context);
    client_->NextStub()->async()->Condition(
        &call->context, &*condition_, &call->response,
        [this, call, intended, slot](grpc::Status status) {
          delete call;
          OnComplete(intended, slot, static_cast<int>(status.error_code()));
        });
    return;
  }
  struct UnaryCall {
    grpc::ClientContext context;
    v1::EmbedResponse response;
  };
  auto* call = new UnaryCall;
  client_->ConfigureContext(&call->context);
  client_->NextStub()->async()->Embed(
      &call->context, &request_, &call->response,
      [this, call, intended, slot](grpc::Status status) {
        delete call;
        OnComplete(intended, slot, static_cast<int>(status.error_code()));
      });
}

void LoadGenerator::OnComplete(Clock::time_point intended, int slot, int code) {
  const Clock::time_point now = Clock::now();
  (code == 0 ? progress_.completed : progress_.failed)
      .fetch_add(1, std::memory_order_relaxed);
  // Closed loop: this worker's next call starts now.  Deciding before the
  // bookkeeping below keeps `outstanding_` from touching zero in between.
  const bool next = options_.rate <= 0 && Admit(now);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (intended >= measure_start_) {
      if (code == 0) {
        ++result_.ok;
        result_.latencies_ns.push_back(
            std::chrono::duration_cast<std::chrono::nanoseconds>(now - intended)
                .count());
      } else {
        ++result_.errors[code];
      }
      last_completion_ = std::max(last_completion_, now);
    }
    if (!next) {
      --outstanding_;
      // Under the lock, for the same reason as in StreamReactor::OnDone.
      cv_.notify_all();
    }
  }
  if (next) Issue(now, slot);
}

void LoadGenerator::RunOpenLoop() {
  std::mt19937_64 rng(std::random_device{}());
  std::exponential_distribution<double> gap(options_.rate);
  Clock::time_point next = Clock::now();
  int slot = 0;
  while (Admit(next)) {
    std::this_thread::sleep_until(next);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++outstanding_;
    }
    Issue(next, slot);
    slot = (slot + 1) % static_cast<int>(slots_.size());
    const double seconds = options_.poisson ? gap(rng) : 1.0 / options_.rate;
    next += std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(seconds));
  }
}

void LoadGenerator::CloseStreams() {
  for (auto& slot : slots_) {
    std::lock_guard<std::mutex> lock(slot->mu);
    if (slot->reactor != nullptr) slot->reactor->Close();
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return live_streams_ == 0; });
}

LoadResult LoadGenerator::Run() {
  const Clock::time_point start = Clock::now();
  measure_start_ = start + absl::ToChronoNanoseconds(options_.warmup);
  end_ = measure_start_ + absl::ToChronoNanoseconds(options_.duration);
  last_completion_ = measure_start_;
  if (options_.rate > 0) {
    RunOpenLoop();
  } else {
    for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
      if (!Admit(start)) break;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++outstanding_;
      }
      Issue(start, i);
    }
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return outstanding_ == 0; });
  }
  CloseStreams();
  std::lock_guard<std::mutex> lock(mu_);
  result_.seconds =
      std::chrono::duration<double>(last_completion_ - measure_start_).count();
  std::sort(result_.latencies_ns.begin(), result_.latencies_ns.end());
  return std::move(result_);
}

}  // namespace temb::cli
