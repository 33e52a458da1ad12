#include "fuzz/fuzz_service.h"

#include <utility>

#include "fuzz/embedding_checks.h"
#include "server/core/presets.h"
#include "temb/kernels/registry.h"

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
    return new EmbedService(*std::move(backend), PresetCatalog::BuiltIn(),
                            options);
  }();
  return *service;
}

}  // namespace temb::fuzz
