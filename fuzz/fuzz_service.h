// The service core both request fuzzers drive: the built-in presets, the CPU
// backend and the small fuzzing limits, built once per process.
#ifndef TEMB_FUZZ_FUZZ_SERVICE_H_
#define TEMB_FUZZ_FUZZ_SERVICE_H_

#include "temb/core/embed_service.h"

namespace temb::fuzz {

const EmbedService& FuzzService();

}  // namespace temb::fuzz

#endif  // TEMB_FUZZ_FUZZ_SERVICE_H_
