// _temb_local: the native core of temb.local, the in-process engine of the
// Python client (client/python/temb/local.py).
//
// The server's own service core (EmbedService: the built-in preset catalogue,
// ResolveSpec, the timestep validation, the auto backend), so every number and
// every error equals the server's.  No network and no protobuf on the fast
// path: a Plan is a spec resolved once (from the request message the Python
// client builds, through the same conversions as the server's frontend), and
// calling it takes the float32 timesteps through the buffer protocol and
// computes straight into a new numpy array.  Requests with parts go through
// EmbedRequestBytes, the native frontend's logic without gRPC.
//
// Errors are raised as what the Python error factory (_set_error_factory:
// temb.errors.error_from_code) makes of the status code and message, i.e. the
// same temb error classes the gRPC client raises.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "temb/base/status_macros.h"
#include "temb/core/conditioning_service.h"
#include "temb/core/embed_service.h"
#include "temb/core/presets.h"
#include "temb/core/timesteps.h"
#include "temb/core/version.h"
#include "temb/kernels/registry.h"
#include "temb/python_support/released_gil.h"
#include "temb/v1_convert/condition_convert.h"
#include "temb/v1_convert/conversions.h"
#include "temb/v1_convert/preset_catalog.h"

namespace py = pybind11;

namespace temb {
namespace {

// Outputs from this size on are computed with the GIL released.
constexpr int64_t kReleaseGilBytes = 64 << 10;

// temb.errors.error_from_code(code, details, request_id); kept for the life
// of the process (never released: it may outlive the interpreter's modules).
PyObject* g_error_factory = nullptr;

py::str Utf8(absl::string_view text) {
  // Messages quote caller text cut at a byte limit: never fail on it.
  PyObject* str = PyUnicode_DecodeUTF8(
      text.data(), static_cast<Py_ssize_t>(text.size()), "replace");
  if (str == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(str);
}

// Raises `status` as the temb error of its code.
[[noreturn]] void Raise(const absl::Status& status,
                        absl::string_view request_id = "") {
  if (g_error_factory == nullptr) {
    throw std::runtime_error(
        absl::StrCat("temb.local: ", status.ToString(),
                     " (no error factory registered: import temb.local)"));
  }
  py::object error = py::reinterpret_borrow<py::object>(g_error_factory)(
      static_cast<int>(status.code()), Utf8(status.message()),
      Utf8(request_id));
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())),
                  error.ptr());
  throw py::error_already_set();
}

template <typename T>
T ValueOrRaise(absl::StatusOr<T> value, absl::string_view request_id = "") {
  if (!value.ok()) Raise(value.status(), request_id);
  return std::move(*value);
}

// The numpy dtype of an output: little-endian is native here (the frontends
// assume a little-endian host too); bf16 as its raw uint16 bits.
py::dtype NumpyDType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return py::dtype("float32");
    case DType::kFloat16:
      return py::dtype("float16");
    case DType::kBFloat16:
      return py::dtype("uint16");
    case DType::kFloat64:
      return py::dtype("float64");
  }
  return py::dtype("float32");
}

// Hands EmbedService::Embed the memory of a numpy array allocated for the
// expected output.  A lent buffer (the CUDA backend's page-locked memory,
// a scarce resource a caller may hold on to) is copied out and given back.
class ArrayOutput final : public OutputAllocator {
 public:
  explicit ArrayOutput(absl::Span<uint8_t> memory) : memory_(memory) {}

  absl::Span<uint8_t> Allocate(size_t bytes) override {
    if (bytes == memory_.size()) return memory_;
    // Cannot happen (the array was sized from the same resolved spec); the
    // caller reports it after the computation.
    mismatch_ = true;
    scratch_.resize(bytes);
    return absl::MakeSpan(scratch_);
  }

  void Adopt(std::unique_ptr<HostBuffer> buffer) override {
    const absl::Span<uint8_t> lent = buffer->bytes();
    if (lent.size() != memory_.size()) {
      mismatch_ = true;
      return;
    }
    if (!lent.empty()) std::memcpy(memory_.data(), lent.data(), lent.size());
  }

