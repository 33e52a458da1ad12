// _temb_transport: temb.Client's Embed calls made by gRPC's C++ library
// instead of grpcio.
//
// Why: at batch 1 a temb.Client.embed() spent most of its time in grpcio's
// per-call Python machinery and in Python-level encoding and decoding, not
// on the wire.  Here a whole call (metadata, deadline, the blocking wait)
// runs in C++ with the GIL released, through one entry point:
//
//   channel.embed(head, request_id, timesteps, shaped, timeout)
//       -> (code, message, array or response_bytes): one Embed call whose
//       request is `head` (a serialized EmbedRequest: the whole request, or,
//       cached by the Python client per set of arguments, the request
//       without its timesteps) followed by the timesteps encoded here; a
//       single-tensor response comes back as a numpy array of its dtype and
//       shape (bf16 as uint16 bits), anything else (parts) as the response
//       bytes for the Python decoder.
//
// The few fields embed() reads and writes are encoded and parsed with
// protobuf's coded streams rather than temb's generated classes: a second
// copy of those in one process (temb.local's extension has one) would
// register temb.proto twice in libprotobuf's descriptor pool.  So this
// module includes the generated header, for the field numbers, enum values
// and field types, which are compile-time constants, and links none of the
// generated code: a change to temb.proto reaches it by a rebuild (or fails
// to compile here), with no copy of the numbers to keep in step.  They are
// exported (FIELDS, DTYPES) for the Python tests, which compare them with
// the Python stubs' descriptors.
//
// fork(): gRPC's C++ library does not survive it here (Debian builds it
// without fork support).  A child calling through its parent's channel
// writes HTTP/2 frames on the parent's socket: the child gets its answer
// and the parent's next call hangs.  A child that only opened a channel of
// its own broke the parent's next call as well (it shares the parent's
// gRPC state).  So a channel never calls in a process other than the one
// that created it, and is leaked there rather than destroyed (destruction
// would shut the shared socket down); the Python client moves its calls to
// grpcio in such a child, and makes no new native channel there.
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpc/grpc.h>
#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/impl/codegen/client_callback.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/channel_arguments.h>
#include <pthread.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "temb/python_support/released_gil.h"
#include "temb/v1/temb.pb.h"

namespace py = pybind11;
using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;
using google::protobuf::io::StringOutputStream;

