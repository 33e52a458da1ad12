#include "temb/rest/rest_json.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "nlohmann/json.hpp"
#include "temb/base/status_macros.h"
#include "temb/kernels/dtype.h"
#include "temb/kserve/tensor_type.h"

// Raw tensors are little-endian on the wire.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the REST frontend assumes a little-endian host");

namespace temb::rest {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using inference::InferParameter;
using inference::InferTensorContents;
using nlohmann::json;
using Params = google::protobuf::Map<std::string, InferParameter>;
using kserve::ParseTensorType;
using kserve::TensorType;
using kserve::TensorTypeSize;

// Strings from clients (ids, names) may be invalid UTF-8: replaced, never
// an exception.
std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

json ToJsonValue(const Message& message);

json ScalarToJson(const Message& message, const Reflection& reflection,
                  const FieldDescriptor* field, int index) {
  const bool repeated = index >= 0;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return repeated ? reflection.GetRepeatedInt32(message, field, index)
                      : reflection.GetInt32(message, field);
    case FieldDescriptor::CPPTYPE_INT64:
      return repeated ? reflection.GetRepeatedInt64(message, field, index)
                      : reflection.GetInt64(message, field);
    case FieldDescriptor::CPPTYPE_UINT32:
      return repeated ? reflection.GetRepeatedUInt32(message, field, index)
                      : reflection.GetUInt32(message, field);
    case FieldDescriptor::CPPTYPE_UINT64:
      return repeated ? reflection.GetRepeatedUInt64(message, field, index)
                      : reflection.GetUInt64(message, field);
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return repeated ? reflection.GetRepeatedDouble(message, field, index)
                      : reflection.GetDouble(message, field);
    case FieldDescriptor::CPPTYPE_FLOAT:
      return repeated ? reflection.GetRepeatedFloat(message, field, index)
                      : reflection.GetFloat(message, field);
    case FieldDescriptor::CPPTYPE_BOOL:
      return repeated ? reflection.GetRepeatedBool(message, field, index)
                      : reflection.GetBool(message, field);
    case FieldDescriptor::CPPTYPE_ENUM:
      return (repeated ? reflection.GetRepeatedEnum(message, field, index)
                       : reflection.GetEnum(message, field))
          ->name();
    case FieldDescriptor::CPPTYPE_STRING:
      return repeated ? reflection.GetRepeatedString(message, field, index)
                      : reflection.GetString(message, field);
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return ToJsonValue(
          repeated ? reflection.GetRepeatedMessage(message, field, index)
                   : reflection.GetMessage(message, field));
  }
  return nullptr;
}

// An InferParameter is its one value, as Triton writes parameters.
json ParameterToJson(const InferParameter& param) {
  switch (param.parameter_choice_case()) {
    case InferParameter::kBoolParam:
      return param.bool_param();
    case InferParameter::kInt64Param:
      return param.int64_param();
    case InferParameter::kStringParam:
      return param.string_param();
    case InferParameter::kDoubleParam:
      return param.double_param();
    case InferParameter::kUint64Param:
      return param.uint64_param();
    case InferParameter::PARAMETER_CHOICE_NOT_SET:
      break;
  }
  return nullptr;
}

json ToJsonValue(const Message& message) {
  if (const auto* param = dynamic_cast<const InferParameter*>(&message)) {
    return ParameterToJson(*param);
  }
  json out = json::object();
  const google::protobuf::Descriptor* descriptor = message.GetDescriptor();
  const Reflection& reflection = *message.GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    if (field->is_map()) {
      json map = json::object();
      const FieldDescriptor* key = field->message_type()->map_key();
      const FieldDescriptor* value = field->message_type()->map_value();
      for (int j = 0; j < reflection.FieldSize(message, field); ++j) {
        const Message& entry = reflection.GetRepeatedMessage(message, field, j);
        const Reflection& entry_reflection = *entry.GetReflection();
        const json key_json = ScalarToJson(entry, entry_reflection, key, -1);
        map[key_json.is_string() ? key_json.get<std::string>()
                                 : Dump(key_json)] =
            ScalarToJson(entry, entry_reflection, value, -1);
      }
      out[field->name()] = std::move(map);
    } else if (field->is_repeated()) {
      json list = json::array();
      for (int j = 0; j < reflection.FieldSize(message, field); ++j) {
        list.push_back(ScalarToJson(message, reflection, field, j));
      }
      out[field->name()] = std::move(list);
    } else if (field->containing_oneof() != nullptr &&
               !reflection.HasField(message, field)) {
      continue;  // only the oneof member that is set
    } else {
      out[field->name()] = ScalarToJson(message, reflection, field, -1);
    }
  }
  return out;
}

