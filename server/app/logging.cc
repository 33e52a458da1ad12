#include "temb/app/logging.h"

#include <algorithm>
#include <atomic>
#include <iterator>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace temb {
namespace {

std::atomic<bool> json_format{false};

spdlog::level::level_enum ToSpdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return spdlog::level::trace;
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
  }
  return spdlog::level::info;
}

// A JSON string literal in which every byte is printable ASCII: control
// characters (CR, LF, ESC, ...), DEL and everything beyond ASCII (C1
// controls, line separators) become \uXXXX escapes, invalid UTF-8 becomes
// U+FFFD.  So no client-supplied string (request ids, preset names echoed
// in errors) can forge a log line or drive a terminal.
std::string JsonString(absl::string_view value) {
  return nlohmann::json(std::string(value))
      .dump(-1, ' ', /*ensure_ascii=*/true,
            nlohmann::json::error_handler_t::replace);
}

// Written bare in the text format: printable ASCII only, and none of the
// characters that delimit fields.
bool PlainText(absl::string_view value) {
  return !value.empty() && std::all_of(value.begin(), value.end(), [](char c) {
    return c > ' ' && c < 0x7f && c != '"' && c != '=' && c != '\\';
  });
}

}  // namespace

absl::Status ConfigureLogging(absl::string_view level,
                              absl::string_view format) {
  const std::pair<absl::string_view, spdlog::level::level_enum> levels[] = {
      {"trace", spdlog::level::trace},
      {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},
      {"warn", spdlog::level::warn},
      {"error", spdlog::level::err}};
  const auto* found =
      std::find_if(std::begin(levels), std::end(levels),
                   [&](const auto& entry) { return entry.first == level; });
  if (found == std::end(levels)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "log_level must be one of trace, debug, info, warn, error, got \"",
        level, "\""));
  }
  const spdlog::level::level_enum spd_level = found->second;
  if (format != "text" && format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("log_format must be text or json, got \"", format, "\""));
  }
  // Not registered globally, so configuring twice (tests) is harmless.
  auto logger = std::make_shared<spdlog::logger>(
      "temb", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_level(spd_level);
  json_format = format == "json";
  // Times are UTC with an explicit zone so lines from several pods sort.
  logger->set_pattern(
      json_format ? R"({"time":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l",%v})"
                  : "%Y-%m-%dT%H:%M:%S.%fZ %l %v",
      spdlog::pattern_time_type::utc);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(std::move(logger));
  return absl::OkStatus();
}

bool LogEnabled(LogLevel level) {
  return spdlog::default_logger_raw()->should_log(ToSpdlog(level));
}

LogField::LogField(absl::string_view key, absl::string_view value)
    : key_(key), json_(JsonString(value)) {
  text_ = PlainText(value) ? std::string(value) : json_;
}

LogField::LogField(absl::string_view key, int64_t value)
    : key_(key), text_(absl::StrCat(value)), json_(text_) {}

LogField::LogField(absl::string_view key, double value)
    : key_(key),
      text_(absl::StrCat(value)),
      json_(nlohmann::json(value).dump()) {}

LogField::LogField(absl::string_view key, bool value)
    : key_(key), text_(value ? "true" : "false"), json_(text_) {}

void LogEvent(LogLevel level, absl::string_view event,
              absl::Span<const LogField> fields) {
  const spdlog::level::level_enum spd_level = ToSpdlog(level);
  spdlog::logger* logger = spdlog::default_logger_raw();
  if (!logger->should_log(spd_level)) return;
  std::string line;
  if (json_format) {
    absl::StrAppend(&line, "\"event\":", JsonString(event));
    for (const LogField& field : fields) {
      absl::StrAppend(&line, ",", JsonString(field.key()), ":", field.json());
    }
  } else {
    absl::StrAppend(&line, "event=", event);
    for (const LogField& field : fields) {
      absl::StrAppend(&line, " ", field.key(), "=", field.text());
    }
  }
  logger->log(spd_level, "{}", line);
}

void RequestLogger::OnFinish(const RequestRecord& record) {
  if (!LogEnabled(LogLevel::kDebug)) return;
  const absl::Status& status = *record.status;
  std::vector<LogField> fields = {
      {"method", record.method},
      {"code", absl::StatusCodeToString(status.code())},
      {"latency_us", static_cast<int64_t>(record.latency_seconds * 1e6)},
      {"batch", record.batch}};
  if (status.ok()) fields.emplace_back("output_bytes", record.output_bytes);
  fields.emplace_back("request_id", record.request_id);
  if (!status.ok()) fields.emplace_back("error", status.message());
  LogEvent(LogLevel::kDebug, "request", fields);
}

void RequestLogger::OnBackendFailure(absl::string_view backend,
                                     const absl::Status& error,
                                     absl::string_view action) {
  LogEvent(
      LogLevel::kError, "backend_failed",
      {{"backend", backend}, {"error", error.ToString()}, {"action", action}});
}

void RequestLogger::OnServingChanged(absl::string_view state) {
  if (state == "serving") return;  // the "serving" event says it already
  LogEvent(LogLevel::kWarn, "serving_state", {{"state", state}});
}

}  // namespace temb