namespace temb {
namespace {

// The method this module calls, and the temb.v1 fields it encodes and
// parses, as the generated header has them.
constexpr char kEmbedMethod[] = "/temb.v1.EmbeddingService/Embed";
constexpr int kRequestIdField = v1::EmbedRequest::kRequestIdFieldNumber;
constexpr int kTimestepsField = v1::EmbedRequest::kTimestepsFieldNumber;
constexpr int kIntegerTimestepsField =
    v1::EmbedRequest::kIntegerTimestepsFieldNumber;
constexpr int kTimestepsShapeField =
    v1::EmbedRequest::kTimestepsShapeFieldNumber;
constexpr int kEmbeddingField = v1::EmbedResponse::kEmbeddingFieldNumber;
constexpr int kPartsField = v1::EmbedResponse::kPartsFieldNumber;
constexpr int kTensorShapeField = v1::Tensor::kShapeFieldNumber;
constexpr int kTensorDTypeField = v1::Tensor::kDtypeFieldNumber;
constexpr int kTensorDataField = v1::Tensor::kDataFieldNumber;
// temb.v1.DType values (ToArray maps each to its numpy type).
constexpr int kDTypeFp32 = v1::DTYPE_FP32, kDTypeFp16 = v1::DTYPE_FP16,
              kDTypeBf16 = v1::DTYPE_BF16, kDTypeFp64 = v1::DTYPE_FP64;

// The field types the wire format below assumes: packed float32 and int64
// timesteps, an int64 shape, a DType enum, bytes.  Checked on the
// accessors' return types, in unevaluated operands (no generated code is
// called).
using AnyRequest = const v1::EmbedRequest&;
using AnyResponse = const v1::EmbedResponse&;
using AnyTensor = const v1::Tensor&;
static_assert(std::is_same_v<decltype(std::declval<AnyRequest>().request_id()),
                             const std::string&>);
static_assert(
    std::is_same_v<decltype(std::declval<AnyRequest>().timesteps(0)), float>);
static_assert(
    std::is_same_v<decltype(std::declval<AnyRequest>().integer_timesteps(0)),
                   int64_t>);
static_assert(
    std::is_same_v<decltype(std::declval<AnyRequest>().timesteps_shape(0)),
                   int64_t>);
static_assert(std::is_same_v<decltype(std::declval<AnyResponse>().embedding()),
                             const v1::Tensor&>);
static_assert(
    std::is_same_v<decltype(std::declval<AnyTensor>().shape(0)), int64_t>);
static_assert(
    std::is_same_v<decltype(std::declval<AnyTensor>().dtype()), v1::DType>);
static_assert(std::is_same_v<decltype(std::declval<AnyTensor>().data()),
                             const std::string&>);

// Appends request_id, the timesteps (packed float32 when `floats`, else
// int64) and, when `shaped`, timesteps_shape to `out`, as EmbedRequest
// fields.
void AppendTimesteps(const std::string& request_id, const py::array& timesteps,
                     bool floats, bool shaped, std::string* out) {
  StringOutputStream stream(out);
  CodedOutputStream coded(&stream);
  if (!request_id.empty()) {
    WireFormatLite::WriteString(kRequestIdField, request_id, &coded);
  }
  const auto count = static_cast<size_t>(timesteps.size());
  if (count > 0) {
    if (floats) {
      WireFormatLite::WriteTag(
          kTimestepsField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED, &coded);
      coded.WriteVarint32(static_cast<uint32_t>(count * 4));
      // Little-endian IEEE floats on the wire, as in memory here.
      coded.WriteRaw(timesteps.data(), static_cast<int>(count * 4));
    } else {
      const int64_t* values = static_cast<const int64_t*>(timesteps.data());
      size_t bytes = 0;
      for (size_t i = 0; i < count; ++i) {
        bytes +=
            CodedOutputStream::VarintSize64(static_cast<uint64_t>(values[i]));
      }
      WireFormatLite::WriteTag(kIntegerTimestepsField,
                               WireFormatLite::WIRETYPE_LENGTH_DELIMITED,
                               &coded);
      coded.WriteVarint32(static_cast<uint32_t>(bytes));
      for (size_t i = 0; i < count; ++i) {
        coded.WriteVarint64(static_cast<uint64_t>(values[i]));
      }
    }
  }
  if (shaped) {
    size_t bytes = 0;
    for (py::ssize_t d = 0; d < timesteps.ndim(); ++d) {
      bytes += CodedOutputStream::VarintSize64(
          static_cast<uint64_t>(timesteps.shape(d)));
    }
    WireFormatLite::WriteTag(kTimestepsShapeField,
                             WireFormatLite::WIRETYPE_LENGTH_DELIMITED, &coded);
    coded.WriteVarint32(static_cast<uint32_t>(bytes));
    for (py::ssize_t d = 0; d < timesteps.ndim(); ++d) {
      coded.WriteVarint64(static_cast<uint64_t>(timesteps.shape(d)));
    }
  }
}

// The single tensor of an EmbedResponse: its dtype, shape and data, read
// where they lie in `response`.  False when the response is anything else
// (parts, no embedding, a field it cannot read): the Python decoder then
// handles it and says what is wrong.
struct TensorView {
  int dtype = 0;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t size = 0;
};

bool ReadTensor(const uint8_t* begin, int length, TensorView* tensor) {
  CodedInputStream in(begin, length);
  while (uint32_t tag = in.ReadTag()) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    const auto type = WireFormatLite::GetTagWireType(tag);
    if (field == kTensorShapeField &&
        type == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      uint32_t bytes;
      if (!in.ReadVarint32(&bytes)) return false;
      const auto limit = in.PushLimit(static_cast<int>(bytes));
      while (in.BytesUntilLimit() > 0) {
        uint64_t extent;
        if (!in.ReadVarint64(&extent)) return false;
        tensor->shape.push_back(static_cast<int64_t>(extent));
      }
      in.PopLimit(limit);
    } else if (field == kTensorShapeField &&
               type == WireFormatLite::WIRETYPE_VARINT) {
      uint64_t extent;
      if (!in.ReadVarint64(&extent)) return false;
      tensor->shape.push_back(static_cast<int64_t>(extent));
    } else if (field == kTensorDTypeField &&
               type == WireFormatLite::WIRETYPE_VARINT) {
      uint32_t dtype;
      if (!in.ReadVarint32(&dtype)) return false;
      tensor->dtype = static_cast<int>(dtype);
    } else if (field == kTensorDataField &&
               type == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      uint32_t bytes;
      if (!in.ReadVarint32(&bytes)) return false;
      const int offset = in.CurrentPosition();
      if (!in.Skip(static_cast<int>(bytes))) return false;
      tensor->data = begin + offset;
      tensor->size = bytes;
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return false;
    }
  }
  return in.ConsumedEntireMessage();
}

bool ReadEmbedding(const std::string& response, TensorView* tensor) {
  const auto* begin = reinterpret_cast<const uint8_t*>(response.data());
  CodedInputStream in(begin, static_cast<int>(response.size()));
  bool found = false;
  while (uint32_t tag = in.ReadTag()) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    if (field == kPartsField) return false;
    if (field == kEmbeddingField &&
        WireFormatLite::GetTagWireType(tag) ==
            WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      uint32_t bytes;
      if (found || !in.ReadVarint32(&bytes)) return false;
      const int offset = in.CurrentPosition();
      if (!in.Skip(static_cast<int>(bytes)) ||
          !ReadTensor(begin + offset, static_cast<int>(bytes), tensor)) {
        return false;
      }
      found = true;
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return false;
    }
  }
  return found;
}

