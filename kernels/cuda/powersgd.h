// PowerSGD on the GPU, the CUDA twin of kernels/compress/powersgd_codec.h
// (read it for the algorithm): one power iteration with a warm-started Q,
//   Q0 = q_warm with its all-zero columns replaced by the fixed Philox
//        columns (or the Philox matrix alone when there is no warm start),
//   P  = M Q0                       cuBLAS
//   P <- orthonormalised P          modified Gram-Schmidt, each column
//                                   projected twice, dot products and norms
//                                   in double, dependent columns (norm after
//                                   <= 1e-5 * norm before, or zero) set to 0
//   Q  = M^T P                      cuBLAS
// and the decode M^ = P Q^T. M is [rows, cols] row-major (the CPU codec's
// matrix view of a tensor: rows = all but the last dimension), P [rows, r],
// Q [cols, r], all device pointers.
//
// Parity with the CPU codec: same start Q (same Philox seed and stream),
// same orthogonalisation; only the summation order differs (cuBLAS GEMMs,
// block reductions of the dot products), so P, Q and M^ agree within
// rounding, not bitwise. With a CublasHandle in GemmMode::kFp32 the tests
// bound it (powersgd_test.cc); kTf32 runs but is not held to those bounds.
//
// Orthogonalisation runs in ONE thread block (the columns are sequential
// and each needs a full-column reduction): O(rows * r^2) work on 1024
// threads, fine for activations and gradients up to ~10^6 rows at small r.
// Reductions have a fixed order: results are bitwise deterministic run to
// run on one GPU model (cuBLAS is, for a handle used from one stream).
//
// Memory: the encode's Q0 (cols * r floats) comes from the stream's scratch
// cache (stream_scratch.h), as do the finiteness check's few bytes.
// Synchronisation: PowerSgdEncodeCuda waits for the handle's stream (it
// checks M for non-finite values first); the others only queue work.
// Thread-safety: a CublasHandle is used from one thread at a time.
#ifndef PIPETRAIN_KERNELS_CUDA_POWERSGD_H_
#define PIPETRAIN_KERNELS_CUDA_POWERSGD_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/linear.h"

namespace pipetrain {

// One power iteration. q_warm: the previous call's Q on this link
// ([cols, r]) or null for a cold start; q may alias q_warm (the caller keeps
// q as its next warm start; the CPU codec does not update its state when
// rows or cols is 0, and neither should the caller), but a refused call (a
// Q that overflows) has then overwritten the warm start: a caller that
// goes on after a refusal writes q beside it (the backend does). rows == 0
// or cols == 0 zero-fills p, and q unless q is q_warm (a warm start stays
// as it was).
// Errors: INVALID_ARGUMENT for rank outside 1..65536, rows or cols negative
// or >= 2^31, a null pointer where data is needed, or a non-finite element
// of M ("powersgd: element i is nan; only finite values can be encoded",
// the CPU's message); FAILED_PRECONDITION for an empty handle; INTERNAL for
// CUDA or cuBLAS failures.
absl::Status PowerSgdEncodeCuda(const CublasHandle& handle, const float* m, int64_t rows,
                                int64_t cols, int rank, const float* q_warm, float* p, float* q);

// out [rows, cols] = P Q^T. Errors as PowerSgdEncodeCuda (no finiteness
// check: the factors come from an encode or a checked payload).
absl::Status PowerSgdDecodeCuda(const CublasHandle& handle, const float* p, const float* q,
                                int64_t rows, int64_t cols, int rank, float* out);

// --- Building blocks (used by the encode; exposed for tests) ---

// Orthonormalises the r columns of p [rows, r] in place, as described above.
// Requires rows >= 1, 1 <= r. INVALID_ARGUMENT for bad sizes; INTERNAL if
// the launch fails.
absl::Status PowerSgdOrthonormaliseCuda(float* p, int64_t rows, int rank,
                                        cudaStream_t stream = nullptr);

// q0 [cols, r] = q_warm's columns, each all-zero one replaced by the same
// column of `fresh` [cols, r]. Requires cols >= 1, rank >= 1; q0 must not
// overlap the inputs. Errors as PowerSgdOrthonormaliseCuda.
absl::Status PowerSgdStartQCuda(const float* q_warm, const float* fresh, int64_t cols, int rank,
                                float* q0, cudaStream_t stream = nullptr);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_POWERSGD_H_