  bool mismatch() const { return mismatch_; }

 private:
  absl::Span<uint8_t> memory_;
  std::vector<uint8_t> scratch_;
  bool mismatch_ = false;
};

// EmbedService::Embed(request) into a new numpy array of `shape` (the
// timesteps' shape + [spec.dim]); `spec` is what `request` resolves to.
absl::StatusOr<py::array> EmbedToArray(const EmbedService& service,
                                       const SpecRequest& request,
                                       const EmbeddingSpec& spec,
                                       const py::dtype& dtype,
                                       absl::Span<const float> timesteps,
                                       const std::vector<int64_t>& shape) {
  const Limits& limits = service.limits();
  const auto rows = static_cast<int64_t>(timesteps.size());
  const int64_t bytes = OutputBytes(spec, rows);
  // Over a limit, Embed refuses before it asks for memory: allocate nothing.
  const bool within_limits =
      rows <= limits.max_batch && bytes <= limits.max_output_bytes;
  py::array array;
  absl::Span<uint8_t> memory;
  if (within_limits) {
    array =
        py::array(dtype, std::vector<py::ssize_t>(shape.begin(), shape.end()));
    memory = absl::MakeSpan(static_cast<uint8_t*>(array.mutable_data()),
                            static_cast<size_t>(array.nbytes()));
  }
  ArrayOutput output(memory);
  absl::StatusOr<Embedding> embedding;
  if (bytes >= kReleaseGilBytes && within_limits) {
    python_support::ReleasedGil released;
    embedding = service.Embed(request, timesteps, nullptr, &output);
  } else {
    embedding = service.Embed(request, timesteps, nullptr, &output);
  }
  if (!embedding.ok()) return embedding.status();
  if (output.mismatch() || !within_limits ||
      embedding->size_bytes != static_cast<int64_t>(memory.size())) {
    return absl::InternalError(absl::StrCat(
        "temb.local: the output of ", embedding->size_bytes,
        " bytes does not fit the ", memory.size(), " bytes expected"));
  }
  return array;
}

// One configured service core: what a temb-server runs, minus gRPC.
class Core {
 public:
  Core(const std::string& backend, int cpu_threads,
       int64_t gpu_min_output_bytes, const std::string& presets_file) {
    const BackendChoice choice = ValueOrRaise(ParseBackendChoice(backend));
    BackendOptions options;
    options.cpu_threads = cpu_threads;
    if (gpu_min_output_bytes >= 0) {
      options.gpu_min_output_bytes = gpu_min_output_bytes;
    }
    PresetCatalog presets = presets_file.empty()
                                ? BuiltInPresetCatalog()
                                : ValueOrRaise(ReadPresetCatalog(presets_file));
    std::unique_ptr<Backend> engine =
        ValueOrRaise(CreateBackend(choice, options));
    EmbedService::Options service_options;
    service_options.fallback_options = options;
    service_ = std::make_shared<const EmbedService>(
        std::move(engine), std::move(presets), service_options);
  }

  const std::shared_ptr<const EmbedService>& service() const {
    return service_;
  }

 private:
  std::shared_ptr<const EmbedService> service_;
};

v1::EmbedRequest ParseRequest(const py::bytes& data) {
  char* bytes = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(data.ptr(), &bytes, &size) != 0) {
    throw py::error_already_set();
  }
  v1::EmbedRequest request;
  if (!request.ParseFromArray(bytes, static_cast<int>(size))) {
    Raise(absl::InvalidArgumentError("cannot parse the EmbedRequest"));
  }
  return request;
}

// A spec resolved once: calling it embeds timesteps with it.
class Plan {
 public:
  Plan(std::shared_ptr<const EmbedService> service, SpecRequest request,
       EmbeddingSpec spec)
      : service_(std::move(service)),
        request_(std::move(request)),
        spec_(std::move(spec)),
        dtype_(NumpyDType(spec_.dtype)) {}