// The tensor as a new numpy array (one copy), or None when its dtype, shape
// and size do not agree.
py::object ToArray(const TensorView& tensor) {
  py::dtype dtype;
  switch (tensor.dtype) {
    case kDTypeFp32:
      dtype = py::dtype::of<float>();
      break;
    case kDTypeFp16:
      dtype = py::dtype("float16");
      break;
    case kDTypeBf16:
      dtype = py::dtype::of<uint16_t>();
      break;
    case kDTypeFp64:
      dtype = py::dtype::of<double>();
      break;
    default:
      return py::none();
  }
  if (tensor.shape.size() < 2) return py::none();
  size_t count = 1;
  for (int64_t extent : tensor.shape) {
    if (extent < 0) return py::none();
    count *= static_cast<size_t>(extent);
  }
  if (count * static_cast<size_t>(dtype.itemsize()) != tensor.size) {
    return py::none();
  }
  py::array array(dtype, tensor.shape);
  // Little-endian on the wire and in memory here.
  std::memcpy(array.mutable_data(), tensor.data, tensor.size);
  return std::move(array);
}

using ChannelOption = std::pair<std::string, std::variant<int, std::string>>;

// How many fork()s separate this process from the one that loaded the
// module: a channel remembers the count it was created under.
std::atomic<int> forks_since_load{0};

void NoteForkInChild() {
  forks_since_load.fetch_add(1, std::memory_order_relaxed);
}

class PendingEmbed;
class Completions;

class Channel {
 public:
  // root_certificates/private_key/certificate_chain: PEM; `tls` false means
  // plaintext.  `options`: gRPC channel arguments (integers or strings),
  // service config included.  `metadata`: sent with every call.
  Channel(const std::string& target, bool tls,
          const std::string& root_certificates, const std::string& private_key,
          const std::string& certificate_chain,
          const std::vector<ChannelOption>& options,
          std::vector<std::pair<std::string, std::string>> metadata)
      : metadata_(std::move(metadata)),
        created_after_forks_(forks_since_load.load(std::memory_order_relaxed)) {
    grpc::ChannelArguments arguments;
    for (const auto& [name, value] : options) {
      if (const int* number = std::get_if<int>(&value)) {
        arguments.SetInt(name, *number);
      } else {
        arguments.SetString(name, std::get<std::string>(value));
      }
    }
    std::shared_ptr<grpc::ChannelCredentials> credentials;
    if (tls) {
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = root_certificates;
      ssl.pem_private_key = private_key;
      ssl.pem_cert_chain = certificate_chain;
      credentials = grpc::SslCredentials(ssl);
    } else {
      credentials = grpc::InsecureChannelCredentials();
    }
    channel_ = grpc::CreateCustomChannel(target, credentials, arguments);
  }

  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  ~Channel() {
    // In a forked child the connection is the parent's: leak it.
    if (Inherited()) new std::shared_ptr<grpc::Channel>(std::move(channel_));
  }

