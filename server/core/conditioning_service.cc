#include "temb/core/conditioning_service.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <new>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "temb/base/quoted.h"
#include "temb/base/status_macros.h"

namespace temb {

struct ConditioningService::Entry {
  std::string name;
  std::string directory;
  // Guarded by the service's mu_.  `model` is the weights served (set once
  // a load succeeded; a reload replaces it once the new weights are
  // ready); a call holds the pointer it started with.
  ModelState state = ModelState::kLoading;
  std::string message;
  std::shared_ptr<const models::ConditioningModel> model;
  // What the folder held at its last load (FolderStamp), for Rescan.
  std::string stamp;
  bool queued = false;   // a load is queued or running
  bool running = false;  // ... and it has begun reading the folder
  bool again = false;    // load once more when the running load ends
  // Loads settled, for Reload's wait; unloads, so that a load that ends
  // after one does not bring the model back.
  int64_t settled = 0;
  int64_t unloads = 0;
};

// What a call computes with: the model as it was when the call began.
struct ConditioningService::Served {
  std::string name;
  std::shared_ptr<const models::ConditioningModel> model;
};

namespace {

// The description's names for the standard inputs.
std::string ModelInputName(absl::string_view protocol_name) {
  if (protocol_name == kConditionTimesteps) return "t";
  if (protocol_name == kConditionPooled) return "pooled";
  return std::string(protocol_name);
}

std::string ProtocolInputName(absl::string_view model_name) {
  if (model_name == "t") return std::string(kConditionTimesteps);
  if (model_name == "pooled") return std::string(kConditionPooled);
  return std::string(model_name);
}

// The few names of `known` closest to `name` (the longest common prefix,
// then the nearest length), for a NOT_FOUND message that stays short
// however many models a repository holds: gRPC refuses a status whose
// message passes its metadata limit, and the caller would read that as
// overload.
std::string ClosestNames(absl::string_view name,
                         std::vector<std::string> known) {
  constexpr size_t kShown = 5;
  constexpr size_t kMaxNameShown = 64;
  if (known.empty()) return "models: none";
  auto prefix = [&](const std::string& other) {
    size_t n = 0;
    while (n < other.size() && n < name.size() && other[n] == name[n]) ++n;
    return n;
  };
  auto gap = [&](const std::string& other) {
    return other.size() > name.size() ? other.size() - name.size()
                                      : name.size() - other.size();
  };
  const size_t shown = std::min(kShown, known.size());
  std::partial_sort(known.begin(), known.begin() + shown, known.end(),
                    [&](const std::string& a, const std::string& b) {
                      const size_t pa = prefix(a), pb = prefix(b);
                      if (pa != pb) return pa > pb;
                      if (gap(a) != gap(b)) return gap(a) < gap(b);
                      return a < b;
                    });
  std::vector<std::string> names;
  for (size_t i = 0; i < shown; ++i) {
    names.push_back(known[i].size() > kMaxNameShown
                        ? known[i].substr(0, kMaxNameShown) + "..."
                        : known[i]);
  }
  return absl::StrCat(known.size(),
                      " models; the closest: ", absl::StrJoin(names, ", "));
}

absl::Status CheckModelName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxModelNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a model name must have 1 to ", kMaxModelNameBytes,
                     " bytes, got ", name.size()));
  }
  if (!absl::ascii_isalnum(static_cast<unsigned char>(name[0]))) {
    return absl::InvalidArgumentError(
        "a model name must start with a letter or digit");
  }
  for (const char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != '-') {
      return absl::InvalidArgumentError(
          "a model name may hold only letters, digits, '.', '_' and '-'");
    }
  }
  return absl::OkStatus();
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// What a model folder holds, as a poll compares it: each file's name, size
// and modification time (links followed), in name order.  A changed
// config, index or weights file changes it.  At most kMaxStampedFiles
// files are read: a folder is a model, not an archive.
std::string FolderStamp(const std::string& directory) {
  namespace fs = std::filesystem;
  constexpr size_t kMaxStampedFiles = 4096;
  std::vector<std::string> files;
  std::error_code error;
  for (fs::directory_iterator it(directory, error), end;
       !error && it != end && files.size() < kMaxStampedFiles;
       it.increment(error)) {
    std::error_code stat_error;
    const fs::file_status status = it->status(stat_error);
    if (stat_error || !fs::is_regular_file(status)) continue;
    const auto size = fs::file_size(it->path(), stat_error);
    const auto time = fs::last_write_time(it->path(), stat_error);
    if (stat_error) continue;
    files.push_back(absl::StrCat(it->path().filename().string(), ":", size, ":",
                                 time.time_since_epoch().count()));
  }
  if (error) return absl::StrCat("unreadable: ", error.message());
  std::sort(files.begin(), files.end());
  return absl::StrJoin(files, "|");
}

