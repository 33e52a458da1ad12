// Reading a whole file, with one error convention for every caller (flags
// naming PEM files, token files, preset catalogues, timestep lists).
#ifndef TEMB_BASE_FILE_READER_H_
#define TEMB_BASE_FILE_READER_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace temb {

// The bytes of the file at `path`.  On failure the code follows errno as
// absl::ErrnoToStatus maps it (NOT_FOUND for a missing file,
// PERMISSION_DENIED, FAILED_PRECONDITION for a directory, ...), and the
// message reads `cannot read <what> "<path>": <reason>`, e.g.
// `cannot read --tls_cert file "/etc/x.pem": No such file or directory`.
absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     absl::string_view what);

}  // namespace temb

#endif  // TEMB_BASE_FILE_READER_H_
