#include "fuzz_service.h"

#include <utility>

#include "embedding_checks.h"
#include "temb/core/presets.h"
#include "temb/kernels/registry.h"
#include "temb/v1_convert/preset_catalog.h"

namespace temb::fuzz {

const EmbedService& FuzzService() {
  // Leaked on purpose: fuzzers exit without running static destructors.
  static const EmbedService* service = [] {
    BackendOptions backend_options;
    backend_options.cpu_threads = 2;
    auto backend = CreateBackend(BackendChoice::kCpu, backend_options);
    TEMB_FUZZ_CHECK(backend.ok(), backend.status().ToString());
    EmbedService::Options options;
    options.limits = FuzzLimits();
    return new EmbedService(*std::move(backend), BuiltInPresetCatalog(),
                            options);
  }();
  return *service;
}

}  // namespace temb::fuzz