// The repository's subfolders (not hidden), in name order, and its other
// entries with why they are no model.
struct Listing {
  std::vector<std::string> folders;
  std::vector<std::pair<std::string, std::string>> skipped;
};

absl::StatusOr<Listing> ListRepository(const std::string& repository) {
  namespace fs = std::filesystem;
  Listing listing;
  std::error_code error;
  for (fs::directory_iterator it(repository, error), end; !error && it != end;
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    // Hidden entries (.git, editors' and mounts' ..data) are not models.
    if (name.empty() || name[0] == '.') continue;
    std::error_code type_error;
    if (it->is_directory(type_error)) {
      listing.folders.push_back(name);
    } else {
      // A plain file, a link to nothing or a loop of links is no model;
      // each is reported, not failed, so that a README beside the models
      // keeps readiness.
      listing.skipped.emplace_back(
          name, type_error ? absl::StrCat("it cannot be followed (",
                                          type_error.message(), ")")
                           : std::string("it is not a folder"));
    }
  }
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_repository: ", Quoted(repository),
                     " cannot be listed: ", error.message()));
  }
  std::sort(listing.folders.begin(), listing.folders.end());
  std::sort(listing.skipped.begin(), listing.skipped.end());
  return listing;
}

}  // namespace

absl::string_view ModelStateName(ModelState state) {
  switch (state) {
    case ModelState::kLoading:
      return "loading";
    case ModelState::kReady:
      return "ready";
    case ModelState::kFailed:
      return "failed";
    case ModelState::kUnloaded:
      return "unloaded";
  }
  return "unknown";
}

ConditioningService::ConditioningService(Options options)
    : options_(std::move(options)) {
  if (options_.cache_bytes > 0) {
    cache_ = std::make_shared<models::RowCache>(options_.cache_bytes);
  }
}

ConditioningService::~ConditioningService() { StopLoading(); }

void ConditioningService::StopLoading() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  // The model being loaded stops before its next tensor: a shutdown waits
  // for one tensor's read at most, not a whole model's.
  cancel_loads_.store(true, std::memory_order_relaxed);
  for (std::thread& loader : loaders_) {
    if (loader.joinable()) loader.join();
  }
}

std::shared_ptr<ConditioningService::Entry> ConditioningService::NewEntry(
    const std::string& name,
    std::vector<std::pair<std::string, std::string>>* refused) {
  auto entry = std::make_shared<Entry>();
  entry->name = name;
  entry->directory = (std::filesystem::path(repository_) / name).string();
  const absl::Status name_status = CheckModelName(name);
  if (!name_status.ok()) {
    entry->state = ModelState::kFailed;
    entry->message =
        absl::StrCat(entry->directory, ": ", name_status.message());
    refused->emplace_back(entry->name, entry->message);
  } else {
    QueueLoad(entry);
  }
  entries_[name] = entry;
  return entry;
}

void ConditioningService::QueueLoad(const std::shared_ptr<Entry>& entry) {
  if (entry->queued || stopping_) return;
  entry->queued = true;
  ++loading_;
  queue_.push_back(entry);
}