  // The preset, spec fields and dtype of a serialized temb.v1.EmbedRequest
  // (its timesteps and parts are ignored), resolved as the server resolves
  // them.
  static Plan FromRequest(const Core& core, const py::bytes& data) {
    const v1::EmbedRequest message = ParseRequest(data);
    const EmbedService& service = *core.service();
    SpecRequest request = ValueOrRaise(SpecRequestFromProto(
        message.preset(), message.spec(), message.dtype()));
    const EmbeddingSpec spec =
        ValueOrRaise(ResolveSpec(request, service.presets(), service.limits()));
    // Saves Embed() the catalogue lookup on every call.
    if (!request.preset.empty()) {
      request.preset_entry = service.presets().Find(request.preset);
    }
    return Plan(core.service(), std::move(request), spec);
  }

  // timesteps: a float32 or int64 array of rank 0 to 5 (anything else is
  // converted to float32 by numpy); returns timesteps.shape + [dim] ([1, dim]
  // for a scalar).  Integers become float32 as the server converts
  // integer_timesteps.
  py::array Call(const py::handle& timesteps) const {
    using FloatArray = py::array_t<float, py::array::c_style>;
    using IntArray = py::array_t<int64_t, py::array::c_style>;
    if (Usable<FloatArray>(timesteps)) {
      const auto& array = py::reinterpret_borrow<py::array>(timesteps);
      return Compute(array.data(), false, array.ndim(), array.shape());
    }
    if (Usable<IntArray>(timesteps)) {
      const auto& array = py::reinterpret_borrow<py::array>(timesteps);
      return Compute(array.data(), true, array.ndim(), array.shape());
    }
    auto array =
        py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(
            timesteps);
    if (!array) throw py::error_already_set();
    return Compute(array.data(), false, array.ndim(), array.shape());
  }

  // The same from memory the caller keeps alive and vouches for (a CPU
  // torch tensor's data_ptr()): C-contiguous float32, or int64 when
  // `int64`, of `shape`.
  py::array CallRaw(uintptr_t address, const py::tuple& shape,
                    bool int64) const {
    std::vector<py::ssize_t> extents(shape.size());
    for (size_t i = 0; i < extents.size(); ++i) {
      extents[i] = shape[i].cast<py::ssize_t>();
    }
    return Compute(reinterpret_cast<const void*>(address), int64,
                   static_cast<py::ssize_t>(extents.size()), extents.data());
  }

  int dim() const { return spec_.dim; }
  std::string dtype() const { return std::string(DTypeName(spec_.dtype)); }

 private:
  // An aligned C-contiguous array of ArrayT's element type.
  template <typename ArrayT>
  static bool Usable(const py::handle& object) {
    return ArrayT::check_(object) &&
           (py::detail::array_proxy(object.ptr())->flags &
            py::detail::npy_api::NPY_ARRAY_ALIGNED_) != 0;
  }

  py::array Compute(const void* data, bool int64, py::ssize_t rank,
                    const py::ssize_t* extents) const {
    if (rank > kMaxTimestepsRank) {
      std::string shape = "(";
      for (py::ssize_t i = 0; i < rank; ++i) {
        absl::StrAppend(&shape, i > 0 ? ", " : "", extents[i]);
      }
      throw py::value_error(
          absl::StrCat("timesteps may have at most ", kMaxTimestepsRank,
                       " dimensions, got shape ", shape, ")"));
    }
    int64_t count = 1;
    for (py::ssize_t i = 0; i < rank; ++i) count *= extents[i];
    std::vector<int64_t> shape;
    if (rank > 1) shape.assign(extents, extents + rank);
    std::vector<float> converted;
    absl::Span<const float> values;
    if (int64) {
      converted = TimestepsAsFloat32(absl::MakeConstSpan(
          static_cast<const int64_t*>(data), static_cast<size_t>(count)));
      values = converted;
    } else {
      values = absl::MakeConstSpan(static_cast<const float*>(data),
                                   static_cast<size_t>(count));
    }
    std::vector<int64_t> out_shape =
        ValueOrRaise(EmbeddingShape(shape, count, spec_.dim));
    return ValueOrRaise(
        EmbedToArray(*service_, request_, spec_, dtype_, values, out_shape));
  }

