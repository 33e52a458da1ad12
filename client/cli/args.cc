#include "temb/cli/args.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace temb::cli {
namespace {

bool ParseBoolValue(const std::string& text, bool* value) {
  if (text == "true" || text == "1" || text == "yes") {
    *value = true;
    return true;
  }
  if (text == "false" || text == "0" || text == "no") {
    *value = false;
    return true;
  }
  return false;
}

bool ValueParses(FlagType type, const std::string& text) {
  switch (type) {
    case FlagType::kString:
    case FlagType::kStrings:
      return true;
    case FlagType::kInt: {
      int64_t v;
      return absl::SimpleAtoi(text, &v);
    }
    case FlagType::kDouble: {
      double v;
      return absl::SimpleAtod(text, &v);
    }
    case FlagType::kBool: {
      bool v;
      return ParseBoolValue(text, &v);
    }
    case FlagType::kDuration: {
      absl::Duration v;
      return absl::ParseDuration(text, &v);
    }
  }
  return false;
}

const FlagSpec* FindSpec(const std::vector<FlagSpec>& specs,
                         const std::string& name) {
  auto it = std::find_if(specs.begin(), specs.end(),
                         [&](const FlagSpec& s) { return s.name == name; });
  return it == specs.end() ? nullptr : &*it;
}

}  // namespace

absl::StatusOr<Args> Args::Parse(const std::vector<FlagSpec>& specs,
                                 const std::vector<std::string>& argv) {
  Args args;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (!absl::StartsWith(arg, "-") || arg == "-" || arg == "--") {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string body = arg.substr(absl::StartsWith(arg, "--") ? 2 : 1);
    std::string name = body;
    std::optional<std::string> value;
    if (size_t eq = body.find('='); eq != std::string::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
    }
    const FlagSpec* spec = FindSpec(specs, name);
    if (spec == nullptr && !value && absl::StartsWith(name, "no")) {
      const FlagSpec* negated = FindSpec(specs, name.substr(2));
      if (negated != nullptr && negated->type == FlagType::kBool) {
        args.values_[negated->name] = "false";
        continue;
      }
    }
    if (spec == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (!value) {
      if (spec->type == FlagType::kBool) {
        value = "true";
      } else if (i + 1 < argv.size()) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", name, " needs a value"));
      }
    }
    if (!ValueParses(spec->type, *value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid value '", *value, "' for flag --", name));
    }
    args.values_[name] = *value;
    if (spec->type == FlagType::kStrings) args.lists_[name].push_back(*value);
  }
  return args;
}

std::optional<std::string> Args::String(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::optional<int64_t> Args::Int(const std::string& name) const {
  auto text = String(name);
  int64_t v = 0;
  if (!text || !absl::SimpleAtoi(*text, &v)) return std::nullopt;
  return v;
}

std::optional<double> Args::Double(const std::string& name) const {
  auto text = String(name);
  double v = 0;
  if (!text || !absl::SimpleAtod(*text, &v)) return std::nullopt;
  return v;
}

std::optional<bool> Args::Bool(const std::string& name) const {
  auto text = String(name);
  bool v = false;
  if (!text || !ParseBoolValue(*text, &v)) return std::nullopt;
  return v;
}

std::optional<absl::Duration> Args::Duration(const std::string& name) const {
  auto text = String(name);
  absl::Duration v;
  if (!text || !absl::ParseDuration(*text, &v)) return std::nullopt;
  return v;
}

std::vector<std::string> Args::Strings(const std::string& name) const {
  auto it = lists_.find(name);
  return it == lists_.end() ? std::vector<std::string>() : it->second;
}

std::string FlagHelp(const std::vector<FlagSpec>& specs) {
  std::string out;
  for (const FlagSpec& spec : specs) {
    absl::StrAppendFormat(&out, "  --%-22s %s\n", spec.name, spec.help);
  }
  return out;
}

}  // namespace temb::cli