void ConditioningService::ReportRefused(
    const std::vector<std::pair<std::string, std::string>>& refused) const {
  if (!options_.on_settled) return;
  for (const auto& [name, message] : refused) {
    options_.on_settled(name, ModelState::kFailed, message);
  }
}

absl::Status ConditioningService::OpenRepository(
    const std::string& repository) {
  if (!repository_.empty()) {
    return absl::FailedPreconditionError("a repository is already open");
  }
  std::error_code error;
  if (!std::filesystem::is_directory(repository, error)) {
    return absl::NotFoundError(absl::StrCat(
        "model_repository: ", Quoted(repository), " is not a directory"));
  }
  ASSIGN_OR_RETURN(const Listing listing, ListRepository(repository));
  repository_ = repository;
  std::vector<std::pair<std::string, std::string>> refused;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& name : listing.folders) NewEntry(name, &refused);
  }
  const size_t threads =
      static_cast<size_t>(std::max(options_.load_threads, 1));
  for (size_t i = 0; i < threads; ++i) {
    loaders_.emplace_back([this] { LoadLoop(); });
  }
  ReportRefused(refused);
  if (options_.on_skipped) {
    for (const auto& [name, why] : listing.skipped) {
      options_.on_skipped(name, why);
    }
  }
  return absl::OkStatus();
}

void ConditioningService::LoadLoop() {
  while (true) {
    std::shared_ptr<Entry> entry;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) {
        // What is still queued will not load.
        for (const auto& queued : queue_) {
          queued->queued = false;
          queued->again = false;
          if (queued->model == nullptr) {
            queued->state = ModelState::kFailed;
            queued->message = "the server stopped before the model loaded";
          }
          ++queued->settled;
          --loading_;
        }
        queue_.clear();
        return;
      }
      entry = queue_.front();
      queue_.pop_front();
      entry->running = true;
    }
    LoadOne(entry);
    std::vector<std::function<void()>> callbacks;
    {
      absl::MutexLock lock(&mu_);
      if (loading_ == 0 && !stopping_) callbacks.swap(when_loaded_);
    }
    for (const auto& callback : callbacks) callback();
  }
}

void ConditioningService::LoadOne(const std::shared_ptr<Entry>& entry) {
  int64_t unloads = 0;
  {
    absl::MutexLock lock(&mu_);
    unloads = entry->unloads;
  }
  // What the folder holds now, before its files are read: a change made
  // while it loads is seen by the next rescan.
  std::string stamp = FolderStamp(entry->directory);
  models::ConditioningOptions options;
  options.threads = options_.threads;
  options.cache = cache_;
  options.linear_engine = options_.linear_engine;
  options.cancelled = &cancel_loads_;
  if (options_.load_timeout != absl::InfiniteDuration()) {
    options.deadline = absl::Now() + options_.load_timeout;
  }
  auto model = models::ConditioningModel::Load(entry->directory, options);
  std::string message =
      model.ok() ? std::string() : std::string(model.status().message());
  if (absl::IsDeadlineExceeded(model.status())) {
    absl::StrAppend(&message, " (the load limit is ",
                    absl::FormatDuration(options_.load_timeout), ")");
  }
  ModelState reported = model.ok() ? ModelState::kReady : ModelState::kFailed;
  {
    absl::MutexLock lock(&mu_);
    entry->queued = false;
    entry->running = false;
    entry->stamp = std::move(stamp);
    --loading_;
    ++entry->settled;
    if (entry->again) {
      entry->again = false;
      QueueLoad(entry);
    }
    if (entry->unloads != unloads) {
      // Unloaded while it loaded: the new weights are dropped.
      reported = ModelState::kUnloaded;
    } else if (model.ok()) {
      entry->model = *std::move(model);
      entry->state = ModelState::kReady;
      entry->message.clear();
    } else if (entry->model != nullptr) {
      // A failed reload: the weights that served still serve.
      entry->message = absl::StrCat("the reload failed: ", message);
      message = entry->message;
    } else {
      entry->state = ModelState::kFailed;
      entry->message = message;
    }
  }
  if (options_.on_settled && reported != ModelState::kUnloaded) {
    options_.on_settled(entry->name, reported, message);
  }
}

