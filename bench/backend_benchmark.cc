// Backend::Compute timings, host memory in and out, for every backend this
// machine can run (bench/run.py --gpu).
//
// The kernel benchmarks time the math alone; a service pays for the whole
// call: on the GPU that adds the uploads, the launch, the download and the
// synchronisation.  This measures exactly what the server calls, per shape,
// with one caller (latency) and with many concurrent callers (throughput),
// so the CPU and CUDA backends can be compared where a router would choose.
// A backend that lends its own output memory (Backend::AllocateOutput, as
// the server uses it) is timed both ways: into ordinary memory, and into the
// memory it lends, as "<name>+lent".
//
//   temb_backend_benchmark [--callers=N] [--seconds=S]
// prints {"backends": {"cpu": "...", "cuda": "..."}, "rows": [{"backend":
// "cpu", "batch": 1, "dim": 320, "latency_us": x, "callers": N,
// "throughput_eps": y}, ...]}.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "temb/kernels/backend.h"
#include "temb/kernels/embedding_spec.h"
#include "temb/kernels/registry.h"

namespace temb {
namespace {

using Clock = std::chrono::steady_clock;

struct Shape {
  int64_t batch;
  int dim;
};

std::vector<float> Timesteps(int64_t batch) {
  std::vector<float> t(batch);
  for (int64_t n = 0; n < batch; ++n)
    t[n] = static_cast<float>((n * 37) % 1000);
  return t;
}

EmbeddingSpec Spec(int dim) {
  EmbeddingSpec spec;
  spec.dim = dim;
  spec.flip_sin_to_cos = true;
  spec.downscale_freq_shift = 0;
  return spec;
}

// An output buffer: ordinary memory, or (`lent`) the backend's own.
class Output {
 public:
  Output(Backend& backend, size_t bytes, bool lent)
      : lent_(lent ? backend.AllocateOutput(bytes) : nullptr),
        ordinary_(lent_ ? 0 : bytes) {}
  absl::Span<uint8_t> span() {
    return lent_ ? lent_->bytes() : absl::MakeSpan(ordinary_);
  }

 private:
  std::unique_ptr<HostBuffer> lent_;
  std::vector<uint8_t> ordinary_;
};

// Median microseconds per call over rounds of `seconds / 7` each.
double LatencyUs(Backend& backend, const Shape& shape, bool lent,
                 double seconds) {
  const EmbeddingSpec spec = Spec(shape.dim);
  const std::vector<float> t = Timesteps(shape.batch);
  Output out(backend, OutputBytes(spec, shape.batch), lent);
  auto call = [&] {
    if (!backend.Compute(spec, t, out.span()).ok()) std::abort();
  };
  for (int i = 0; i < 3; ++i) call();  // warm-up: pools, page faults
  std::vector<double> rounds;
  for (int r = 0; r < 7; ++r) {
    const auto start = Clock::now();
    const auto until = start + std::chrono::duration<double>(seconds / 7);
    int64_t calls = 0;
    do {
      call();
      ++calls;
    } while (Clock::now() < until);
    rounds.push_back(
        std::chrono::duration<double, std::micro>(Clock::now() - start)
            .count() /
        calls);
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[rounds.size() / 2];
}

// Embeddings per second with `callers` threads calling back to back.  Each
// thread gets its output memory and makes one call before the clock starts,
// so that first-call allocations are not part of the figure.
double ThroughputEps(Backend& backend, const Shape& shape, bool lent,
                     int callers, double seconds) {
  const EmbeddingSpec spec = Spec(shape.dim);
  const std::vector<float> t = Timesteps(shape.batch);
  std::atomic<int64_t> calls{0};
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int c = 0; c < callers; ++c) {
    threads.emplace_back([&] {
      Output out(backend, OutputBytes(spec, shape.batch), lent);
      if (!backend.Compute(spec, t, out.span()).ok()) std::abort();
      ++ready;
      while (!go.load()) std::this_thread::yield();
      int64_t mine = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        if (!backend.Compute(spec, t, out.span()).ok()) std::abort();
        ++mine;
      }
      calls += mine;
    });
  }
  while (ready.load() < callers) std::this_thread::yield();
  const auto start = Clock::now();
  go = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& thread : threads) thread.join();
  const double elapsed =
      std::chrono::duration<double>(Clock::now() - start).count();
  return static_cast<double>(calls.load()) * shape.batch / elapsed;
}

int Run(int callers, double seconds) {
  std::vector<std::pair<std::string, std::unique_ptr<Backend>>> backends;
  for (BackendChoice choice : {BackendChoice::kCpu, BackendChoice::kCuda}) {
    if (choice == BackendChoice::kCuda && !CudaUsable()) continue;
    auto backend = CreateBackend(choice);
    if (!backend.ok()) {
      std::fprintf(stderr, "%s\n", backend.status().ToString().c_str());
      return 1;
    }
    backends.emplace_back(std::string(BackendKindName((*backend)->kind())),
                          std::move(*backend));
  }
  std::printf("{\"backends\": {");
  for (size_t i = 0; i < backends.size(); ++i) {
    std::printf("%s\"%s\": \"%s\"", i ? ", " : "", backends[i].first.c_str(),
                backends[i].second->device().c_str());
  }
  std::printf("}, \"rows\": [");
  const Shape kShapes[] = {{1, 320},     {8, 320},     {32, 320},
                           {128, 320},   {1024, 320},  {1, 1280},
                           {32, 1280},   {256, 1280},  {1024, 1280},
                           {4096, 1280}, {16384, 1280}};
  bool first = true;
  for (const Shape& shape : kShapes) {
    for (auto& [name, backend] : backends) {
      const size_t bytes = OutputBytes(Spec(shape.dim), shape.batch);
      const bool lends = backend->AllocateOutput(bytes) != nullptr;
      for (bool lent : {false, true}) {
        if (lent && !lends) continue;
        const double latency = LatencyUs(*backend, shape, lent, seconds);
        const double eps =
            ThroughputEps(*backend, shape, lent, callers, seconds);
        std::printf(
            "%s\n{\"backend\": \"%s%s\", \"batch\": %lld, \"dim\": %d, "
            "\"latency_us\": %.3f, \"callers\": %d, \"throughput_eps\": %.1f}",
            first ? "" : ",", name.c_str(), lent ? "+lent" : "",
            static_cast<long long>(shape.batch), shape.dim, latency, callers,
            eps);
        std::fflush(stdout);
        first = false;
      }
    }
  }
  std::printf("]}\n");
  return 0;
}

}  // namespace
}  // namespace temb

int main(int argc, char** argv) {
  int callers =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  double seconds = 0.7;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--callers=", 10) == 0) {
      callers = std::max(1, std::atoi(argv[i] + 10));
    } else if (std::strncmp(argv[i], "--seconds=", 10) == 0) {
      seconds = std::atof(argv[i] + 10);
    } else {
      std::fprintf(stderr, "usage: %s [--callers=N] [--seconds=S]\n", argv[0]);
      return 2;
    }
  }
  return temb::Run(callers, seconds);
}
