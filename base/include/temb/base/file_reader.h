// Reading a whole file, with one error convention for every caller (flags
// naming PEM files, token files, preset catalogues, timestep lists).
#ifndef TEMB_BASE_FILE_READER_H_
#define TEMB_BASE_FILE_READER_H_

#include <cstdint>
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

// The bytes of the regular file at `path` (a link to one is followed), at
// most `max_bytes` of them, for files that arrive with data a server does
// not control (a model folder).  Opened without blocking, so a FIFO or a
// device never holds the caller; anything but a regular file is
// INVALID_ARGUMENT ("<path>: not a regular file"), as is one larger than
// `max_bytes`, whatever its size claims while it is read.  Other failures
// as ReadFile's.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path,
                                            absl::string_view what,
                                            uint64_t max_bytes);

// Whether `text` (JSON, parsed or not) nests arrays and objects no deeper
// than `max_depth`: a scan of its brackets outside strings, in constant
// stack, that a recursive parser can be run after safely.  INVALID_ARGUMENT
// "<what>: JSON nested deeper than <max_depth> levels" otherwise.
absl::Status CheckJsonDepth(absl::string_view text, int max_depth,
                            absl::string_view what);

}  // namespace temb

#endif  // TEMB_BASE_FILE_READER_H_
