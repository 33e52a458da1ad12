// TokenVerifier: bearer-token authentication, independent of the transport.
//
// The accepted tokens are kept only as SHA-256 digests, and a presented token
// is hashed and compared with every digest in constant time
// (CRYPTO_memcmp, no early exit over the list), so neither the position of
// the first differing byte nor the token's length leaks through timing.
#ifndef TEMB_CORE_TOKEN_AUTH_H_
#define TEMB_CORE_TOKEN_AUTH_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace temb {

class TokenVerifier {
 public:
  // One token per line; surrounding whitespace and empty lines are ignored,
  // so a file may list several tokens (e.g. the old and the new one during
  // a rotation).  ReadFile's code when the file cannot be read;
  // INVALID_ARGUMENT when it holds no token or a token with characters a
  // gRPC header cannot carry (anything but printable ASCII without spaces).
  static absl::StatusOr<TokenVerifier> FromFile(const std::string& path);
  // The same rules, for tokens already in memory.
  static absl::StatusOr<TokenVerifier> FromTokens(
      const std::vector<std::string>& tokens);

  // `authorization` is the value of the request's "authorization" header,
  // empty when there is none.  OK for "Bearer <an accepted token>" (the
  // scheme is case-insensitive); UNAUTHENTICATED otherwise, with a message
  // that never echoes the token.
  absl::Status Verify(absl::string_view authorization) const;

 private:
  using Digest = std::array<uint8_t, 32>;
  explicit TokenVerifier(std::vector<Digest> digests)
      : digests_(std::move(digests)) {}

  std::vector<Digest> digests_;
};

}  // namespace temb

#endif  // TEMB_CORE_TOKEN_AUTH_H_