  std::shared_ptr<const EmbedService> service_;
  SpecRequest request_;
  EmbeddingSpec spec_;
  py::dtype dtype_;
};

// Gives EmbedService::Serve the memory of a new numpy byte array for one
// part, made under the GIL while the computation runs without it; a lent
// buffer (the CUDA backend's page-locked memory) is copied out and given
// back.  Destroy it with the GIL held.
class NewArrayOutput final : public OutputAllocator {
 public:
  absl::Span<uint8_t> Allocate(size_t bytes) override {
    py::gil_scoped_acquire gil;
    array_ = py::array_t<uint8_t>(static_cast<py::ssize_t>(bytes));
    return absl::MakeSpan(static_cast<uint8_t*>(array_.mutable_data()), bytes);
  }

  void Adopt(std::unique_ptr<HostBuffer> buffer) override {
    const absl::Span<uint8_t> lent = buffer->bytes();
    const absl::Span<uint8_t> memory = Allocate(lent.size());
    if (!lent.empty()) std::memcpy(memory.data(), lent.data(), lent.size());
  }

  // The part's array: these bytes seen as its dtype and shape (no copy).
  py::array Take(const ResponsePart& part) {
    py::tuple shape(part.shape.size());
    for (size_t i = 0; i < part.shape.size(); ++i) {
      shape[i] = py::int_(part.shape[i]);
    }
    return array_.attr("view")(NumpyDType(part.embedding.spec.dtype))
        .attr("reshape")(shape);
  }

 private:
  py::array array_;
};

// A whole serialized temb.v1.EmbedRequest, parts included, answered by the
// core as the native frontend answers it (without the admission gate): a
// list of (part name, array), one ("", array) without parts.
absl::StatusOr<py::list> EmbedRequest(const EmbedService& service,
                                      const v1::EmbedRequest& request) {
  std::vector<std::vector<float>> storage;
  ASSIGN_OR_RETURN(const Request call, RequestFromProto(request, &storage));
  std::vector<NewArrayOutput> arrays(call.parts.size());
  std::vector<OutputAllocator*> outputs;
  for (NewArrayOutput& array : arrays) outputs.push_back(&array);
  absl::StatusOr<Response> served;
  {
    python_support::ReleasedGil released;
    served = service.Serve(call, nullptr, outputs);
  }
  if (!served.ok()) return served.status();
  py::list out;
  for (size_t i = 0; i < served->parts.size(); ++i) {
    const ResponsePart& part = served->parts[i];
    out.append(py::make_tuple(call.named_parts ? Utf8(part.name) : py::str(""),
                              arrays[i].Take(part)));
  }
  return out;
}

// What GetServerInfo answers, for this engine (max_message_bytes 0: no
// messages travel).
py::bytes ServerInfoBytes(const Core& core) {
  return py::bytes(ServerInfoProto(*core.service(), 0).SerializeAsString());
}

// The conditioning models of one model repository, in process: the
// server's ConditioningService (the same loader, limits, request checks and
// row cache) behind temb.v1's Condition messages, so that temb.local's
// condition() takes and returns what temb.Client's does.
class Conditioning {
 public:
  // Opens `repository` and loads every model before returning (with the GIL
  // released): in process, a model is used right after it is opened.
  // Folder names taken by the built-in presets are refused as a server with
  // the built-in catalogue refuses them.
  Conditioning(const std::string& repository, int threads,
               int64_t cache_bytes) {
    ConditioningService::Options options;
    options.threads = threads > 0
                          ? threads
                          : static_cast<int>(std::max(
                                1u, std::thread::hardware_concurrency()));
    if (cache_bytes >= 0) options.cache_bytes = cache_bytes;
    service_ = std::make_unique<ConditioningService>(options);
    const absl::Status opened = service_->OpenRepository(repository);
    if (!opened.ok()) {
      Raise(absl::Status(opened.code(),
                         absl::StrCat("model_repository: ", opened.message())));
    }
    python_support::ReleasedGil released;
    service_->WaitUntilLoaded(absl::InfiniteDuration());
  }

