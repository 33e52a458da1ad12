// temb embed: one embedding request, remote (--target) or in-process
// (--local, through the same service core the server runs).
#include <sys/mman.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "temb/base/status_macros.h"
#include "temb/cli/commands.h"
#include "temb/cli/common.h"
#include "temb/cli/output.h"
#include "temb/client/temb_client.h"
#include "temb/core/embed_service.h"
#include "temb/core/presets.h"
#include "temb/core/timesteps.h"
#include "temb/kernels/registry.h"
#include "temb/v1_convert/conversions.h"
#include "temb/v1_convert/preset_catalog.h"

namespace temb::cli {
namespace {

// One embedding, from either path: its bytes stay where they were computed
// (a response string, or pages EmbedLocal mapped), so large outputs are
// written out without another copy.
struct Result {
  std::string name;  // the part's; empty for a single-part request
  std::vector<int64_t> row_shape;  // shape without dim
  int64_t rows = 0;
  int64_t cols = 0;
  DType dtype = DType::kFloat32;
  std::shared_ptr<const void> storage;  // owns the bytes `data` views
  absl::string_view data;
};

// Memory for --local outputs: mapped in huge pages where possible and
// populated in one call, so the computation does not take a page fault per
// 4 KiB (a large share of a big output's time), and never zero-filled by us.  A
// buffer the backend lends (page-locked memory) is kept as it is.
class MappedOutput final : public OutputAllocator {
 public:
  absl::Span<uint8_t> Allocate(size_t bytes) override {
    if (bytes == 0) return {};
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
      // Transparent huge pages where the kernel offers them (512x fewer
      // faults), then every page in one call rather than one fault each.
      // Both are hints: without them the output is the same, only slower.
      (void)madvise(p, bytes, MADV_HUGEPAGE);
#ifdef MADV_POPULATE_WRITE
      (void)madvise(p, bytes, MADV_POPULATE_WRITE);
#endif
    }
    uint8_t* data;
    if (p == MAP_FAILED) {  // ordinary memory then: the same output
      std::shared_ptr<uint8_t[]> heap(new uint8_t[bytes]);
      data = heap.get();
      storage_ = std::move(heap);
    } else {
      data = static_cast<uint8_t*>(p);
      storage_ =
          std::shared_ptr<void>(p, [bytes](void* q) { munmap(q, bytes); });
    }
    bytes_ = absl::string_view(reinterpret_cast<const char*>(data), bytes);
    return absl::MakeSpan(data, bytes);
  }
  void Adopt(std::unique_ptr<HostBuffer> buffer) override {
    const absl::Span<uint8_t> lent = buffer->bytes();
    bytes_ = absl::string_view(reinterpret_cast<const char*>(lent.data()),
                               lent.size());
    storage_ = std::shared_ptr<HostBuffer>(std::move(buffer));
  }
  absl::string_view bytes() const { return bytes_; }
  std::shared_ptr<const void> storage() const { return storage_; }