void ConditioningService::Rescan() {
  if (repository_.empty()) return;
  absl::StatusOr<Listing> listing = ListRepository(repository_);
  if (!listing.ok()) return;  // the next rescan looks again
  // Each present folder's contents, read outside the lock.
  std::map<std::string, std::string> stamps;
  for (const std::string& name : listing->folders) {
    stamps[name] =
        FolderStamp((std::filesystem::path(repository_) / name).string());
  }
  std::vector<std::pair<std::string, std::string>> refused;
  std::vector<std::string> removed;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (stamps.count(it->first) > 0) {
        ++it;
        continue;
      }
      // Its folder is gone: out of service; calls in flight finish.
      ++it->second->unloads;
      removed.push_back(it->first);
      it = entries_.erase(it);
    }
    for (const auto& [name, stamp] : stamps) {
      const auto found = entries_.find(name);
      if (found == entries_.end()) {
        NewEntry(name, &refused);
      } else if (found->second->state != ModelState::kUnloaded &&
                 !found->second->queued && found->second->stamp != stamp &&
                 CheckModelName(name).ok()) {
        QueueLoad(found->second);
      }
    }
  }
  ReportRefused(refused);
  if (options_.on_settled) {
    for (const std::string& name : removed) {
      options_.on_settled(name, ModelState::kUnloaded,
                          "its folder left the repository");
    }
  }
}

absl::Status ConditioningService::Reload(absl::string_view name) {
  if (repository_.empty()) {
    return absl::FailedPreconditionError("the server has no model_repository");
  }
  RETURN_IF_ERROR(CheckModelName(name));
  const std::string directory =
      (std::filesystem::path(repository_) / std::string(name)).string();
  std::error_code error;
  if (!std::filesystem::is_directory(directory, error)) {
    return absl::NotFoundError(absl::StrCat("model ", Quoted(name),
                                            ": no such folder in the "
                                            "model repository"));
  }
  std::vector<std::pair<std::string, std::string>> refused;
  std::shared_ptr<Entry> entry;
  int64_t target = 0;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the server is stopping");
    const auto found = entries_.find(std::string(name));
    if (found == entries_.end()) {
      entry = NewEntry(std::string(name), &refused);
    } else {
      entry = found->second;
      if (entry->state == ModelState::kUnloaded) {
        entry->state = ModelState::kLoading;
        entry->message.clear();
      }
    }
    // The load that answers this call reads the folder after it: a queued
    // one that has not begun, or one more after the one running.
    target = entry->settled + 1;
    if (entry->running) {
      entry->again = true;
      ++target;
    } else {
      QueueLoad(entry);
    }
  }
  ReportRefused(refused);
  absl::MutexLock lock(&mu_);
  auto done = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return stopping_ || entry->settled >= target;
  };
  mu_.Await(absl::Condition(&done));
  if (entry->settled < target) {
    return absl::UnavailableError("the server is stopping");
  }
  if (entry->state == ModelState::kReady && entry->message.empty()) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "model ", Quoted(name), ": ",
      entry->message.empty() ? std::string("did not load") : entry->message));
}

absl::Status ConditioningService::Unload(absl::string_view name) {
  {
    absl::MutexLock lock(&mu_);
    const auto found = entries_.find(std::string(name));
    if (found == entries_.end()) {
      return absl::NotFoundError(
          absl::StrCat("model ", Quoted(name),
                       " is not a conditioning model of this "
                       "server"));
    }
    Entry& entry = *found->second;
    ++entry.unloads;
    entry.model.reset();  // calls in flight hold their own pointer
    entry.state = ModelState::kUnloaded;
    entry.message = "unloaded";
  }
  if (options_.on_settled) {
    options_.on_settled(std::string(name), ModelState::kUnloaded, "unloaded");
  }
  return absl::OkStatus();
}