// ---- infer requests --------------------------------------------------------

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", what));
}

absl::StatusOr<InferParameter> ParameterFromJson(const json& value,
                                                 absl::string_view field) {
  InferParameter param;
  if (value.is_boolean()) {
    param.set_bool_param(value.get<bool>());
  } else if (value.is_number_integer()) {
    if (value.is_number_unsigned() &&
        value.get<uint64_t>() >
            static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      param.set_uint64_param(value.get<uint64_t>());
    } else {
      param.set_int64_param(value.get<int64_t>());
    }
  } else if (value.is_number_float()) {
    param.set_double_param(value.get<double>());
  } else if (value.is_string()) {
    param.set_string_param(value.get<std::string>());
  } else {
    return Invalid(field, "must be a boolean, number or string");
  }
  return param;
}

absl::Status ParametersFromJson(const json& object, absl::string_view field,
                                Params* out) {
  if (!object.is_object()) return Invalid(field, "must be a JSON object");
  for (const auto& [key, value] : object.items()) {
    ASSIGN_OR_RETURN(
        (*out)[key],
        ParameterFromJson(value, absl::StrCat(field, "[\"", key, "\"]")));
  }
  return absl::OkStatus();
}

const json* Member(const json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

absl::StatusOr<std::string> StringMember(const json& object, const char* key,
                                         absl::string_view field,
                                         bool required) {
  const json* value = Member(object, key);
  if (value == nullptr) {
    if (required) return Invalid(field, "is required");
    return std::string();
  }
  if (!value->is_string()) return Invalid(field, "must be a string");
  return value->get<std::string>();
}

template <typename Int>
absl::StatusOr<Int> IntegerElement(const json& value, absl::string_view field) {
  if (!value.is_number_integer()) return Invalid(field, "must be an integer");
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<Int>::max())) {
      return Invalid(field, "is out of the datatype's range");
    }
    return static_cast<Int>(v);
  }
  const int64_t v = value.get<int64_t>();
  if (v < static_cast<int64_t>(std::numeric_limits<Int>::min()) ||
      (v > 0 && static_cast<uint64_t>(v) >
                    static_cast<uint64_t>(std::numeric_limits<Int>::max()))) {
    return Invalid(field, "is out of the datatype's range");
  }
  return static_cast<Int>(v);
}

// One JSON element into the typed contents of `type`.
absl::Status AppendElement(TensorType type, const json& value,
                           absl::string_view element,
                           InferTensorContents* contents) {
  switch (type) {
    case TensorType::kFp32:
    case TensorType::kFp64:
      if (!value.is_number()) return Invalid(element, "must be a number");
      if (type == TensorType::kFp32) {
        contents->add_fp32_contents(static_cast<float>(value.get<double>()));
      } else {
        contents->add_fp64_contents(value.get<double>());
      }
      return absl::OkStatus();
    case TensorType::kInt64: {
      ASSIGN_OR_RETURN(int64_t v, IntegerElement<int64_t>(value, element));
      contents->add_int64_contents(v);
      return absl::OkStatus();
    }
    case TensorType::kInt32: {
      ASSIGN_OR_RETURN(int32_t v, IntegerElement<int32_t>(value, element));
      contents->add_int_contents(v);
      return absl::OkStatus();
    }
    case TensorType::kInt16: {
      ASSIGN_OR_RETURN(int16_t v, IntegerElement<int16_t>(value, element));
      contents->add_int_contents(v);
      return absl::OkStatus();
    }
    case TensorType::kInt8: {
      ASSIGN_OR_RETURN(int8_t v, IntegerElement<int8_t>(value, element));
      contents->add_int_contents(v);
      return absl::OkStatus();
    }
    case TensorType::kUint64: {
      ASSIGN_OR_RETURN(uint64_t v, IntegerElement<uint64_t>(value, element));
      contents->add_uint64_contents(v);
      return absl::OkStatus();
    }
    case TensorType::kUint32: {
      ASSIGN_OR_RETURN(uint32_t v, IntegerElement<uint32_t>(value, element));
      contents->add_uint_contents(v);
      return absl::OkStatus();
    }
    case TensorType::kUint16: {
      ASSIGN_OR_RETURN(uint16_t v, IntegerElement<uint16_t>(value, element));
      contents->add_uint_contents(v);
      return absl::OkStatus();
    }
    case TensorType::kUint8: {
      ASSIGN_OR_RETURN(uint8_t v, IntegerElement<uint8_t>(value, element));
      contents->add_uint_contents(v);
      return absl::OkStatus();
    }
    case TensorType::kBool:
      if (!value.is_boolean()) return Invalid(element, "must be a boolean");
      contents->add_bool_contents(value.get<bool>());
      return absl::OkStatus();
    case TensorType::kBytes:
      if (!value.is_string()) return Invalid(element, "must be a string");
      contents->add_bytes_contents(value.get<std::string>());
      return absl::OkStatus();
    case TensorType::kFp16:
    case TensorType::kBf16:
      break;
  }
  return absl::InternalError("no JSON form for this datatype");
}