 private:
  std::shared_ptr<const void> storage_;
  absl::string_view bytes_;
};

// What one call asks for: the timesteps of each part (one unnamed part for
// a single-part request) and their shapes.
std::vector<FlagSpec> EmbedFlags() {
  std::vector<FlagSpec> specs = ConnectionFlags();
  std::vector<FlagSpec> spec_flags = SpecFlags();
  specs.insert(specs.end(), spec_flags.begin(), spec_flags.end());
  specs.push_back({"local", FlagType::kBool,
                   "compute in-process instead of calling a server"});
  specs.push_back(
      {"timesteps", FlagType::kString, "comma list, or @file of numbers"});
  specs.push_back({"timesteps_shape", FlagType::kString,
                   "shape of the timesteps, e.g. 2,7 (per token): the "
                   "embedding is [2, 7, dim]"});
  specs.push_back({"part", FlagType::kStrings,
                   "NAME:TIMESTEPS, one embedding of a multi-part call "
                   "(repeatable), e.g. --preset=flux --part=timestep:0.5 "
                   "--part=guidance:3.5; instead of --timesteps"});
  specs.push_back({"format", FlagType::kString, "json | npy | table"});
  specs.push_back({"help", FlagType::kBool, "show this help"});
  return specs;
}

absl::StatusOr<std::vector<int64_t>> ParseShape(const std::string& text) {
  std::vector<int64_t> shape;
  for (absl::string_view token : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int64_t extent;
    if (!absl::SimpleAtoi(token, &extent)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--timesteps_shape: cannot parse '", token, "'"));
    }
    shape.push_back(extent);
  }
  return shape;
}

// The parts of the command line: --part flags, or --timesteps (with
// --timesteps_shape) as one unnamed part.
absl::StatusOr<std::vector<PartArgs>> PartsFromArgs(const Args& args) {
  std::vector<PartArgs> parts;
  const std::vector<std::string> given = args.Strings("part");
  if (given.empty()) {
    PartArgs part;
    ASSIGN_OR_RETURN(part.timesteps, ParseTimesteps(*args.String("timesteps")));
    if (auto shape = args.String("timesteps_shape")) {
      ASSIGN_OR_RETURN(part.shape, ParseShape(*shape));
    }
    parts.push_back(std::move(part));
    return parts;
  }
  if (args.Has("timesteps_shape")) {
    return absl::InvalidArgumentError(
        "--timesteps_shape goes with --timesteps, not with --part");
  }
  return ParseParts(given);
}

absl::StatusOr<std::vector<Result>> EmbedLocal(
    const SpecRequest& spec, const std::vector<PartArgs>& parts) {
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      CreateBackend(BackendChoice::kAuto);
  if (!backend.ok()) return backend.status();
  EmbedService service(std::move(*backend), BuiltInPresetCatalog(), {});
  // The request the CLI would send, in core terms: its errors read as the
  // server's do.
  Request request;
  request.spec = spec;
  request.named_parts = parts.size() > 1 || !parts[0].name.empty();
  for (size_t i = 0; i < parts.size(); ++i) {
    RequestPart part;
    part.name = parts[i].name;
    if (request.named_parts) part.field = absl::StrCat("parts[", i, "]");
    part.timesteps = parts[i].timesteps;
    part.timesteps_shape = parts[i].shape;
    request.parts.push_back(std::move(part));
  }
  std::vector<MappedOutput> mapped(parts.size());
  std::vector<OutputAllocator*> outputs;
  for (MappedOutput& output : mapped) outputs.push_back(&output);
  ASSIGN_OR_RETURN(Response served, service.Serve(request, nullptr, outputs));
  std::vector<Result> results;
  for (size_t i = 0; i < served.parts.size(); ++i) {
    const ResponsePart& part = served.parts[i];
    std::vector<int64_t> row_shape = part.shape;
    row_shape.pop_back();
    Result result{part.name, std::move(row_shape), part.embedding.rows,
                  part.embedding.spec.dim, part.embedding.spec.dtype};
    result.storage = mapped[i].storage();
    result.data = mapped[i].bytes();
    results.push_back(std::move(result));
  }
  return results;
}

absl::StatusOr<Result> FromTensor(std::string name, v1::Tensor* tensor) {
  absl::StatusOr<std::optional<DType>> dtype =
      DTypeFromProto(tensor->dtype(), "embedding.dtype");
  if (!dtype.ok()) return dtype.status();
  if (!dtype->has_value()) {
    return absl::InvalidArgumentError("server sent a tensor without a dtype");
  }
  if (tensor->shape_size() < 2) {
    return absl::InternalError("server sent a tensor of rank below 2");
  }
  Result result;
  result.name = std::move(name);
  result.row_shape.assign(tensor->shape().begin(), tensor->shape().end() - 1);
  result.cols = tensor->shape(tensor->shape_size() - 1);
  result.rows = 1;
  for (const int64_t extent : result.row_shape) {
    if (extent < 0) return absl::InternalError("server sent a negative shape");
    result.rows *= extent;
  }
  result.dtype = **dtype;
  // The bytes move out of the response into storage the result owns.
  auto bytes =
      std::make_shared<const std::string>(std::move(*tensor->mutable_data()));
  result.data = *bytes;
  result.storage = std::move(bytes);
  const uint64_t expected = static_cast<uint64_t>(result.rows) *
                            static_cast<uint64_t>(result.cols) *
                            DTypeSize(result.dtype);
  if (result.cols < 0 || result.data.size() != expected) {
    return absl::InternalError(
        "server sent a tensor whose size disagrees with its shape");
  }
  return result;
}

absl::StatusOr<std::vector<Result>> EmbedRemote(
    const ClientOptions& options, const SpecRequest& spec,
    const std::vector<PartArgs>& parts) {
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  if (!client.ok()) return client.status();
  v1::EmbedRequest request;
  if (parts.size() == 1 && parts[0].name.empty()) {
    request = EmbedRequestFor(spec, parts[0].timesteps);
    request.mutable_timesteps_shape()->Add(parts[0].shape.begin(),
                                           parts[0].shape.end());
  } else {
    request = PartsRequestFor(spec, parts);
  }
  absl::StatusOr<v1::EmbedResponse> response = (*client)->Embed(request);
  if (!response.ok()) return response.status();
  std::vector<Result> results;
  if (request.parts_size() == 0) {
    ASSIGN_OR_RETURN(Result result,
                     FromTensor("", response->mutable_embedding()));
    results.push_back(std::move(result));
  }
  for (v1::NamedTensor& named : *response->mutable_parts()) {
    ASSIGN_OR_RETURN(Result result,
                     FromTensor(named.name(), named.mutable_tensor()));
    results.push_back(std::move(result));
  }
  return results;
}

TensorView ViewOf(const Result& result) {
  return TensorView{result.rows, result.cols, result.dtype, result.data,
                    result.row_shape};
}

// JSON: the tensor object, or {"parts": {"name": tensor, ...}} for parts.
std::string PartsToJson(const std::vector<Result>& results) {
  std::string out = "{\"parts\": {";
  for (size_t i = 0; i < results.size(); ++i) {
    std::string tensor = ToJson(ViewOf(results[i]));
    tensor.pop_back();  // its newline
    absl::StrAppend(&out, i > 0 ? ", " : "", "\"", results[i].name,
                    "\": ", tensor);
  }
  out += "}}\n";
  return out;
}

}  // namespace