  // A serialized ServerInfo holding the models and the row cache's counters.
  py::bytes Info() const {
    v1::ServerInfo info;
    AddConditioningToServerInfo(*service_, &info);
    return py::bytes(info.SerializeAsString());
  }

  // A serialized ConditionRequest answered as a serialized
  // ConditionResponse, or raised as the server's error.
  py::bytes Condition(const py::bytes& data) const {
    v1::ConditionRequest request;
    const std::string_view bytes = data;
    if (!request.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      Raise(absl::InvalidArgumentError("not a temb.v1.ConditionRequest"));
    }
    absl::StatusOr<std::string> answer;
    {
      python_support::ReleasedGil released;
      answer = Serve(request);
    }
    if (!answer.ok()) Raise(answer.status(), request.request_id());
    return py::bytes(*answer);
  }

 private:
  absl::StatusOr<std::string> Serve(const v1::ConditionRequest& request) const {
    std::vector<std::vector<float>> storage;
    ASSIGN_OR_RETURN(const ConditionRequest call,
                     ConditionRequestFromProto(request, &storage));
    ASSIGN_OR_RETURN(ConditionResponse served, service_->Serve(call, nullptr));
    return ConditionResponseToProto(std::move(served), request.request_id())
        .SerializeAsString();
  }

  std::unique_ptr<ConditioningService> service_;
};

}  // namespace
}  // namespace temb

PYBIND11_MODULE(_temb_local, m) {
  using temb::Conditioning;
  using temb::Core;
  using temb::Plan;
  m.doc() =
      "temb's service core in-process: the native part of temb.local "
      "(use temb.local, not this module)";
  m.attr("version") = std::string(temb::Version());
  m.def(
      "_set_error_factory",
      [](py::object factory) {
        Py_XDECREF(temb::g_error_factory);
        temb::g_error_factory = factory.release().ptr();
      },
      "factory(code: int, details: str, request_id: str) -> exception");

  py::class_<Core, std::shared_ptr<Core>>(m, "Core")
      .def(py::init<const std::string&, int, int64_t, const std::string&>(),
           py::arg("backend") = "auto", py::arg("cpu_threads") = 0,
           py::arg("gpu_min_output_bytes") = -1, py::arg("presets_file") = "")
      .def_property_readonly("backend",
                             [](const Core& core) {
                               return std::string(temb::BackendKindName(
                                   core.service()->backend().kind()));
                             })
      .def_property_readonly(
          "device",
          [](const Core& core) { return core.service()->backend().device(); })
      .def(
          "plan",
          [](const Core& core, const py::bytes& request) {
            return Plan::FromRequest(core, request);
          },
          py::arg("request"),
          "A Plan for the preset, spec and dtype of a serialized "
          "temb.v1.EmbedRequest.")
      .def(
          "embed_request",
          [](const Core& core, const py::bytes& data) {
            const temb::v1::EmbedRequest request = temb::ParseRequest(data);
            return temb::ValueOrRaise(
                temb::EmbedRequest(*core.service(), request),
                request.request_id());
          },
          py::arg("request"),
          "A serialized temb.v1.EmbedRequest answered as the server does: "
          "[(part name, array)], [('', array)] without parts.")
      .def("server_info", &temb::ServerInfoBytes,
           "A serialized temb.v1.ServerInfo.");

  py::class_<Conditioning>(m, "Conditioning")
      .def(py::init<const std::string&, int, int64_t>(),
           py::arg("model_repository"), py::arg("cpu_threads") = 0,
           py::arg("cache_bytes") = -1)
      .def("info", &Conditioning::Info,
           "A serialized temb.v1.ServerInfo with the conditioning models.")
      .def("condition", &Conditioning::Condition, py::arg("request"),
           "A serialized temb.v1.ConditionRequest answered as a serialized "
           "temb.v1.ConditionResponse.");

  py::class_<Plan>(m, "Plan")
      .def("__call__", &Plan::Call, py::arg("timesteps"))
      .def("raw", &Plan::CallRaw, py::arg("address"), py::arg("shape"),
           py::arg("int64"))
      .def_property_readonly("dim", &Plan::dim)
      .def_property_readonly("dtype", &Plan::dtype);
}