std::vector<ConditioningService::IndexEntry> ConditioningService::Index()
    const {
  std::map<std::string, IndexEntry> index;
  if (!repository_.empty()) {
    absl::StatusOr<Listing> listing = ListRepository(repository_);
    if (listing.ok()) {
      for (const std::string& name : listing->folders) {
        index[name] = {name, ModelState::kUnloaded, "not loaded"};
      }
    }
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [name, entry] : entries_) {
    index[name] = {name, entry->state, entry->message};
  }
  std::vector<IndexEntry> entries;
  for (auto& [name, entry] : index) entries.push_back(std::move(entry));
  return entries;
}

bool ConditioningService::WaitUntilLoaded(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto settled = [this]()
                     ABSL_SHARED_LOCKS_REQUIRED(mu_) { return loading_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&settled), timeout);
}

void ConditioningService::CallWhenLoaded(std::function<void()> callback) {
  {
    absl::MutexLock lock(&mu_);
    if (loading_ > 0) {
      when_loaded_.push_back(std::move(callback));
      return;
    }
  }
  callback();
}

bool ConditioningService::loading() const {
  absl::MutexLock lock(&mu_);
  return loading_ > 0;
}

bool ConditioningService::RepositoryReady() const {
  absl::MutexLock lock(&mu_);
  if (loading_ > 0) return false;
  if (options_.serve_ready_models) return true;
  for (const auto& [name, entry] : entries_) {
    if (entry->state == ModelState::kFailed) return false;
  }
  return true;
}

std::shared_ptr<const ConditioningService::Entry> ConditioningService::Find(
    absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  const auto found = entries_.find(std::string(name));
  return found == entries_.end() ? nullptr : found->second;
}

bool ConditioningService::has_model(absl::string_view name) const {
  return Find(name) != nullptr;
}

std::vector<ConditioningModelInfo> ConditioningService::Models() const {
  std::vector<std::string> names;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, entry] : entries_) names.push_back(name);
  }
  std::vector<ConditioningModelInfo> infos;
  for (const std::string& name : names) {
    absl::StatusOr<ConditioningModelInfo> info = Model(name);
    if (info.ok()) infos.push_back(*std::move(info));  // not removed since
  }
  return infos;
}

absl::StatusOr<ConditioningModelInfo> ConditioningService::Model(
    absl::string_view name) const {
  const std::shared_ptr<const Entry> entry = Find(name);
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "model ", Quoted(name), " is not a conditioning model of this server"));
  }
  ConditioningModelInfo info;
  info.name = entry->name;
  info.directory = entry->directory;
  std::shared_ptr<const models::ConditioningModel> served;
  {
    absl::MutexLock lock(&mu_);
    info.state = entry->state;
    info.message = entry->message;
    served = entry->model;
  }
  if (info.state != ModelState::kReady || served == nullptr) return info;
  const models::ConditioningModel& model = *served;
  info.family = model.family().name;
  info.dtype = model.dtype();
  info.width = model.width();
  info.weight_bytes = model.weight_bytes();
  info.weight_fingerprints = model.weight_fingerprints();
  info.inputs = model.inputs();
  for (models::InputInfo& input : info.inputs) {
    input.name = ProtocolInputName(input.name);
    if (!input.instead_of.empty()) {
      input.instead_of = ProtocolInputName(input.instead_of);
    }
  }
  info.outputs = model.outputs();
  info.folded_modules = model.folded_modules();
  info.class_name = model.family().class_name;
  info.config = model.config_fields();
  info.embedder_results = model.embedder_results();
  return info;
}

models::RowCacheStats ConditioningService::cache_stats() const {
  if (cache_ == nullptr) return {};
  return cache_->stats();
}

