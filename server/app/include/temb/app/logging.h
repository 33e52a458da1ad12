// Structured logging for temb-server: one line per event, either
// `time level event=NAME key=value ...` or a JSON object per line, on stderr.
#ifndef TEMB_APP_LOGGING_H_
#define TEMB_APP_LOGGING_H_

#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "temb/core/request_observer.h"

namespace temb {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError };

// `level`: trace|debug|info|warn|error; `format`: text|json.
// INVALID_ARGUMENT naming the flag otherwise.  Call before any thread logs.
absl::Status ConfigureLogging(absl::string_view level,
                              absl::string_view format);

bool LogEnabled(LogLevel level);

// One key and its value, rendered for both formats at construction.
class LogField {
 public:
  LogField(absl::string_view key, absl::string_view value);
  LogField(absl::string_view key, const std::string& value)
      : LogField(key, absl::string_view(value)) {}
  LogField(absl::string_view key, const char* value)
      : LogField(key, absl::string_view(value)) {}
  LogField(absl::string_view key, int64_t value);
  LogField(absl::string_view key, int value)
      : LogField(key, static_cast<int64_t>(value)) {}
  LogField(absl::string_view key, double value);
  LogField(absl::string_view key, bool value);

  const std::string& key() const { return key_; }
  const std::string& text() const { return text_; }
  const std::string& json() const { return json_; }

 private:
  std::string key_;
  std::string text_;  // bare when printable ASCII without spaces, quotes,
                      // "=" or "\\"; else the escaped JSON string
  std::string json_;  // a JSON value
};

void LogEvent(LogLevel level, absl::string_view event,
              absl::Span<const LogField> fields = {});

// Logs every finished request at debug level (method, code, latency, batch,
// bytes, request id, and the error message on failure).
// Also logs backend failures (error) and serving-state changes (warn).
class RequestLogger final : public RequestObserver {
 public:
  void OnStart(absl::string_view /*method*/) override {}
  void OnFinish(const RequestRecord& record) override;
  void OnBackendFailure(absl::string_view backend, const absl::Status& error,
                        absl::string_view action) override;
  void OnServingChanged(absl::string_view state) override;
};

}  // namespace temb

#endif  // TEMB_APP_LOGGING_H_
