// The tied LM head's three products on the GPU, over a vocabulary padded
// to the logits' row stride (Backend::LogitsRowStride):
//   forward   logits[n, :vocab] = x[n, d] wte[vocab, d]^T
//   backward  dx[n, d]          = dlogits[n, :vocab] wte
//             dwte[vocab, d]   += dlogits[n, :vocab]^T x
// The twins of what HeadUnit computes with three Sgemm calls on the CPU.
//
// Why padded: with the vocabulary as a GEMM dimension, GPT-2's 50257 (odd)
// is the extent of an operand's contiguous dimension in each product (the
// logits' rows, dlogits' rows read as K, dlogits' rows read as N), and an
// H200 ran the three at 108-126 TFLOP/s in bf16 against 590 for an aligned
// 8192^3 product, even after the logits' row stride was padded to 50304
// (docs/benchmarks.md). So with ld > vocab these run over ld classes, as
// llm.c pads its vocabulary: wte is copied into scratch with ld - vocab
// zero rows appended (rounded to bf16 on the way when the products
// multiply bf16 copies: the copy the GEMM would make anyway), dlogits'
// padding columns are overwritten with zeros, and the weight gradient goes
// through a padded scratch whose first vocab rows are then added into
// dwte. The padded classes contribute exact
// zeros (0 * w and dlogits' zero columns), so only the GEMMs' rounding
// differs from the unpadded products: within linear_test's tolerances of
// the CPU. With ld == vocab they are plain SgemmCuda calls.
//
// Pointers are device pointers: x [n, d]; wte, dwte [vocab, d]; logits,
// dlogits [n, ld] (ld >= vocab); dx [n, d]. The forward writes every
// column of logits (the padding columns with zeros), the backward
// overwrites dlogits' padding columns with zeros and reads the rest. Work
// is queued on handle.stream() in the handle's GemmMode; scratch comes
// from the stream's cache (stream_scratch.h): about ld * d floats in the
// forward and in the backward (one block, the padded weights and then
// their gradient), plus, where the products
// multiply bf16 copies (linear.h), the copies themselves, the largest
// dlogits' (n * ld bf16 values: 824 MB at GPT-2's 8192 rows; the bf16
// backward below takes that gradient already rounded). Bitwise deterministic run to
// run. INVALID_ARGUMENT for n < 0, d < 1, vocab < 1, ld < vocab or a null
// pointer (before any CUDA call); FAILED_PRECONDITION for an empty handle;
// RESOURCE_EXHAUSTED when the scratch does not fit; INTERNAL if CUDA or
// cuBLAS fails. n == 0 does nothing.
#ifndef PIPETRAIN_KERNELS_CUDA_LM_HEAD_H_
#define PIPETRAIN_KERNELS_CUDA_LM_HEAD_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/linear.h"

namespace pipetrain {

absl::Status LmHeadForwardCuda(const CublasHandle& handle, const float* x, const float* wte, int n,
                               int d, int vocab, int ld, float* logits);

absl::Status LmHeadBackwardCuda(const CublasHandle& handle, const float* x, const float* wte,
                                float* dlogits, int n, int d, int vocab, int ld, float* dx,
                                float* dwte);

// LmHeadBackwardCuda's products from the mean loss's gradient already in
// bf16, as the cross-entropy's forward writes it for the head
// (cross_entropy.h's SoftmaxCrossEntropyForwardBf16GradientCuda: rows of
// stride ld, +0 in the padding), for a handle whose bf16 products multiply
// copies at these strides (MultipliesBf16Copies(handle, {ld, d}),
// linear.h); dloss is the products' alpha:
//   dx = dloss gradient wte;  dwte += dloss gradient^T x
// No fp32 dlogits [n, ld] and no bf16 copy of it per product; wte and x
// are rounded once. For dloss = 1, bitwise the cross-entropy's fp32
// backward followed by LmHeadBackwardCuda (same roundings, same GEMMs);
// for other dloss the gradient is rounded before the scaling rather than
// after (bitwise too when dloss is a power of two, short of subnormals).
// gradient [n, ld] bf16 on the device. Errors as LmHeadBackwardCuda, and
// INVALID_ARGUMENT for a handle that does not multiply copies at these
// strides.
absl::Status LmHeadBackwardBf16Cuda(const CublasHandle& handle, const uint16_t* gradient,
                                    float dloss, const float* x, const float* wte, int n, int d,
                                    int vocab, int ld, float* dx, float* dwte);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_LM_HEAD_H_
