// The errno behind a status, kept where its code cannot tell it:
// absl::ErrnoToStatus maps passing shortages (EMFILE, ENFILE, ENOMEM) and a
// full disk (ENOSPC, EDQUOT) all to RESOURCE_EXHAUSTED, and a caller that
// must tell them apart (retry or fail) would otherwise read the strerror
// text at the end of the message, which any rewording loses.
//
//   return ErrnoStatus(errno, absl::StrCat("cannot open ", path));
//   ...
//   if (ErrnoOf(status) == EMFILE) ...  // try again later
//
// The errno travels as a payload (absl::Status::SetPayload): copying or
// moving the status keeps it, but a status made anew from another's code
// and message (absl::Status(code, new_message)) drops it: reword with
// WithMessage instead. ToString (and so operator<<) shows it after the
// message, as "[type.pipetrain/errno='24']"; message() is unchanged. Text
// for users (a CLI's error line, a job's failure reason) is
// StatusTextForUsers, which leaves every payload out.
// Thread-safe (no shared state).
#ifndef PIPETRAIN_COMMON_ERRNO_STATUS_H_
#define PIPETRAIN_COMMON_ERRNO_STATUS_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

// The payload's type URL; its value is the errno in decimal.
inline constexpr char kErrnoPayloadUrl[] = "type.pipetrain/errno";

// absl::ErrnoToStatus(error_number, message), the same code and message
// ("<message>: <strerror>"), carrying `error_number` for ErrnoOf. An
// error_number of 0 gives OK (which holds no message or payload).
absl::Status ErrnoStatus(int error_number, absl::string_view message);

// The errno that ErrnoStatus attached to `status`; nullopt when there is
// none (OK, a status made otherwise, or one rewrapped without its payloads)
// or the payload is not a number.
std::optional<int> ErrnoOf(const absl::Status& status);

// `status` with `message` instead of its own: the same code and every
// payload (the errno among them). An OK `status` gives OK.
absl::Status WithMessage(const absl::Status& status, absl::string_view message);

// `status` as a person reads it (a CLI's error line, a job's failure
// reason): "CODE: message" as ToString gives it, without payloads, which
// are for code (the errno: ErrnoOf), not people. "OK" for OK.
std::string StatusTextForUsers(const absl::Status& status);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_ERRNO_STATUS_H_
