// ConditioningService: the conditioning models a server serves, and the one
// request path of every frontend that serves them (native temb.v1, KServe
// v2 over gRPC and REST, the CLI's in-process mode).  A model repository is
// a folder of diffusers model folders; each subfolder is a model named after
// it (temb/models/conditioning_model.h computes it).  Models load in the
// background, several at a time (Options::load_threads), each on its own
// and within its own time limit: one that fails or is slow is reported
// with its cause and never delays the others.  No gRPC types here: frontends
// convert their messages to ConditionRequest and back.
#ifndef TEMB_CORE_CONDITIONING_SERVICE_H_
#define TEMB_CORE_CONDITIONING_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "temb/core/admission.h"
#include "temb/kernels/embedding_spec.h"
#include "temb/models/conditioning_model.h"
#include "temb/models/row_cache.h"

namespace temb {

// The standard inputs' names in every protocol; a family's extras keep
// their own (e.g. "resolution").  The model's description calls them "t",
// "guidance" and "pooled".
inline constexpr absl::string_view kConditionTimesteps = "timesteps";
// The transformer forward's own timestep, given instead of "timesteps" by
// a caller that captured it (the description's input "timestep", which
// stands for a value computed from t).
inline constexpr absl::string_view kConditionForwardTimestep = "timestep";
// The timestep the time embedder receives, given instead of "timesteps"
// where that is not the forward's (families::EmbedderTimestep).
inline constexpr absl::string_view kConditionEmbedderTimestep =
    "embedder_timestep";
inline constexpr absl::string_view kConditionGuidance = "guidance";
inline constexpr absl::string_view kConditionPooled = "pooled_projections";
// The output that maps each per-token timestep to its row (see
// ConditionRequest).
inline constexpr absl::string_view kConditionIndex = "index";
// The highest rank of an input's shape in every protocol: per-token
// timesteps as [B, L] and the video layouts some models use.
inline constexpr size_t kMaxConditionInputRank = 5;
// Names a model folder may have: they become URL path segments and metric
// labels.
inline constexpr size_t kMaxModelNameBytes = 128;

// kUnloaded: taken out of service (RepositoryModelUnload); its folder
// stays in the repository.
enum class ModelState { kLoading, kReady, kFailed, kUnloaded };
absl::string_view ModelStateName(ModelState state);  // "loading" | ...

// What a model's description says it takes and gives, with protocol names.
struct ConditioningModelInfo {
  std::string name;
  std::string directory;
  ModelState state = ModelState::kLoading;
  std::string message;  // why it failed (or why its last reload did)
  // Set once ready:
  std::string family;
  DType dtype = DType::kFloat32;
  int64_t width = 0;
  int64_t weight_bytes = 0;
  // Checkpoint name -> models::WeightFingerprint of the tensor.
  std::map<std::string, std::string> weight_fingerprints;
  std::vector<models::InputInfo> inputs;  // protocol names
  std::vector<models::OutputInfo> outputs;
  std::vector<models::FoldedModuleInfo> folded_modules;
  std::string class_name;
  std::map<std::string, std::string> config;  // field -> JSON text
  std::vector<std::string> embedder_results;
};

// One input of a request: protocol name, where it sits in the caller's
// message (for errors), float32 values and their shape.
struct ConditionInput {
  std::string name;
  std::string field;
  absl::Span<const float> values;
  std::vector<int64_t> shape;
};

// A request: N timesteps ([N]) with their other inputs ([N] or [N, W], or
// one value or row that every timestep shares), or per-token timesteps
// (rank 2 or more, e.g. Wan 2.2 TI2V's [B, L]) whose other inputs are
// shared: the answer then holds the rows of the distinct timesteps, in
// order of first appearance, and an int64 "index" output of the
// timesteps' shape mapping each to its row.
struct ConditionRequest {
  absl::string_view model;
  absl::string_view request_id;
  std::vector<ConditionInput> inputs;
  std::vector<std::string> outputs;  // empty: all of the model's
  // How the caller's protocol spells its fields in messages.
  absl::string_view model_field = "model";
  absl::string_view outputs_field = "outputs";
};

struct ConditionOutput {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  bool index = false;  // "index": int64 elements, not dtype's
  std::string data;    // little-endian elements
};

struct ConditionResponse {
  std::string model;
  std::vector<ConditionOutput> outputs;
  int64_t rows = 0;          // rows computed or taken from the cache
  int64_t output_bytes = 0;  // of every output
};

class ConditioningService {
 public:
  struct Options {
    Limits limits;
    // Threads of one computation.
    int threads = 1;
    // Bytes of the exact row cache shared by every model (0: no cache).
    int64_t cache_bytes = int64_t{256} << 20;
    // Where the models' Linear layers run (null: the CPU).
    std::shared_ptr<LinearEngine> linear_engine;
    // Whether the repository is ready (RepositoryReady) with failed models
    // in it; false: strict, every model must be ready.
    bool serve_ready_models = false;
    // Models loading at once (at least 1): a slow or stuck folder holds one
    // of these threads, and the other models load beside it.
    int load_threads = 4;
    // How long one model's load may take: past it, the load stops before
    // its next tensor and the model fails, naming the limit.  Infinite: no
    // limit.
    absl::Duration load_timeout = absl::InfiniteDuration();
    // Called each time a model's load settles (ready, or failed with why;
    // a failed reload is kFailed with "the reload failed: ..." while the
    // previous weights still serve) and when one leaves service (kUnloaded:
    // unloaded, or its folder removed), outside the service's lock: the app
    // logs it.
    std::function<void(const std::string& name, ModelState state,
                       const std::string& message)>
        on_settled;
    // Called once per entry of the repository that is not a model folder
    // (a plain file, a broken link, a loop of links; hidden entries are
    // not reported), with why: the app logs it.
    std::function<void(const std::string& entry, const std::string& why)>
        on_skipped;
  };

