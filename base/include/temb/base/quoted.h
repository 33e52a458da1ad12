// Client-supplied text inside error messages.
//
// A status message travels back in a gRPC trailer, and clients refuse
// trailers past their metadata limit (8 KiB by default): echoing a 12 KB
// preset name would turn a clear NOT_FOUND into a client-side
// RESOURCE_EXHAUSTED.  Control bytes would also reach logs and terminals.
#ifndef TEMB_BASE_QUOTED_H_
#define TEMB_BASE_QUOTED_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace temb {

inline constexpr size_t kQuotedMaxBytes = 64;

// `text` in double quotes, C-escaped (\n, \x1b, \", ...), its first
// kQuotedMaxBytes bytes only, then "... (N bytes)" when it was longer.
std::string Quoted(absl::string_view text);

}  // namespace temb

#endif  // TEMB_BASE_QUOTED_H_