namespace {

// The model's computation, with anything it throws turned into a status
// that names the model.  An exception reaching gRPC would end the call
// UNIMPLEMENTED with an empty message (what gRPC answers when a handler
// throws), and every frontend serves through here.
absl::StatusOr<std::vector<models::ConditioningOutput>> ComputeOrStatus(
    const models::ConditioningModel& model, absl::string_view name,
    const models::ConditioningInputs& inputs,
    const std::vector<std::string>& outputs) {
  try {
    return model.Compute(inputs, outputs);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the server ran out of memory computing model ",
                     Quoted(name), "; retry later or with fewer rows"));
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("model ", Quoted(name), " failed to compute: ", e.what()));
  }
}

}  // namespace

absl::StatusOr<ConditioningService::Served> ConditioningService::Serving(
    const ConditionRequest& request) const {
  absl::MutexLock lock(&mu_);
  const auto found = entries_.find(std::string(request.model));
  if (found == entries_.end()) {
    std::vector<std::string> known;
    for (const auto& [name, entry] : entries_) known.push_back(name);
    return absl::NotFoundError(
        absl::StrCat(request.model_field, ": ", Quoted(request.model),
                     " is not a conditioning model of this server (",
                     ClosestNames(request.model, known), ")"));
  }
  const Entry& entry = *found->second;
  switch (entry.state) {
    case ModelState::kReady:
      return Served{entry.name, entry.model};
    case ModelState::kLoading:
      return absl::FailedPreconditionError(
          absl::StrCat(request.model_field, ": model ", Quoted(entry.name),
                       " is still loading"));
    case ModelState::kUnloaded:
      return absl::FailedPreconditionError(absl::StrCat(
          request.model_field, ": model ", Quoted(entry.name), " is unloaded"));
    case ModelState::kFailed:
      break;
  }
  return absl::FailedPreconditionError(
      absl::StrCat(request.model_field, ": model ", Quoted(entry.name),
                   " failed to load: ", entry.message));
}