// The elements of one input's "data" (flattened while parsing) into the
// typed contents of its datatype.
absl::Status DataFromJson(const std::vector<json>& elements,
                          const std::string& datatype, int64_t count,
                          absl::string_view field, ReserveParseBytes reserve,
                          InferTensorContents* contents) {
  const std::optional<TensorType> type = ParseTensorType(datatype);
  if (!type.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": unknown datatype \"", datatype, "\""));
  }
  if (type == TensorType::kFp16 || type == TensorType::kBf16) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", datatype,
        " tensors travel only as binary data (parameters.binary_data_size)"));
  }
  if (static_cast<int64_t>(elements.size()) != count) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has ", elements.size(),
                     " elements, but the input's shape needs ", count));
  }
  // Typed contents take at most 8 bytes an element, twice while a repeated
  // field grows, and their raw copy (next to binary inputs) 8 more; a
  // string is copied twice more with its header.
  int64_t bytes = static_cast<int64_t>(elements.size()) * 24;
  if (type == TensorType::kBytes) {
    for (const json& element : elements) {
      if (element.is_string()) {
        bytes += 2 * (32 + static_cast<int64_t>(
                               element.get_ref<const std::string&>().size()));
      }
    }
  }
  RETURN_IF_ERROR(reserve(bytes));
  for (size_t i = 0; i < elements.size(); ++i) {
    RETURN_IF_ERROR(AppendElement(*type, elements[i],
                                  absl::StrCat(field, "[", i, "]"), contents));
  }
  return absl::OkStatus();
}

template <typename T, typename Values>
void AppendRaw(const Values& values, std::string* out) {
  for (const auto value : values) {
    const T element = static_cast<T>(value);
    out->append(reinterpret_cast<const char*>(&element), sizeof(T));
  }
}

// Typed contents of `datatype` as raw little-endian bytes (for a JSON input
// next to binary ones: the protocol has raw contents for all inputs or for
// none).
std::string ContentsToRaw(const std::string& datatype,
                          const InferTensorContents& c) {
  std::string raw;
  // DataFromJson accepted the datatype.
  switch (ParseTensorType(datatype).value_or(TensorType::kBytes)) {
    case TensorType::kFp32:
      AppendRaw<float>(c.fp32_contents(), &raw);
      break;
    case TensorType::kFp64:
      AppendRaw<double>(c.fp64_contents(), &raw);
      break;
    case TensorType::kInt64:
      AppendRaw<int64_t>(c.int64_contents(), &raw);
      break;
    case TensorType::kInt32:
      AppendRaw<int32_t>(c.int_contents(), &raw);
      break;
    case TensorType::kInt16:
      AppendRaw<int16_t>(c.int_contents(), &raw);
      break;
    case TensorType::kInt8:
      AppendRaw<int8_t>(c.int_contents(), &raw);
      break;
    case TensorType::kUint64:
      AppendRaw<uint64_t>(c.uint64_contents(), &raw);
      break;
    case TensorType::kUint32:
      AppendRaw<uint32_t>(c.uint_contents(), &raw);
      break;
    case TensorType::kUint16:
      AppendRaw<uint16_t>(c.uint_contents(), &raw);
      break;
    case TensorType::kUint8:
      AppendRaw<uint8_t>(c.uint_contents(), &raw);
      break;
    case TensorType::kBool:
      AppendRaw<uint8_t>(c.bool_contents(), &raw);
      break;
    case TensorType::kBytes:
      for (const std::string& s : c.bytes_contents()) {
        const uint32_t size = static_cast<uint32_t>(s.size());
        raw.append(reinterpret_cast<const char*>(&size), sizeof(size));
        raw.append(s);
      }
      break;
    case TensorType::kFp16:
    case TensorType::kBf16:
      break;  // binary only: never typed contents
  }
  return raw;
}

