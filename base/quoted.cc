#include "temb/base/quoted.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace temb {

std::string Quoted(absl::string_view text) {
  if (text.size() <= kQuotedMaxBytes) {
    return absl::StrCat("\"", absl::CHexEscape(text), "\"");
  }
  return absl::StrCat("\"", absl::CHexEscape(text.substr(0, kQuotedMaxBytes)),
                      "...\" (", text.size(), " bytes)");
}

}  // namespace temb
