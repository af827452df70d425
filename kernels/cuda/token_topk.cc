// Host side of token_topk.h: the keep -> kept count, through the CPU codec's
// own TopKCount so that the rounding can never drift apart.
#include "kernels/cuda/token_topk.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/compress/elem_topk_codec.h"

namespace pipetrain {

absl::StatusOr<int64_t> TokenTopKKeptCount(double keep, int64_t tokens) {
  if (!(keep > 0.0 && keep <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("token_topk: keep ", keep, " is out of range (0, 1]"));
  }
  if (tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("token_topk: token count ", tokens, " is negative"));
  }
  return TopKCount(keep, tokens);
}

absl::StatusOr<int64_t> TokenTopKMaskCuda(const float* scores, int64_t tokens, double keep,
                                          uint8_t* mask, int64_t* kept_index,
                                          cudaStream_t stream) {
  ASSIGN_OR_RETURN(const int64_t kept, TokenTopKKeptCount(keep, tokens));
  RETURN_IF_ERROR(TokenTopKSelectCuda(scores, tokens, kept, mask, kept_index, stream));
  return kept;
}

}  // namespace pipetrain
