// The temb release version, from the CMake project version.
#ifndef TEMB_CORE_VERSION_H_
#define TEMB_CORE_VERSION_H_

#include "absl/strings/string_view.h"

namespace temb {

// e.g. "0.1.0".
absl::string_view Version();

}  // namespace temb

#endif  // TEMB_CORE_VERSION_H_
