#include "temb/kernels/backend.h"

namespace temb {

absl::string_view BackendKindName(BackendKind kind) {
  return kind == BackendKind::kCuda ? "cuda" : "cpu";
}

}  // namespace temb
