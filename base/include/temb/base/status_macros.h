// Status propagation macros.  Debian's Abseil (20220623) ships neither
// absl/log nor status macros, so temb defines the two it uses here, once.
#ifndef TEMB_BASE_STATUS_MACROS_H_
#define TEMB_BASE_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TEMB_STATUS_CONCAT_INNER_(a, b) a##b
#define TEMB_STATUS_CONCAT_(a, b) TEMB_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the caller if not OK.
#define RETURN_IF_ERROR(expr)                    \
  do {                                           \
    ::absl::Status temb_status_ = (expr);        \
    if (!temb_status_.ok()) return temb_status_; \
  } while (false)

// `ASSIGN_OR_RETURN(auto x, StatusOrExpr());` assigns the value or returns the
// error status from the caller.
#define ASSIGN_OR_RETURN(lhs, rexpr)                                         \
  ASSIGN_OR_RETURN_IMPL_(TEMB_STATUS_CONCAT_(temb_statusor_, __LINE__), lhs, \
                         rexpr)
#define ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                           \
  if (!statusor.ok()) return statusor.status();      \
  lhs = std::move(statusor).value()

#endif  // TEMB_BASE_STATUS_MACROS_H_
