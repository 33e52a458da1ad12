// Fuzzes the KServe REST frontend without sockets: bytes -> an HTTP request
// ("METHOD PATH" on the first line, the Inference-Header-Content-Length
// value on the second, the body after) -> RestHandler::Handle, which runs
// Accept on the header and then routing, the infer body parser under its
// admission budget, the KServe inference path and the response encoding.
//
// Every answer must carry a status the handler documents, an error body
// that is {"error": "..."}, and once the response is gone every byte the
// request held in admission must be released.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "embedding_checks.h"
#include "fuzz_service.h"
#include "nlohmann/json.hpp"
#include "temb/core/admission.h"
#include "temb/rest/rest_handler.h"

namespace temb::fuzz {
namespace {

// Small, so that the budget is reached by inputs the fuzzer can build.
constexpr int64_t kQueuedBytes = int64_t{4} << 20;

AdmissionController& Admission() {
  static AdmissionController* admission = [] {
    AdmissionLimits limits;
    limits.max_queued_bytes = kQueuedBytes;
    return new AdmissionController(limits);
  }();
  return *admission;
}

const rest::RestHandler& Handler() {
  static const rest::RestHandler* handler = new rest::RestHandler(
      FuzzService(), &Admission(), nullptr, nullptr, nullptr);
  return *handler;
}

void Run(absl::string_view data) {
  const std::vector<absl::string_view> lines =
      absl::StrSplit(data, absl::MaxSplits('\n', 2));
  rest::HttpRequest request;
  const std::vector<absl::string_view> first =
      absl::StrSplit(lines[0], absl::MaxSplits(' ', 1));
  request.method = std::string(first[0]);
  request.path = first.size() > 1 ? std::string(first[1]) : "/";
  if (lines.size() > 1) request.header_length = std::string(lines[1]);
  if (lines.size() > 2) request.body = std::string(lines[2]);
  {
    rest::HttpResponse response;
    Handler().Handle(request, &response);
    static const std::set<int> kStatuses = {200, 400, 401, 403, 404, 405, 409,
                                            413, 429, 500, 501, 503, 504};
    TEMB_FUZZ_CHECK(kStatuses.count(response.status) > 0,
                    absl::StrCat("unexpected HTTP status ", response.status));
    TEMB_FUZZ_CHECK(
        response.status != 500,
        absl::StrCat("internal error: ",
                     response.body.empty() ? "" : response.body[0]));
    if (response.status >= 400 && !response.body.empty()) {
      const nlohmann::json error =
          nlohmann::json::parse(response.body[0], nullptr, false);
      TEMB_FUZZ_CHECK(error.is_object() && error.size() == 1 &&
                          error.contains("error") && error["error"].is_string(),
                      absl::StrCat("error body is not {\"error\": ...}: ",
                                   response.body[0]));
    }
    TEMB_FUZZ_CHECK(Admission().held_bytes() <= kQueuedBytes,
                    "admission holds more than its limit");
  }
  TEMB_FUZZ_CHECK(Admission().held_bytes() == 0 && Admission().inflight() == 0,
                  absl::StrCat("a finished request still holds ",
                               Admission().held_bytes(), " bytes"));
}

}  // namespace
}  // namespace temb::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  temb::fuzz::Run(absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
