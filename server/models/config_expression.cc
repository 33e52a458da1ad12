#include "config_expression.h"

#include <algorithm>
#include <cctype>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "temb/base/quoted.h"
#include "temb/base/status_macros.h"

namespace temb::models {

absl::StatusOr<bool> ConditionHolds(const FamilyDescription& family,
                                    const ModelConfig& config,
                                    const std::string& when) {
  if (when.empty()) return true;
  const bool negate = when[0] == '!';
  const std::string flag = negate ? when.substr(1) : when;
  if (const size_t equals = flag.find('='); equals != std::string::npos) {
    return config.Equals(flag.substr(0, equals), flag.substr(equals + 1)) !=
           negate;
  }
  ASSIGN_OR_RETURN(const std::optional<bool> value, config.Flag(flag));
  bool holds = value.value_or(false);
  if (!value.has_value()) {
    for (const FlagDefault& rule : family.flag_defaults) {
      if (rule.flag != flag) continue;
      ASSIGN_OR_RETURN(const int64_t field, config.PositiveInt(rule.field));
      holds = field == rule.equals;
    }
  }
  return holds != negate;
}

// The blocks a stacked linear covers, in increasing index.
absl::StatusOr<std::vector<int64_t>> SelectBlocks(const ModelConfig& config,
                                                  const Op& op, int64_t count) {
  std::vector<int64_t> indices;
  std::vector<int64_t> listed;
  if (op.select == BlockSelect::kListed ||
      op.select == BlockSelect::kUnlisted) {
    ASSIGN_OR_RETURN(listed, config.IndexList(op.block_list, count));
  }
  for (int64_t block = 0; block < count; ++block) {
    const bool in_list =
        std::find(listed.begin(), listed.end(), block) != listed.end();
    bool take = true;
    switch (op.select) {
      case BlockSelect::kAll:
        break;
      case BlockSelect::kAllButLast:
        take = block < count - 1;
        break;
      case BlockSelect::kLast:
        take = block == count - 1;
        break;
      case BlockSelect::kListed:
        take = in_list;
        break;
      case BlockSelect::kUnlisted:
        take = !in_list;
        break;
    }
    if (take) indices.push_back(block);
  }
  return indices;
}

namespace {

// The value of a config expression (family.h): terms of field names, list
// entries and integer literals, joined by + - *.  A malformed expression is
// a bug in the family's description; a bad field names the config.
class ConfigExpression {
 public:
  ConfigExpression(const ModelConfig& config, const std::string& text)
      : config_(config), text_(text) {}

  absl::StatusOr<int64_t> Evaluate() {
    ASSIGN_OR_RETURN(const int64_t value, Sum());
    if (Skip(), pos_ < text_.size()) return Malformed();
    if (value < 1 || value > (int64_t{1} << 31)) return OutOfRange(value);
    return value;
  }

 private:
  // Terms joined by + and -, up to the end, a ',' or a ')'.
  absl::StatusOr<int64_t> Sum() {
    ASSIGN_OR_RETURN(int64_t value, Term());
    while (Skip(),
           pos_ < text_.size() && text_[pos_] != ',' && text_[pos_] != ')') {
      const char op = text_[pos_];
      if (op != '+' && op != '-') return Malformed();
      ++pos_;
      ASSIGN_OR_RETURN(const int64_t term, Term());
      value = op == '+' ? value + term : value - term;
    }
    return value;
  }

  // min(a, b): Lumina-Image-2.0's min(hidden_size, 1024) wide embedding.
  absl::StatusOr<int64_t> Min() {
    ASSIGN_OR_RETURN(const int64_t a, Sum());
    if (Skip(), pos_ >= text_.size() || text_[pos_] != ',') return Malformed();
    ++pos_;
    ASSIGN_OR_RETURN(const int64_t b, Sum());
    if (Skip(), pos_ >= text_.size() || text_[pos_] != ')') return Malformed();
    ++pos_;
    for (const int64_t value : {a, b}) {
      if (value < 1 || value > (int64_t{1} << 31)) return OutOfRange(value);
    }
    return std::min(a, b);
  }

  void Skip() {
    while (pos_ < text_.size() && text_[pos_] == ' ') ++pos_;
  }

  absl::Status OutOfRange(int64_t value) const {
    return absl::InvalidArgumentError(
        absl::StrCat(config_.file(), ": config expression ", text_, " is ",
                     value, ", must be in [1, 2^31]"));
  }

  absl::Status Malformed() const {
    return absl::InternalError(
        absl::StrCat("malformed config expression ", Quoted(text_)));
  }

  absl::StatusOr<int64_t> Term() {
    ASSIGN_OR_RETURN(int64_t value, Factor());
    while (Skip(), pos_ < text_.size() && text_[pos_] == '*') {
      ++pos_;
      ASSIGN_OR_RETURN(const int64_t factor, Factor());
      value *= factor;  // each factor is at most 2^31: no overflow here
      if (value > (int64_t{1} << 31)) return OutOfRange(value);
    }
    return value;
  }

  // A literal below 2^20, or a field with an optional [index] (negative:
  // from the end).
  absl::StatusOr<int64_t> Factor() {
    Skip();
    const size_t start = pos_;
    if (pos_ < text_.size() &&
        std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      int64_t literal = 0;
      while (pos_ < text_.size() &&
             std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
        literal = literal * 10 + (text_[pos_++] - '0');
        if (literal >= (1 << 20)) return Malformed();
      }
      return literal;
    }
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) ||
            text_[pos_] == '_')) {
      ++pos_;
    }
    if (pos_ == start) return Malformed();
    const std::string field = text_.substr(start, pos_ - start);
    if (field == "min" && pos_ < text_.size() && text_[pos_] == '(') {
      ++pos_;
      return Min();
    }
    if (pos_ >= text_.size() || text_[pos_] != '[') {
      return config_.PositiveInt(field);
    }
    ++pos_;
    const bool negative = pos_ < text_.size() && text_[pos_] == '-';
    if (negative) ++pos_;
    int64_t index = 0;
    const size_t digits = pos_;
    while (pos_ < text_.size() &&
           std::isdigit(static_cast<unsigned char>(text_[pos_])) &&
           index < (1 << 20)) {
      index = index * 10 + (text_[pos_++] - '0');
    }
    if (pos_ == digits || pos_ >= text_.size() || text_[pos_] != ']') {
      return Malformed();
    }
    ++pos_;
    return config_.PositiveIntAt(field, negative ? -index : index);
  }

  const ModelConfig& config_;
  const std::string& text_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<int64_t> EvaluateConfig(const ModelConfig& config,
                                       const std::string& text) {
  return ConfigExpression(config, text).Evaluate();
}

}  // namespace temb::models