  // Whether this process was forked from the one that created the channel.
  bool Inherited() const {
    return created_after_forks_ !=
           forks_since_load.load(std::memory_order_relaxed);
  }

  // One Embed call: `head` (a serialized EmbedRequest), then, when
  // `timesteps` is not None, `request_id` and the timesteps (float32 or
  // int64, C order; timesteps_shape sent when `shaped`) appended as fields.
  // Returns (code, message, result): result is a numpy array for a
  // single-tensor response, else the response bytes, or None on failure.
  py::tuple Embed(const py::bytes& head, const std::string& request_id,
                  const std::optional<py::array>& timesteps, bool shaped,
                  std::optional<double> timeout) {
    if (Inherited()) return Failure(InheritedStatus());
    std::string request = Request(head, request_id, timesteps, shaped);
    std::string response;
    grpc::Status status;
    {
      // Without the GIL: other Python threads go on meanwhile.
      python_support::ReleasedGil released;
      grpc::Slice slice(std::move(request));
      grpc::ByteBuffer request_buffer(&slice, 1);
      grpc::ClientContext context;
      Configure(timeout, &context);
      // What the generated synchronous stubs call, with ByteBuffer as the
      // message type: gRPC passes the bytes through unparsed.
      grpc::ByteBuffer response_buffer;
      status = grpc::internal::BlockingUnaryCall(channel_.get(), EmbedMethod(),
                                                 &context, request_buffer,
                                                 &response_buffer);
      if (status.ok()) status = Flatten(&response_buffer, &response);
    }
    return Result(status, response);
  }

  // embed() for asyncio: starts the same call and returns at once; when
  // it ends, `completions` gets it under `token` (see Completions).  The
  // returned call's cancel() ends it early (it then completes CANCELLED).
  std::shared_ptr<PendingEmbed> EmbedAsync(
      const py::bytes& head, const std::string& request_id,
      const std::optional<py::array>& timesteps, bool shaped,
      std::optional<double> timeout,
      const std::shared_ptr<Completions>& completions, uint64_t token);

  // (code, message, result) for a finished call, from its response bytes;
  // needs the GIL.
  static py::tuple Result(const grpc::Status& status,
                          const std::string& bytes) {
    if (!status.ok()) return Failure(status);
    TensorView tensor;
    if (ReadEmbedding(bytes, &tensor)) {
      py::object array = ToArray(tensor);
      if (!array.is_none()) return py::make_tuple(0, std::string(), array);
    }
    return py::make_tuple(0, std::string(), py::bytes(bytes));
  }

  // Why a channel refuses calls in a forked child.
  static grpc::Status InheritedStatus() {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        "this native channel was created before fork() in the parent "
        "process, and gRPC's C++ library cannot call from the child: use a "
        "client created in this process");
  }

  static grpc::internal::RpcMethod EmbedMethod() {
    return grpc::internal::RpcMethod(kEmbedMethod,
                                     grpc::internal::RpcMethod::NORMAL_RPC);
  }

  grpc::Channel* channel() const { return channel_.get(); }

  // Metadata and deadline of one call.
  void Configure(std::optional<double> timeout,
                 grpc::ClientContext* context) const {
    for (const auto& [key, value] : metadata_) context->AddMetadata(key, value);
    if (timeout.has_value()) {
      context->set_deadline(
          std::chrono::system_clock::now() +
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              std::chrono::duration<double>(*timeout)));
    }
  }

  // The request: `head` with the timesteps appended (see Embed).
  static std::string Request(const py::bytes& head,
                             const std::string& request_id,
                             const std::optional<py::array>& timesteps,
                             bool shaped) {
    std::string request = head;
    if (timesteps.has_value()) {
      const bool floats = timesteps->dtype().equal(py::dtype::of<float>());
      if (!floats && !timesteps->dtype().equal(py::dtype::of<int64_t>())) {
        throw py::type_error("timesteps must be a float32 or int64 array");
      }
      if (!(timesteps->flags() & py::array::c_style)) {
        throw py::value_error("timesteps must be C-contiguous");
      }
      AppendTimesteps(request_id, *timesteps, floats, shaped, &request);
    }
    return request;
  }

 private:
  static py::tuple Failure(const grpc::Status& status) {
    return py::make_tuple(static_cast<int>(status.error_code()),
                          status.error_message(), py::none());
  }

  // The response's bytes in one piece, for the parser; done without the
  // GIL (a large answer's copy would otherwise stall every Python thread).
  static grpc::Status Flatten(grpc::ByteBuffer* response, std::string* bytes) {
    std::vector<grpc::Slice> slices;
    if (!response->Dump(&slices).ok()) {
      return grpc::Status(grpc::StatusCode::DATA_LOSS, "unreadable response");
    }
    bytes->reserve(response->Length());
    for (const grpc::Slice& s : slices) {
      bytes->append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    return grpc::Status::OK;
  }

  std::shared_ptr<grpc::Channel> channel_;
  const std::vector<std::pair<std::string, std::string>> metadata_;
  const int created_after_forks_;
};

