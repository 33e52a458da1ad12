// Invariants every fuzz target asserts about what the service returns.
//
// A violation prints what was wrong and aborts, which libFuzzer reports as a
// crash and saves the input that caused it.
#ifndef TEMB_FUZZ_EMBEDDING_CHECKS_H_
#define TEMB_FUZZ_EMBEDDING_CHECKS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "temb/kernels/embedding_spec.h"

namespace temb::fuzz {

// Limits small enough that one input computes in well under a millisecond,
// yet reachable from a few KiB of input, so the limit checks get exercised.
Limits FuzzLimits();

// Prints `what` and aborts.
[[noreturn]] void Fail(absl::string_view what);

// Fails with `message` (evaluated only then) when `condition` is false.
#define TEMB_FUZZ_CHECK(condition, message)        \
  do {                                             \
    if (!(condition)) ::temb::fuzz::Fail(message); \
  } while (false)

// A rejected request must carry one of the documented client-error codes
// (INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED) and a message: anything
// else would reach the caller as a server fault.
void CheckRejection(const absl::Status& status);

// `bytes` is the embedding of `timesteps` under a valid `spec`:
//   * exactly OutputBytes(spec, timesteps.size()) bytes;
//   * every element finite (never NaN or Inf);
//   * repeat_only: every column equals t in the output dtype;
//   * otherwise every element in [-1, 1], sin^2 + cos^2 == 1 for every
//     frequency within the dtype's rounding, t == 0 gives exactly cos = 1 and
//     sin = 0, and an odd dim ends in an exact 0 column.
void CheckEmbedding(const EmbeddingSpec& spec,
                    absl::Span<const float> timesteps, absl::string_view bytes);

}  // namespace temb::fuzz

#endif  // TEMB_FUZZ_EMBEDDING_CHECKS_H_