// ---- infer responses -------------------------------------------------------

bool OutputIsBinary(const InferBody& body, const std::string& name) {
  for (const auto& [requested, binary] : body.requested_outputs) {
    if (requested == name) return binary.value_or(body.binary_data_output);
  }
  return body.binary_data_output;
}

template <typename T>
T Load(const char* data, size_t i) {
  T value;
  std::memcpy(&value, data + i * sizeof(T), sizeof(T));
  return value;
}

// Shortest text that reads back as the same value.
template <typename T>
absl::Status AppendNumber(T value, std::string* out) {
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(value)) {
      return absl::InvalidArgumentError(
          "an output value is not finite, which JSON cannot carry; ask for "
          "the output with \"binary_data\": true");
    }
  }
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  out->append(buffer, result.ptr);
  return absl::OkStatus();
}

// One element of `type` at index i of `data`, as JSON text.
absl::Status AppendElementJson(TensorType type, const char* data, size_t i,
                               std::string* out) {
  switch (type) {
    case TensorType::kFp32:
      return AppendNumber(Load<float>(data, i), out);
    case TensorType::kFp64:
      return AppendNumber(Load<double>(data, i), out);
    case TensorType::kFp16:
      return AppendNumber(HalfToFloat(Load<uint16_t>(data, i)), out);
    case TensorType::kInt64:
      return AppendNumber(Load<int64_t>(data, i), out);
    case TensorType::kInt32:
      return AppendNumber(Load<int32_t>(data, i), out);
    case TensorType::kInt16:
      return AppendNumber(Load<int16_t>(data, i), out);
    case TensorType::kInt8:
      return AppendNumber(static_cast<int>(Load<int8_t>(data, i)), out);
    case TensorType::kUint64:
      return AppendNumber(Load<uint64_t>(data, i), out);
    case TensorType::kUint32:
      return AppendNumber(Load<uint32_t>(data, i), out);
    case TensorType::kUint16:
      return AppendNumber(Load<uint16_t>(data, i), out);
    case TensorType::kUint8:
      return AppendNumber(static_cast<unsigned>(Load<uint8_t>(data, i)), out);
    case TensorType::kBool:
      out->append(data[i] != 0 ? "true" : "false");
      return absl::OkStatus();
    case TensorType::kBf16:
    case TensorType::kBytes:
      break;
  }
  return absl::InternalError("no JSON form for this datatype");
}

// The elements of `raw` as a JSON array appended to `out`.
absl::Status AppendDataJson(const std::string& name,
                            const std::string& datatype, const std::string& raw,
                            std::string* out) {
  const std::optional<TensorType> type = ParseTensorType(datatype);
  if (!type.has_value() || type == TensorType::kBf16 ||
      type == TensorType::kBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("output \"", name, "\" is ", datatype,
                     ", which travels only as binary data: ask for it with "
                     "\"parameters\": {\"binary_data\": true}"));
  }
  const size_t n = raw.size() / TensorTypeSize(*type);
  out->push_back('[');
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) out->push_back(',');
    RETURN_IF_ERROR(AppendElementJson(*type, raw.data(), i, out));
  }
  out->push_back(']');
  return absl::OkStatus();
}

}  // namespace

std::string MessageToJson(const Message& message) {
  return Dump(ToJsonValue(message));
}

std::string ErrorJson(absl::string_view message) {
  return Dump(json{{"error", std::string(message)}});
}