// One call started by Channel::EmbedAsync: what gRPC uses until the call
// ends.  No Python object lives here: gRPC's threads, which may free it,
// never hold the GIL.  In a forked child the call is the parent's: it is
// neither cancelled nor freed there (see fork() above).
class PendingEmbed {
 public:
  explicit PendingEmbed(uint64_t token)
      : token_(token),
        state_(std::make_unique<State>()),
        created_after_forks_(forks_since_load.load(std::memory_order_relaxed)) {
  }
  ~PendingEmbed() {
    if (Inherited()) state_.release();  // leaked on purpose
  }
  PendingEmbed(const PendingEmbed&) = delete;
  PendingEmbed& operator=(const PendingEmbed&) = delete;

  void Cancel() {
    if (!Inherited()) state_->context.TryCancel();
  }

 private:
  friend class Channel;
  friend class Completions;
  struct State {
    grpc::ClientContext context;
    grpc::ByteBuffer request;
    grpc::ByteBuffer response;
    grpc::Status status;
    std::string bytes;  // the response's, flattened on gRPC's thread
  };

  bool Inherited() const {
    return created_after_forks_ !=
           forks_since_load.load(std::memory_order_relaxed);
  }

  const uint64_t token_;
  std::unique_ptr<State> state_;
  const int created_after_forks_;
};

// Where an asyncio client's calls end: gRPC's thread queues the finished
// call and signals an eventfd, which the client's event loop watches
// (loop.add_reader); the loop then drains the queue on its own thread.
// So the GIL is only ever taken by the loop's thread: handing results over
// through call_soon_threadsafe instead (the GIL taken on gRPC's thread,
// then given to the woken loop) cost about 90 us per call more than the
// blocking call.
class Completions {
 public:
  Completions() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (fd_ < 0) throw std::system_error(errno, std::generic_category());
  }
  ~Completions() { close(fd_); }
  Completions(const Completions&) = delete;
  Completions& operator=(const Completions&) = delete;

  int fd() const { return fd_; }

  // On gRPC's thread.
  void Push(std::shared_ptr<PendingEmbed> call) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      finished_.push_back(std::move(call));
    }
    const uint64_t one = 1;
    // Cannot fail short of 2^64 - 1 unread signals.
    [[maybe_unused]] ssize_t written = write(fd_, &one, sizeof(one));
  }

  // On the loop's thread: [(token, (code, message, result))] of the calls
  // finished since the last drain.
  py::list Drain() {
    uint64_t signals;
    [[maybe_unused]] ssize_t read_bytes = read(fd_, &signals, sizeof(signals));
    std::vector<std::shared_ptr<PendingEmbed>> finished;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      finished.swap(finished_);
    }
    py::list results;
    for (const auto& call : finished) {
      results.append(py::make_tuple(
          call->token_,
          Channel::Result(call->state_->status, call->state_->bytes)));
    }
    return results;
  }

 private:
  const int fd_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<PendingEmbed>> finished_;
};