absl::StatusOr<ConditionResponse> ConditioningService::Serve(
    const ConditionRequest& request, AdmissionTicket* ticket) const {
  // The weights as they are now: a reload or an unload meanwhile does not
  // touch this call's.
  ASSIGN_OR_RETURN(const Served served, Serving(request));
  const models::ConditioningModel& model = *served.model;
  const std::vector<models::InputInfo> takes = model.inputs();

  // The inputs, each checked against what the model takes.
  const ConditionInput* timesteps = nullptr;
  absl::flat_hash_map<std::string, const ConditionInput*> given;
  for (const ConditionInput& input : request.inputs) {
    const std::string model_name = ModelInputName(input.name);
    const auto spec = std::find_if(
        takes.begin(), takes.end(),
        [&](const models::InputInfo& i) { return i.name == model_name; });
    if (spec == takes.end()) {
      std::vector<std::string> known;
      for (const models::InputInfo& i : takes) {
        known.push_back(ProtocolInputName(i.name));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          input.field, ": ", Quoted(input.name), " is not an input of model ",
          Quoted(served.name), " (inputs: ", absl::StrJoin(known, ", "), ")"));
    }
    if (!given.emplace(model_name, &input).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          input.field, ": input ", Quoted(input.name), " is given twice"));
    }
    if (input.shape.size() > kMaxConditionInputRank) {
      return absl::InvalidArgumentError(absl::StrCat(
          input.field, ": shape ", ShapeString(input.shape), " has rank ",
          input.shape.size(), "; at most ", kMaxConditionInputRank));
    }
    // The shape must hold exactly the values given; checked extent by
    // extent so that no product overflows.
    const int64_t count = static_cast<int64_t>(input.values.size());
    int64_t elements = 1;
    bool fits = true;
    for (const int64_t extent : input.shape) {
      if (extent < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(input.field, ": shape ", ShapeString(input.shape),
                         " has a negative extent"));
      }
      if (extent > 0 && elements > count / extent) fits = false;
      elements = fits ? elements * extent : elements;
    }
    if (!fits || elements != count) {
      return absl::InvalidArgumentError(
          absl::StrCat(input.field, ": shape ", ShapeString(input.shape),
                       " does not hold the ", count, " values given"));
    }
    // The scheduler's t, or an input standing for a value of it (the
    // forward's timestep): one of them sets the rows.
    if (model_name == "t" || spec->instead_of == "t") {
      if (timesteps != nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(input.field, ": ", Quoted(input.name),
                         " is given with ", Quoted(timesteps->name), "; model ",
                         Quoted(served.name), " takes one of them"));
      }
      timesteps = &input;
    }
  }
  if (timesteps == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(kConditionTimesteps, ": required by model ",
                     Quoted(served.name), ", not given"));
  }
  if (timesteps->shape.empty() || timesteps->values.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(timesteps->field,
                     ": at least one timestep of shape [N] "
                     "or per-token [B, L] is required, got ",
                     ShapeString(timesteps->shape)));
  }
  const bool per_token = timesteps->shape.size() > 1;

  // Per-token timesteps: the distinct values, in order of first appearance
  // (by bits: -0 and 0 embed alike but are kept apart, which costs a row and
  // never a wrong one).
  std::vector<float> t_rows;
  std::vector<int64_t> index;
  if (per_token) {
    absl::flat_hash_map<uint32_t, int64_t> row_of;
    index.reserve(timesteps->values.size());
    for (const float t : timesteps->values) {
      uint32_t bits;
      std::memcpy(&bits, &t, sizeof(bits));
      const auto [it, inserted] =
          row_of.emplace(bits, static_cast<int64_t>(t_rows.size()));
      if (inserted) t_rows.push_back(t);
      index.push_back(it->second);
    }
  } else {
    t_rows.assign(timesteps->values.begin(), timesteps->values.end());
  }
  const int64_t rows = static_cast<int64_t>(t_rows.size());
  const int64_t max_rows = std::min<int64_t>(options_.limits.max_batch,
                                             models::kMaxConditioningRows);
  if (rows > max_rows) {
    return absl::ResourceExhaustedError(absl::StrCat(
        timesteps->field, ": ", rows, per_token ? " distinct" : "",
        " timesteps is above the limit of ", max_rows,
        " rows (max_batch=", options_.limits.max_batch, ", at most ",
        models::kMaxConditioningRows, " per conditioning call)"));
  }

  models::ConditioningInputs inputs;
  const std::string time_name = ModelInputName(timesteps->name);
  inputs.values[time_name] = std::move(t_rows);
  for (const models::InputInfo& spec : takes) {
    if (spec.name == time_name) continue;
    const auto found = given.find(spec.name);
    if (found == given.end()) continue;  // the model says what is required
    const ConditionInput& input = *found->second;
    // [N] / [N, W] per row, or [] / [1] / [W] / [1, W] shared.
    const int64_t width = std::max<int64_t>(spec.width, 1);
    const int64_t count = static_cast<int64_t>(input.values.size());
    const bool shared = count == width;
    const bool per_row = !per_token && count == rows * width &&
                         !input.shape.empty() && input.shape[0] == rows;
    if (!shared && !per_row) {
      return absl::InvalidArgumentError(absl::StrCat(
          input.field, ": shape ", ShapeString(input.shape), " does not fit ",
          per_token ? "per-token timesteps: give one value shared by all, "
                    : absl::StrCat(
                          rows, " timesteps: give [", rows,
                          spec.width > 0 ? absl::StrCat(", ", spec.width) : "",
                          "] or one shared value, "),
          "of ", spec.width > 0 ? absl::StrCat(spec.width, " values") : "1",
          ")"));
    }
    inputs.values[spec.name].assign(input.values.begin(), input.values.end());
  }

  // The outputs, and what the answer and its computation hold.
  const std::vector<models::OutputInfo> all_outputs = model.outputs();
  // A value an input stands for ([N], at most float32) may be asked for
  // too: a client that prefetches a schedule by t keys the rows by the
  // value the transformer will hand it.
  std::deque<models::OutputInfo> stood_for;
  std::vector<const models::OutputInfo*> wanted;
  for (size_t i = 0; i < request.outputs.size(); ++i) {
    const std::string& name = request.outputs[i];
    // The index comes with per-token timesteps, asked for or not.
    if (per_token && name == kConditionIndex) continue;
    auto found = std::find_if(
        all_outputs.begin(), all_outputs.end(),
        [&](const models::OutputInfo& o) { return o.name == name; });
    const bool is_value =
        found == all_outputs.end() &&
        std::any_of(takes.begin(), takes.end(),
                    [&](const models::InputInfo& input) {
                      return !name.empty() && input.stands_for == name;
                    });
    if (is_value) {
      models::OutputInfo value;
      value.name = name;
      value.row_bytes = sizeof(float);
      stood_for.push_back(std::move(value));
    }
    const models::OutputInfo* output =
        is_value ? &stood_for.back()
                 : (found == all_outputs.end() ? nullptr : &*found);
    if (output == nullptr) {
      std::vector<std::string> known;
      for (const models::OutputInfo& o : all_outputs) known.push_back(o.name);
      return absl::InvalidArgumentError(
          absl::StrCat(request.outputs_field, "[", i, "]: ", Quoted(name),
                       " is not an output of model ", Quoted(served.name),
                       " (outputs: ", absl::StrJoin(known, ", "), ")"));
    }
    if (std::any_of(
            wanted.begin(), wanted.end(),
            [&](const models::OutputInfo* o) { return o->name == name; })) {
      return absl::InvalidArgumentError(absl::StrCat(request.outputs_field, "[",
                                                     i, "]: ", Quoted(name),
                                                     " is asked for twice"));
    }
    wanted.push_back(output);
  }
  if (wanted.empty()) {
    for (const models::OutputInfo& o : all_outputs) wanted.push_back(&o);
  }
  int64_t output_bytes = per_token ? static_cast<int64_t>(index.size()) * 8 : 0;
  for (const models::OutputInfo* output : wanted) {
    output_bytes += rows * output->row_bytes;
  }
  if (output_bytes > options_.limits.max_output_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the answer's ", output_bytes, " bytes (", rows, " rows of model ",
        Quoted(served.name), ") are above the limit of max_output_bytes=",
        options_.limits.max_output_bytes,
        ": ask for fewer timesteps or fewer outputs"));
  }
  if (ticket != nullptr) {
    // The computation's float32 values and the outputs, encoded once by the
    // model and once here, are held at the same time at worst.
    RETURN_IF_ERROR(ticket->Reserve(rows * model.working_bytes_per_row() +
                                    2 * output_bytes));
  }

  std::vector<std::string> names;
  for (const models::OutputInfo* output : wanted) names.push_back(output->name);
  ASSIGN_OR_RETURN(std::vector<models::ConditioningOutput> computed,
                   ComputeOrStatus(model, served.name, inputs, names));
  ConditionResponse response;
  response.model = served.name;
  response.rows = rows;
  response.output_bytes = output_bytes;
  for (models::ConditioningOutput& output : computed) {
    ConditionOutput out;
    out.name = std::move(output.name);
    out.shape = std::move(output.shape);
    out.dtype = output.dtype;
    out.data = std::move(output.data);
    response.outputs.push_back(std::move(out));
  }
  if (per_token) {
    ConditionOutput out;
    out.name = std::string(kConditionIndex);
    out.shape = timesteps->shape;
    out.index = true;
    out.data.resize(index.size() * sizeof(int64_t));
    std::memcpy(out.data.data(), index.data(), out.data.size());
    response.outputs.push_back(std::move(out));
  }
  return response;
}

}  // namespace temb