int RunEmbed(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> specs = EmbedFlags();
  absl::StatusOr<Args> args = Args::Parse(specs, argv);
  if (!args.ok()) {
    return PrintUsage("embed", std::string(args.status().message()), specs);
  }
  if (args->Bool("help").value_or(false)) {
    std::cout << "usage: temb embed [flags]\n" << FlagHelp(specs);
    return kExitOk;
  }
  const bool local = args->Bool("local").value_or(false);
  if (local == args->Has("target")) {
    return PrintUsage("embed", "give exactly one of --target and --local",
                      specs);
  }
  const std::string format = args->String("format").value_or("json");
  if (format != "json" && format != "npy" && format != "table") {
    return PrintUsage("embed", "--format must be json, npy or table", specs);
  }
  absl::StatusOr<SpecRequest> spec = SpecRequestFromArgs(*args);
  if (!spec.ok()) {
    return PrintUsage("embed", std::string(spec.status().message()), specs);
  }
  if (args->Strings("part").empty() == !args->Has("timesteps")) {
    return PrintUsage("embed",
                      "--timesteps is required (or one --part per embedding)",
                      specs);
  }
  absl::StatusOr<std::vector<PartArgs>> parts = PartsFromArgs(*args);
  if (!parts.ok()) return PrintError(parts.status());
  const bool multi_part = !(*parts)[0].name.empty();
  if (multi_part && format == "npy") {
    return PrintUsage("embed",
                      "a .npy file holds one tensor: use --format=json or "
                      "table with --part",
                      specs);
  }

  absl::StatusOr<std::vector<Result>> results;
  if (local) {
    results = EmbedLocal(*spec, *parts);
  } else {
    absl::StatusOr<ClientOptions> options = ClientOptionsFromArgs(*args);
    if (!options.ok()) {
      return PrintUsage("embed", std::string(options.status().message()),
                        specs);
    }
    results = EmbedRemote(*options, *spec, *parts);
  }
  if (!results.ok()) return PrintError(results.status());

  // .npy: the header, then the bytes from where they were computed.
  if (format == "npy") {
    const TensorView view = ViewOf(results->front());
    const std::string header = NpyHeader(view);
    if (std::fwrite(header.data(), 1, header.size(), stdout) != header.size() ||
        std::fwrite(view.data.data(), 1, view.data.size(), stdout) !=
            view.data.size() ||
        std::fflush(stdout) != 0) {
      return PrintError(absl::UnavailableError("cannot write to stdout"));
    }
    return kExitOk;
  }
  std::string out;
  if (multi_part && format == "json") {
    out = PartsToJson(*results);
  } else {
    for (size_t i = 0; i < results->size(); ++i) {
      const TensorView view = ViewOf((*results)[i]);
      if (format == "json") {
        out += ToJson(view);
      } else {
        if (multi_part) {
          absl::StrAppend(&out, "# part ", (*results)[i].name, "\n");
        }
        out += ToTable(view, (*parts)[i].timesteps);
      }
    }
  }
  if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size() ||
      std::fflush(stdout) != 0) {
    return PrintError(absl::UnavailableError("cannot write to stdout"));
  }
  return kExitOk;
}

}  // namespace temb::cli