namespace {

// Follows the nlohmann parser's events through an infer body: keeps the
// elements of each inputs[i].data out of the document, flat (a nested
// [[x], [x]] would otherwise hold an array per row, tens of bytes for each
// few bytes of text), refuses nesting deeper than kMaxJsonDepth (every
// later walk of a document recurses per level), and asks `reserve` for
// what the document and the elements will hold, in steps, before they hold
// it.
class InferBodyParse {
 public:
  explicit InferBodyParse(ReserveParseBytes reserve) : reserve_(reserve) {}

  // Why the parse was stopped: thrown out of the parser's callback.
  struct Stop {
    absl::Status status;
  };

  // The parser's callback; false drops the value from the document.
  bool OnEvent(json::parse_event_t event, json& parsed) {
    using Event = json::parse_event_t;
    switch (event) {
      case Event::object_start:
      case Event::array_start:
        return Open(event == Event::array_start);
      case Event::key:
        frames_.back().key = KeyOf(parsed.get_ref<const std::string&>());
        Charge(kKeyBytes + parsed.get_ref<const std::string&>().size());
        return true;
      case Event::value:
        Charge(kValueBytes + (parsed.is_string()
                                  ? parsed.get_ref<const std::string&>().size()
                                  : 0));
        if (InData()) {
          data_[input_].elements.push_back(std::move(parsed));
          return false;
        }
        return true;
      case Event::object_end:
      case Event::array_end: {
        const Kind kind = frames_.back().kind;
        frames_.pop_back();
        // Rows inside "data" are emptied as they are parsed; drop them.
        return kind != Kind::kDataRow;
      }
    }
    return true;
  }

  // Reserves what was charged since the last step.
  absl::Status Settle() {
    const int64_t bytes = charged_;
    charged_ = 0;
    return bytes > 0 ? reserve_(bytes) : absl::OkStatus();
  }

  // The flattened elements of inputs[i].data; nullptr when it had none.
  const std::vector<json>* Data(size_t i) const {
    return i < data_.size() && data_[i].present ? &data_[i].elements : nullptr;
  }
  void Release(size_t i) {
    if (i < data_.size()) std::vector<json>().swap(data_[i].elements);
  }

 private:
  // A generous estimate of the heap a parsed node takes with its
  // allocator overhead and its slot in the parent: an array or object, a
  // key (a map node), a scalar or a string's header.
  static constexpr int64_t kContainerBytes = 128;
  static constexpr int64_t kKeyBytes = 96;
  static constexpr int64_t kValueBytes = 48;
  static constexpr int64_t kStepBytes = int64_t{64} << 10;

  enum class Key { kOther, kInputs, kData };
  enum class Kind { kObject, kArray, kInputs, kInput, kData, kDataRow };
  struct Frame {
    Kind kind;
    Key key = Key::kOther;  // objects: the key whose value comes next
  };
  struct InputData {
    bool present = false;
    std::vector<json> elements;
  };

  static Key KeyOf(const std::string& key) {
    if (key == "inputs") return Key::kInputs;
    if (key == "data") return Key::kData;
    return Key::kOther;
  }

  bool InData() const {
    return !frames_.empty() && (frames_.back().kind == Kind::kData ||
                                frames_.back().kind == Kind::kDataRow);
  }

  bool Open(bool array) {
    if (frames_.size() >= static_cast<size_t>(kMaxJsonDepth)) {
      throw Stop{absl::InvalidArgumentError(
          absl::StrCat("the request body's JSON nests deeper than ",
                       kMaxJsonDepth, " levels"))};
    }
    Kind kind = array ? Kind::kArray : Kind::kObject;
    const Frame* parent = frames_.empty() ? nullptr : &frames_.back();
    if (InData()) {
      if (!array) {
        throw Stop{absl::InvalidArgumentError(
            absl::StrCat("inputs[", input_,
                         "].data: elements must be numbers, booleans or "
                         "strings (nested arrays are flattened), not "
                         "objects"))};
      }
      kind = Kind::kDataRow;
    } else if (parent != nullptr && parent->kind == Kind::kInputs && !array) {
      kind = Kind::kInput;
      input_ = data_.size();
      data_.emplace_back();
    } else if (array && parent != nullptr && frames_.size() == 1 &&
               parent->key == Key::kInputs) {
      kind = Kind::kInputs;
    } else if (array && parent != nullptr && parent->kind == Kind::kInput &&
               parent->key == Key::kData) {
      if (data_[input_].present) {
        throw Stop{absl::InvalidArgumentError(
            absl::StrCat("inputs[", input_, "] has \"data\" twice"))};
      }
      data_[input_].present = true;
      kind = Kind::kData;
    }
    frames_.push_back(Frame{kind});
    // A row inside "data" is dropped, emptied, as it closes: only the
    // elements it held stay (charged as they are parsed).
    if (kind != Kind::kDataRow) Charge(kContainerBytes);
    return true;
  }

