#include "temb/core/timesteps.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace temb {

absl::StatusOr<std::vector<int64_t>> EmbeddingShape(
    absl::Span<const int64_t> timesteps_shape, int64_t count, int dim,
    absl::string_view field) {
  if (timesteps_shape.empty()) return std::vector<int64_t>{count, dim};
  const std::string shape =
      absl::StrCat("[", absl::StrJoin(timesteps_shape, ", "), "]");
  if (timesteps_shape.size() > kMaxTimestepsRank) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must have rank 1 to ", kMaxTimestepsRank,
                     ", got rank ", timesteps_shape.size(), " ", shape));
  }
  int64_t product = 1;
  for (const int64_t extent : timesteps_shape) {
    if (extent < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " must not have negative dimensions, got ", shape));
    }
    // Saturate: a product beyond count is wrong however large it is.
    product = (extent != 0 && product > count / extent + 1) ? count + 1
                                                            : product * extent;
  }
  if (product != count) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", shape,
                     " does not match the number of timesteps (", count, ")"));
  }
  std::vector<int64_t> out(timesteps_shape.begin(), timesteps_shape.end());
  out.push_back(dim);
  return out;
}

}  // namespace temb
