// Error feedback for lossy codecs on one link and direction: Optimus-CC's
// lazy error propagation (§5.1). The compression error of micro-batch i is
// kept and added to the tensor of micro-batch i+1 before it is compressed,
// so the sum over micro-batches of what the receiver gets tracks the sum of
// what the sender meant to send.
//
//   Compress(x):  y = x + residual;  payload = codec.Encode(y);
//                 residual = y - codec.Decode(payload);  return payload.
//
// Telescoping: after K calls, sum(decoded_k) + residual == sum(x_k) (up to
// fp32 rounding of the additions).
//
// End-of-iteration rule: residuals must never cross an optimizer step (the
// paper's argument holds because all micro-batches of one iteration use the
// same weights and their gradients are summed). At the last micro-batch of an
// iteration the caller calls Flush() and adds the returned residual into that
// micro-batch's tensor, which it sends without this ErrorFeedback's
// compression (uncompressed, or compressed with the loss accepted); either way
// no residual survives into the next iteration. Flush() also resets the
// object, so a plan change or an aborted iteration starts clean by calling it.
//
// Thread-safety: not thread-safe; one instance per link and direction, used
// by the thread that sends on it.
#ifndef PIPETRAIN_KERNELS_COMPRESS_ERROR_FEEDBACK_H_
#define PIPETRAIN_KERNELS_COMPRESS_ERROR_FEEDBACK_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "kernels/compress/codec.h"

namespace pipetrain {

class ErrorFeedback {
 public:
  ErrorFeedback() = default;

  // Adds the stored residual to `x` (not modified), encodes with `codec`
  // (passing `state` on), decodes, stores the new residual and returns the
  // payload. INVALID_ARGUMENT when x's shape differs from the stored
  // residual's (call Flush() between tensors of different shapes), and any
  // error of the codec (INTERNAL if it decodes a shape other than x's, a
  // codec bug); on error the stored residual is unchanged. When
  // `relative_error` is non-null it receives ||y - decoded|| / ||y|| for
  // y = x + residual (0 when y is all zeros): the decode is done anyway.
  absl::StatusOr<std::string> Compress(const Tensor& x, const Codec& codec, CodecState* state,
                                       double* relative_error = nullptr);

  // Returns the residual (a null Tensor when there is none) and clears it.
  Tensor Flush();

  bool has_residual() const { return !residual_.is_null(); }

 private:
  Tensor residual_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_COMPRESS_ERROR_FEEDBACK_H_
