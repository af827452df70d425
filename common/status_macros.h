// Status propagation macros. Debian's Abseil (20220623) has no
// RETURN_IF_ERROR / ASSIGN_OR_RETURN, so the project carries these two.
//
//   RETURN_IF_ERROR(WriteFile(path));
//   ASSIGN_OR_RETURN(Tensor t, LoadTensor(path));
//
// Both evaluate their expression exactly once. ASSIGN_OR_RETURN expands to
// several statements: put it in braces under an `if` or a `case`.
#ifndef PIPETRAIN_COMMON_STATUS_MACROS_H_
#define PIPETRAIN_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PT_STATUS_CONCAT_INNER_(a, b) a##b
#define PT_STATUS_CONCAT_(a, b) PT_STATUS_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                                   \
  do {                                                          \
    ::absl::Status pt_status_ = (expr);                         \
    if (!pt_status_.ok()) return pt_status_;                    \
  } while (0)

#define PT_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                              \
  if (!statusor.ok()) return statusor.status();        \
  lhs = std::move(statusor).value()

#define ASSIGN_OR_RETURN(lhs, expr) \
  PT_ASSIGN_OR_RETURN_IMPL_(PT_STATUS_CONCAT_(pt_statusor_, __LINE__), lhs, expr)

#endif  // PIPETRAIN_COMMON_STATUS_MACROS_H_
