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
  // Guarded by the service's mu_; `model` is set before state turns
  // kReady and never changes after.
  ModelState state = ModelState::kLoading;
  std::string message;
  std::unique_ptr<models::ConditioningModel> model;
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

}  // namespace

absl::string_view ModelStateName(ModelState state) {
  switch (state) {
    case ModelState::kLoading:
      return "loading";
    case ModelState::kReady:
      return "ready";
    case ModelState::kFailed:
      return "failed";
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
  if (loader_.joinable()) loader_.join();
}

absl::Status ConditioningService::OpenRepository(
    const std::string& repository) {
  if (!entries_.empty() || loader_.joinable()) {
    return absl::FailedPreconditionError("a repository is already open");
  }
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_directory(repository, error)) {
    return absl::NotFoundError(absl::StrCat(
        "model_repository: ", Quoted(repository), " is not a directory"));
  }
  std::vector<std::string> names;
  // Entries that are not folders (a plain file, a link to nothing or a
  // loop of links) are not models; each is reported, not failed, so that a
  // README beside the models keeps readiness.
  std::vector<std::pair<std::string, std::string>> skipped;
  for (fs::directory_iterator it(repository, error), end; !error && it != end;
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    std::error_code type_error;
    if (it->is_directory(type_error)) {
      names.push_back(name);
    } else if (!name.empty() && name[0] != '.') {
      skipped.emplace_back(name, type_error
                                     ? absl::StrCat("it cannot be followed (",
                                                    type_error.message(), ")")
                                     : std::string("it is not a folder"));
    }
  }
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_repository: ", Quoted(repository),
                     " cannot be listed: ", error.message()));
  }
  std::sort(names.begin(), names.end());
  std::vector<std::pair<std::string, std::string>> refused;
  absl::ReleasableMutexLock lock(&mu_);
  for (const std::string& name : names) {
    // Hidden folders (.git, editors' and mounts' ..data) are not models.
    if (name.empty() || name[0] == '.') continue;
    auto entry = std::make_unique<Entry>();
    entry->name = name;
    entry->directory = (fs::path(repository) / name).string();
    const absl::Status name_status = CheckModelName(name);
    if (!name_status.ok()) {
      entry->state = ModelState::kFailed;
      entry->message =
          absl::StrCat(entry->directory, ": ", name_status.message());
      refused.emplace_back(entry->name, entry->message);
    } else {
      ++loading_;
    }
    entries_.push_back(std::move(entry));
  }
  loader_ = std::thread([this] { LoadAll(); });
  lock.Release();
  if (options_.on_settled) {
    for (const auto& [name, message] : refused) {
      options_.on_settled(name, ModelState::kFailed, message);
    }
  }
  if (options_.on_skipped) {
    std::sort(skipped.begin(), skipped.end());
    for (const auto& [name, why] : skipped) options_.on_skipped(name, why);
  }
  return absl::OkStatus();
}

void ConditioningService::LoadAll() {
  // Workers take the next model in name order until none is left.
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < entries_.size();
         i = next.fetch_add(1)) {
      LoadOne(*entries_[i]);
    }
  };
  const size_t workers = std::clamp<size_t>(
      static_cast<size_t>(std::max(options_.load_threads, 1)), 1,
      std::max<size_t>(entries_.size(), 1));
  std::vector<std::thread> helpers;
  for (size_t i = 1; i < workers; ++i) helpers.emplace_back(work);
  work();
  for (std::thread& helper : helpers) helper.join();
  std::vector<std::function<void()>> callbacks;
  {
    absl::MutexLock lock(&mu_);
    callbacks.swap(when_loaded_);
    if (stopping_) return;  // what they would tell is going away
  }
  for (const auto& callback : callbacks) callback();
}