std::shared_ptr<PendingEmbed> Channel::EmbedAsync(
    const py::bytes& head, const std::string& request_id,
    const std::optional<py::array>& timesteps, bool shaped,
    std::optional<double> timeout,
    const std::shared_ptr<Completions>& completions, uint64_t token) {
  auto call = std::make_shared<PendingEmbed>(token);
  PendingEmbed::State& state = *call->state_;
  if (Inherited()) {
    state.status = InheritedStatus();
    completions->Push(call);
    return call;
  }
  grpc::Slice slice(Request(head, request_id, timesteps, shaped));
  state.request = grpc::ByteBuffer(&slice, 1);
  Configure(timeout, &state.context);
  // gRPC holds the call (through the lambda) until the callback has run;
  // the Python side holds it for cancel().
  grpc::internal::CallbackUnaryCall(
      channel(), EmbedMethod(), &state.context, &state.request, &state.response,
      [call, completions](grpc::Status status) {
        PendingEmbed::State& ended = *call->state_;
        if (status.ok()) {
          status = Channel::Flatten(&ended.response, &ended.bytes);
        }
        ended.status = std::move(status);
        completions->Push(call);
      });
  return call;
}

}  // namespace
}  // namespace temb

PYBIND11_MODULE(_temb_transport, m) {
  m.doc() = "temb.Client's Embed calls through gRPC's C++ library";
  m.attr("grpc_version") = grpc_version_string();
  // The temb version it was built from: temb._transport refuses a module
  // left over from another version, as temb.local does with _temb_local.
  m.attr("version") = TEMB_VERSION;
  pthread_atfork(nullptr, nullptr, temb::NoteForkInChild);
  py::class_<temb::Channel>(m, "Channel")
      .def(py::init<const std::string&, bool, const std::string&,
                    const std::string&, const std::string&,
                    const std::vector<temb::ChannelOption>&,
                    std::vector<std::pair<std::string, std::string>>>(),
           py::arg("target"), py::arg("tls"), py::arg("root_certificates"),
           py::arg("private_key"), py::arg("certificate_chain"),
           py::arg("options"), py::arg("metadata"))
      .def_property_readonly("inherited", &temb::Channel::Inherited)
      .def("embed", &temb::Channel::Embed, py::arg("head"),
           py::arg("request_id"), py::arg("timesteps"), py::arg("shaped"),
           py::arg("timeout"))
      .def("embed_async", &temb::Channel::EmbedAsync, py::arg("head"),
           py::arg("request_id"), py::arg("timesteps"), py::arg("shaped"),
           py::arg("timeout"), py::arg("completions"), py::arg("token"));
  py::class_<temb::Completions, std::shared_ptr<temb::Completions>>(
      m, "Completions")
      .def(py::init<>())
      .def_property_readonly("fd", &temb::Completions::fd)
      .def("drain", &temb::Completions::Drain);
  py::class_<temb::PendingEmbed, std::shared_ptr<temb::PendingEmbed>>(
      m, "PendingEmbed")
      .def("cancel", &temb::PendingEmbed::Cancel);
  // The temb.v1 field numbers this module encodes and parses (the Python
  // tests compare them with the .proto's descriptors).
  py::dict fields;
  fields["EmbedRequest.request_id"] = temb::kRequestIdField;
  fields["EmbedRequest.timesteps"] = temb::kTimestepsField;
  fields["EmbedRequest.integer_timesteps"] = temb::kIntegerTimestepsField;
  fields["EmbedRequest.timesteps_shape"] = temb::kTimestepsShapeField;
  fields["EmbedResponse.embedding"] = temb::kEmbeddingField;
  fields["EmbedResponse.parts"] = temb::kPartsField;
  fields["Tensor.shape"] = temb::kTensorShapeField;
  fields["Tensor.dtype"] = temb::kTensorDTypeField;
  fields["Tensor.data"] = temb::kTensorDataField;
  m.attr("FIELDS") = fields;
  py::dict dtypes;
  dtypes["DTYPE_FP32"] = temb::kDTypeFp32;
  dtypes["DTYPE_FP16"] = temb::kDTypeFp16;
  dtypes["DTYPE_BF16"] = temb::kDTypeBf16;
  dtypes["DTYPE_FP64"] = temb::kDTypeFp64;
  m.attr("DTYPES") = dtypes;
}
