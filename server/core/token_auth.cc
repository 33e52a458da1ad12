#include "temb/core/token_auth.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "openssl/crypto.h"
#include "openssl/sha.h"
#include "temb/base/file_reader.h"

namespace temb {
namespace {

constexpr absl::string_view kScheme = "bearer";

std::array<uint8_t, 32> Sha256(absl::string_view text) {
  std::array<uint8_t, 32> digest;
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(),
         digest.data());
  return digest;
}

bool HeaderSafe(absl::string_view token) {
  for (char c : token) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<TokenVerifier> TokenVerifier::FromTokens(
    const std::vector<std::string>& tokens) {
  std::vector<Digest> digests;
  for (const std::string& line : tokens) {
    const absl::string_view token = absl::StripAsciiWhitespace(line);
    if (token.empty()) continue;
    if (!HeaderSafe(token)) {
      return absl::InvalidArgumentError(
          "auth tokens must be printable ASCII without spaces");
    }
    digests.push_back(Sha256(token));
  }
  if (digests.empty()) {
    return absl::InvalidArgumentError(
        "no auth token given (the file is empty)");
  }
  return TokenVerifier(std::move(digests));
}

absl::StatusOr<TokenVerifier> TokenVerifier::FromFile(const std::string& path) {
  absl::StatusOr<std::string> contents = ReadFile(path, "auth token file");
  if (!contents.ok()) return contents.status();
  absl::StatusOr<TokenVerifier> verifier =
      FromTokens(absl::StrSplit(*contents, absl::ByAnyChar("\r\n")));
  if (!verifier.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "auth token file \"", path, "\": ", verifier.status().message()));
  }
  return verifier;
}

absl::Status TokenVerifier::Verify(absl::string_view authorization) const {
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "missing credentials: send \"authorization: Bearer <token>\"");
  }
  absl::string_view token = absl::StripAsciiWhitespace(authorization);
  if (token.size() <= kScheme.size() ||
      !absl::StartsWithIgnoreCase(token, kScheme) ||
      token[kScheme.size()] != ' ') {
    return absl::UnauthenticatedError(
        "the authorization header must be \"Bearer <token>\"");
  }
  token = absl::StripLeadingAsciiWhitespace(token.substr(kScheme.size()));
  const Digest presented = Sha256(token);
  // Every digest is compared, whatever matched before.
  int matched = 0;
  for (const Digest& digest : digests_) {
    matched |=
        CRYPTO_memcmp(digest.data(), presented.data(), digest.size()) == 0;
  }
  if (matched == 0) return absl::UnauthenticatedError("invalid bearer token");
  return absl::OkStatus();
}

}  // namespace temb