  // A service without models (no repository).
  explicit ConditioningService(Options options);
  // StopLoading().
  ~ConditioningService();

  // One model of the repository as its index lists it (RepositoryIndex).
  struct IndexEntry {
    std::string name;
    ModelState state = ModelState::kUnloaded;
    std::string reason;
  };

  // Lists `repository`'s subfolders and starts loading them in the
  // background, in name order, Options::load_threads at a time.  NOT_FOUND or
  // INVALID_ARGUMENT when the repository itself cannot be read; a subfolder
  // whose name is not a model name ([A-Za-z0-9][A-Za-z0-9._-]*, up to
  // kMaxModelNameBytes) is listed as failed with the reason.  A folder may
  // carry a preset's name: the model then takes that name wherever a name means
  // one model (KServe, REST, Condition), and the preset keeps it for Embed.
  absl::Status OpenRepository(const std::string& repository);

  // Blocks until no model is loading, or until `timeout`; whether all
  // settled.
  bool WaitUntilLoaded(absl::Duration timeout) const;
  // Whether any model is still loading.
  bool loading() const;
  // Readiness of the repository as a whole: no model loading, and (unless
  // Options::serve_ready_models) none failed.
  bool RepositoryReady() const;
  // Runs `callback` once no model is loading: now, or on a loading thread
  // when the last model settles (never after StopLoading).  For readiness
  // probes.
  void CallWhenLoaded(std::function<void()> callback);
  // Models not yet loaded fail ("the server stopped"), those loading stop
  // before their next tensor; returns when the loading threads have ended.
  // Idempotent.
  void StopLoading();

  // Live control of the repository (model_control.h calls these):
  // Rescan() picks up the folders added (loaded), removed (out of service)
  // and changed (reloaded: config, index or weights files of another size
  // or modification time) since the last look.  Reload() (re)loads one
  // folder and returns when it settled: OK once its new weights serve, else
  // why not (the previous weights, if any, still serve).  Unload() takes a
  // model out of service; calls in flight finish.  Index() lists every
  // folder of the repository with its state.
  void Rescan();
  absl::Status Reload(absl::string_view name);
  absl::Status Unload(absl::string_view name);
  std::vector<IndexEntry> Index() const;

  std::vector<ConditioningModelInfo> Models() const;
  // NOT_FOUND for a name that is not a model of the repository.
  absl::StatusOr<ConditioningModelInfo> Model(absl::string_view name) const;
  bool has_model(absl::string_view name) const;

  // Thread-safe.  NOT_FOUND naming the model for an unknown one,
  // FAILED_PRECONDITION for one that is loading or failed to load;
  // INVALID_ARGUMENT naming the input, index or output; RESOURCE_EXHAUSTED
  // naming the limit (max_batch timesteps, max_output_bytes, and with a
  // `ticket`, max_queued_bytes for the answer and the computation's working
  // memory, reserved before either is allocated).
  absl::StatusOr<ConditionResponse> Serve(const ConditionRequest& request,
                                          AdmissionTicket* ticket) const;

  models::RowCacheStats cache_stats() const;
  const Limits& limits() const { return options_.limits; }

 private:
  struct Entry;
  struct Served;
  // The loading threads: each takes the next queued entry until stopping.
  void LoadLoop();
  void LoadOne(const std::shared_ptr<Entry>& entry);
  // Queues a load of `entry` unless one is queued or running.
  void QueueLoad(const std::shared_ptr<Entry>& entry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new entry for folder `name`, failed where the name is not a model
  // name (then reported in `refused`).
  std::shared_ptr<Entry> NewEntry(
      const std::string& name,
      std::vector<std::pair<std::string, std::string>>* refused)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<const Entry> Find(absl::string_view name) const;
  // The model `name` serves now, or why it serves none.
  absl::StatusOr<Served> Serving(const ConditionRequest& request) const;
  void ReportRefused(
      const std::vector<std::pair<std::string, std::string>>& refused) const;

  Options options_;
  std::shared_ptr<models::RowCache> cache_;
  std::string repository_;  // set once by OpenRepository
  mutable absl::Mutex mu_;
  // The repository's folders by name.
  std::map<std::string, std::shared_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<Entry>> queue_ ABSL_GUARDED_BY(mu_);
  // Loads queued or running.
  int loading_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::function<void()>> when_loaded_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Read by a load between tensors: set, it stops (ConditioningOptions).
  std::atomic<bool> cancel_loads_{false};
  std::vector<std::thread> loaders_;
};

}  // namespace temb

#endif  // TEMB_CORE_CONDITIONING_SERVICE_H_
