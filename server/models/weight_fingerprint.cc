#include "temb/models/weight_fingerprint.h"

#include <openssl/evp.h>

#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "temb/models/safetensors.h"

namespace temb::models {

std::string WeightFingerprint(DType dtype, absl::Span<const uint8_t> bytes) {
  const std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> context(
      EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  EVP_DigestInit_ex(context.get(), EVP_sha256(), nullptr);
  const int64_t size = static_cast<int64_t>(bytes.size());
  const std::string head =
      absl::StrCat(SafetensorsDTypeName(dtype), "\n", size, "\n");
  EVP_DigestUpdate(context.get(), head.data(), head.size());
  if (size <= kFingerprintWholeBytes) {
    EVP_DigestUpdate(context.get(), bytes.data(), bytes.size());
  } else {
    for (int64_t i = 0; i < kFingerprintWindows; ++i) {
      const int64_t offset =
          i * (size - kFingerprintWindowBytes) / (kFingerprintWindows - 1);
      EVP_DigestUpdate(context.get(), bytes.data() + offset,
                       kFingerprintWindowBytes);
    }
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(context.get(), digest, &length);
  // 16 hex digits: enough to tell two checkpoints apart.
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), 8));
}

}  // namespace temb::models