  void Charge(int64_t bytes) {
    charged_ += bytes;
    if (charged_ >= kStepBytes) {
      if (absl::Status status = Settle(); !status.ok()) {
        throw Stop{std::move(status)};
      }
    }
  }

  ReserveParseBytes reserve_;
  std::vector<Frame> frames_;
  std::vector<InputData> data_;
  size_t input_ = 0;
  int64_t charged_ = 0;
};

}  // namespace

absl::StatusOr<InferBody> ParseInferBody(absl::string_view body,
                                         std::optional<uint64_t> json_length) {
  return ParseInferBody(body, json_length,
                        [](int64_t) { return absl::OkStatus(); });
}

absl::StatusOr<InferBody> ParseInferBody(absl::string_view body,
                                         std::optional<uint64_t> json_length,
                                         ReserveParseBytes reserve) {
  if (json_length.has_value() && *json_length > body.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Inference-Header-Content-Length (", *json_length,
                     ") is larger than the body (", body.size(), " bytes)"));
  }
  const absl::string_view header =
      json_length.has_value() ? body.substr(0, *json_length) : body;
  absl::string_view binary =
      json_length.has_value() ? body.substr(*json_length) : absl::string_view();

  // The lexer holds a copy of the longest token while it reads it.
  RETURN_IF_ERROR(reserve(static_cast<int64_t>(header.size())));
  InferBodyParse parse(reserve);
  json root;
  try {
    root = json::parse(header.begin(), header.end(),
                       [&parse](int, json::parse_event_t event, json& parsed) {
                         return parse.OnEvent(event, parsed);
                       });
  } catch (const InferBodyParse::Stop& stop) {
    return stop.status;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed JSON in the request body: ", e.what(),
        json_length.has_value()
            ? ""
            : " (binary tensor data needs the Inference-Header-Content-Length "
              "header)"));
  }
  RETURN_IF_ERROR(parse.Settle());
  if (!root.is_object()) {
    return absl::InvalidArgumentError("the request body must be a JSON object");
  }

  InferBody out;
  inference::ModelInferRequest& request = out.request;
  ASSIGN_OR_RETURN(*request.mutable_id(),
                   StringMember(root, "id", "id", /*required=*/false));
  if (const json* params = Member(root, "parameters")) {
    RETURN_IF_ERROR(ParametersFromJson(*params, "parameters",
                                       request.mutable_parameters()));
    const auto it = request.parameters().find("binary_data_output");
    if (it != request.parameters().end()) {
      if (it->second.parameter_choice_case() != InferParameter::kBoolParam) {
        return Invalid("parameters[\"binary_data_output\"]",
                       "must be a boolean");
      }
      out.binary_data_output = it->second.bool_param();
    }
  }

  const json* inputs = Member(root, "inputs");
  if (inputs == nullptr || !inputs->is_array()) {
    return Invalid("inputs", "is required and must be an array");
  }
  // Binary inputs' bytes, in input order; empty entries for JSON ones.
  std::vector<std::optional<uint64_t>> binary_sizes;
  bool any_binary = false;
  for (size_t i = 0; i < inputs->size(); ++i) {
    const json& input = (*inputs)[i];
    const std::string field = absl::StrCat("inputs[", i, "]");
    if (!input.is_object()) return Invalid(field, "must be a JSON object");
    auto* tensor = request.add_inputs();
    ASSIGN_OR_RETURN(
        *tensor->mutable_name(),
        StringMember(input, "name", field + ".name", /*required=*/true));
    ASSIGN_OR_RETURN(*tensor->mutable_datatype(),
                     StringMember(input, "datatype", field + ".datatype",
                                  /*required=*/true));
    const json* shape = Member(input, "shape");
    if (shape == nullptr || !shape->is_array()) {
      return Invalid(field + ".shape", "is required and must be an array");
    }
    int64_t count = 1;
    for (const json& extent : *shape) {
      if (!extent.is_number_integer() ||
          (!extent.is_number_unsigned() && extent.get<int64_t>() < 0)) {
        return Invalid(field + ".shape",
                       "must hold non-negative integers, got " + Dump(*shape));
      }
      const int64_t e = extent.get<int64_t>();
      if (e < 0 || (e > 0 && count > std::numeric_limits<int64_t>::max() / e)) {
        return Invalid(field + ".shape", "is too large");
      }
      tensor->add_shape(e);
      count *= e;
    }
    std::optional<uint64_t> binary_size;
    if (const json* params = Member(input, "parameters")) {
      RETURN_IF_ERROR(ParametersFromJson(*params, field + ".parameters",
                                         tensor->mutable_parameters()));
      auto& map = *tensor->mutable_parameters();
      const auto it = map.find("binary_data_size");
      if (it != map.end()) {
        const InferParameter& p = it->second;
        if (p.parameter_choice_case() == InferParameter::kInt64Param &&
            p.int64_param() >= 0) {
          binary_size = static_cast<uint64_t>(p.int64_param());
        } else if (p.parameter_choice_case() == InferParameter::kUint64Param) {
          binary_size = p.uint64_param();
        } else {
          return Invalid(field + ".parameters[\"binary_data_size\"]",
                         "must be a non-negative integer");
        }
        map.erase(it);  // transport only: the model never sees it
      }
    }
    const json* data = Member(input, "data");
    if (binary_size.has_value()) {
      if (data != nullptr) {
        return Invalid(field, "has both \"data\" and binary_data_size");
      }
      any_binary = true;
    } else if (data != nullptr) {
      // An array's elements were kept aside, flat, while parsing.
      const std::vector<json>* elements = parse.Data(i);
      if (!data->is_array() || elements == nullptr) {
        return Invalid(field + ".data",
                       "must be an array (nested arrays are flattened)");
      }
      RETURN_IF_ERROR(DataFromJson(*elements, tensor->datatype(), count,
                                   field + ".data", reserve,
                                   tensor->mutable_contents()));
      parse.Release(i);
    } else if (tensor->parameters().count("shared_memory_region") == 0) {
      return Invalid(field,
                     "needs \"data\", parameters.binary_data_size or "
                     "parameters.shared_memory_region");
    }
    binary_sizes.push_back(binary_size);
  }

  // Each term is checked against what is left, so the sum cannot wrap.
  uint64_t declared = 0;
  for (const auto& size : binary_sizes) {
    if (size.value_or(0) > binary.size() - declared) {
      return absl::InvalidArgumentError(absl::StrCat(
          "binary tensor data: the inputs' binary_data_size add up to more "
          "than the ",
          binary.size(), " bytes the body carries after the JSON header"));
    }
    declared += size.value_or(0);
  }
  if (declared != binary.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "binary tensor data: the inputs' binary_data_size add up to ", declared,
        " bytes, but the body carries ", binary.size(),
        " bytes after the JSON header",
        json_length.has_value()
            ? ""
            : " (binary data needs the Inference-Header-Content-Length "
              "header)"));
  }
  if (any_binary) {
    // Binary inputs are copied out of the body (JSON ones' raw copies were
    // reserved with their typed contents).
    RETURN_IF_ERROR(reserve(static_cast<int64_t>(binary.size())));
    for (int i = 0; i < request.inputs_size(); ++i) {
      auto* tensor = request.mutable_inputs(i);
      if (binary_sizes[i].has_value()) {
        request.add_raw_input_contents(
            std::string(binary.substr(0, *binary_sizes[i])));
        binary.remove_prefix(*binary_sizes[i]);
      } else if (tensor->parameters().count("shared_memory_region") == 0) {
        // (Inputs in shared memory have no entry, as on gRPC.)
        request.add_raw_input_contents(
            ContentsToRaw(tensor->datatype(), tensor->contents()));
        tensor->clear_contents();
      }
    }
  }

  if (const json* outputs = Member(root, "outputs")) {
    if (!outputs->is_array()) return Invalid("outputs", "must be an array");
    for (size_t i = 0; i < outputs->size(); ++i) {
      const json& output = (*outputs)[i];
      const std::string field = absl::StrCat("outputs[", i, "]");
      if (!output.is_object()) return Invalid(field, "must be a JSON object");
      auto* requested = request.add_outputs();
      ASSIGN_OR_RETURN(
          *requested->mutable_name(),
          StringMember(output, "name", field + ".name", /*required=*/true));
      std::optional<bool> binary_data;
      if (const json* params = Member(output, "parameters")) {
        RETURN_IF_ERROR(ParametersFromJson(*params, field + ".parameters",
                                           requested->mutable_parameters()));
        const auto it = requested->parameters().find("binary_data");
        if (it != requested->parameters().end()) {
          if (it->second.parameter_choice_case() !=
              InferParameter::kBoolParam) {
            return Invalid(field + ".parameters[\"binary_data\"]",
                           "must be a boolean");
          }
          binary_data = it->second.bool_param();
        }
      }
      out.requested_outputs.emplace_back(requested->name(), binary_data);
    }
  }
  return out;
}

