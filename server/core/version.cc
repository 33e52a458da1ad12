#include "temb/core/version.h"

namespace temb {

absl::string_view Version() { return TEMB_VERSION; }

}  // namespace temb