void ConditioningService::LoadOne(Entry& entry) {
  {
    absl::MutexLock lock(&mu_);
    if (entry.state != ModelState::kLoading) return;
    if (stopping_) {
      entry.state = ModelState::kFailed;
      entry.message = "the server stopped before the model loaded";
      --loading_;
      return;
    }
  }
  models::ConditioningOptions options;
  options.threads = options_.threads;
  options.cache = cache_;
  options.linear_engine = options_.linear_engine;
  options.cancelled = &cancel_loads_;
  if (options_.load_timeout != absl::InfiniteDuration()) {
    options.deadline = absl::Now() + options_.load_timeout;
  }
  auto model = models::ConditioningModel::Load(entry.directory, options);
  const ModelState state =
      model.ok() ? ModelState::kReady : ModelState::kFailed;
  std::string message =
      model.ok() ? std::string() : std::string(model.status().message());
  if (absl::IsDeadlineExceeded(model.status())) {
    absl::StrAppend(&message, " (the load limit is ",
                    absl::FormatDuration(options_.load_timeout), ")");
  }
  {
    absl::MutexLock lock(&mu_);
    if (model.ok()) entry.model = *std::move(model);
    entry.state = state;
    entry.message = message;
    --loading_;
  }
  if (options_.on_settled) options_.on_settled(entry.name, state, message);
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
  for (const auto& entry : entries_) {
    if (entry->state == ModelState::kFailed) return false;
  }
  return true;
}

const ConditioningService::Entry* ConditioningService::Find(
    absl::string_view name) const {
  for (const auto& entry : entries_) {
    if (entry->name == name) return entry.get();
  }
  return nullptr;
}

bool ConditioningService::has_model(absl::string_view name) const {
  return Find(name) != nullptr;
}

std::vector<ConditioningModelInfo> ConditioningService::Models() const {
  std::vector<ConditioningModelInfo> infos;
  for (const auto& entry : entries_) infos.push_back(*Model(entry->name));
  return infos;
}

absl::StatusOr<ConditioningModelInfo> ConditioningService::Model(
    absl::string_view name) const {
  const Entry* entry = Find(name);
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "model ", Quoted(name), " is not a conditioning model of this server"));
  }
  ConditioningModelInfo info;
  info.name = entry->name;
  info.directory = entry->directory;
  {
    absl::MutexLock lock(&mu_);
    info.state = entry->state;
    info.message = entry->message;
  }
  if (info.state != ModelState::kReady) return info;
  const models::ConditioningModel& model = *entry->model;
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

absl::StatusOr<ConditionResponse> ConditioningService::Serve(
    const ConditionRequest& request, AdmissionTicket* ticket) const {
  const Entry* entry = Find(request.model);
  if (entry == nullptr) {
    std::vector<std::string> known;
    for (const auto& e : entries_) known.push_back(e->name);
    return absl::NotFoundError(
        absl::StrCat(request.model_field, ": ", Quoted(request.model),
                     " is not a conditioning model of this server (",
                     ClosestNames(request.model, known), ")"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (entry->state == ModelState::kLoading) {
      return absl::FailedPreconditionError(
          absl::StrCat(request.model_field, ": model ", Quoted(entry->name),
                       " is still loading"));
    }
    if (entry->state == ModelState::kFailed) {
      return absl::FailedPreconditionError(
          absl::StrCat(request.model_field, ": model ", Quoted(entry->name),
                       " failed to load: ", entry->message));
    }
  }
  const models::ConditioningModel& model = *entry->model;
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
          Quoted(entry->name), " (inputs: ", absl::StrJoin(known, ", "), ")"));
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
                         Quoted(entry->name), " takes one of them"));
      }
      timesteps = &input;
    }
  }
  if (timesteps == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(kConditionTimesteps, ": required by model ",
                     Quoted(entry->name), ", not given"));
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
                       " is not an output of model ", Quoted(entry->name),
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
        Quoted(entry->name), ") are above the limit of max_output_bytes=",
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
                   ComputeOrStatus(model, entry->name, inputs, names));
  ConditionResponse response;
  response.model = entry->name;
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