uint64_t EncodedInferResponse::size() const {
  uint64_t total = json.size();
  for (const std::string& part : binary) total += part.size();
  return total;
}

int64_t ExtraJsonBytes(const InferBody& body,
                       const inference::ModelInferResponse& response) {
  int64_t extra = 0;
  for (int i = 0; i < response.outputs_size(); ++i) {
    if (OutputIsBinary(body, response.outputs(i).name())) continue;
    if (i >= response.raw_output_contents_size()) continue;
    const std::optional<TensorType> type =
        ParseTensorType(response.outputs(i).datatype());
    const size_t size = type.has_value() ? TensorTypeSize(*type) : 0;
    if (size == 0) continue;
    // Characters per element at most: "-1.2345678e-38," (float32 and
    // float16) or "-1.2345678901234567e-300," (the rest).
    const int64_t chars =
        type == TensorType::kFp32 || type == TensorType::kFp16 || size == 1
            ? 16
            : 25;
    const int64_t elements =
        static_cast<int64_t>(response.raw_output_contents(i).size() / size);
    extra += elements * (chars - static_cast<int64_t>(size));
  }
  return extra;
}

absl::StatusOr<EncodedInferResponse> EncodeInferResponse(
    const InferBody& body, inference::ModelInferResponse* response) {
  EncodedInferResponse out;
  std::string& text = out.json;
  text.append("{\"model_name\":");
  text.append(Dump(response->model_name()));
  text.append(",\"model_version\":");
  text.append(Dump(response->model_version()));
  if (!response->id().empty()) {
    text.append(",\"id\":");
    text.append(Dump(response->id()));
  }
  if (!response->parameters().empty()) {
    json params = json::object();
    for (const auto& [key, value] : response->parameters()) {
      params[key] = ParameterToJson(value);
    }
    text.append(",\"parameters\":");
    text.append(Dump(params));
  }
  text.append(",\"outputs\":[");
  for (int i = 0; i < response->outputs_size(); ++i) {
    const auto& output = response->outputs(i);
    if (i >= response->raw_output_contents_size()) {
      return absl::InternalError(
          absl::StrCat("output \"", output.name(), "\" has no data"));
    }
    std::string& raw = *response->mutable_raw_output_contents(i);
    if (i > 0) text.push_back(',');
    text.append("{\"name\":");
    text.append(Dump(output.name()));
    text.append(",\"datatype\":");
    text.append(Dump(output.datatype()));
    text.append(",\"shape\":[");
    text.append(absl::StrJoin(output.shape(), ","));
    text.append("]");
    if (output.parameters().count("shared_memory_region") > 0) {
      // Written into a shared memory region: name, datatype and shape only,
      // as Triton answers (its C++ client reads any "parameters" of an
      // output as binary data).
      text.push_back('}');
    } else if (OutputIsBinary(body, output.name())) {
      absl::StrAppend(
          &text, ",\"parameters\":{\"binary_data_size\":", raw.size(), "}}");
      out.binary.push_back(std::move(raw));
    } else {
      text.append(",\"data\":");
      RETURN_IF_ERROR(
          AppendDataJson(output.name(), output.datatype(), raw, &text));
      text.push_back('}');
    }
  }
  text.append("]}");
  response->clear_raw_output_contents();
  return out;
}

}  // namespace temb::rest
