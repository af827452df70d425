// What "equal to train-local" means under data parallelism (testonly),
// shared by the in-process and the cross-process equivalence tests; tensor
// parallelism, whose row-parallel layers sum partial GEMMs in another order,
// is held to the same definition (the key-bias argument below applies
// unchanged).
//
// LocalTrainer adds each micro-batch's gradient into one float accumulator
// in micro-batch order (g1 + g2 + g3 + g4), while each replica accumulates
// only its share and the all-reduce then adds the replicas' partial sums
// ((g1 + g2) + (g3 + g4)). Float addition is not associative, so the
// gradients differ in the last bits and Adam carries that forward: the
// results cannot be bitwise train-local's, and are held to 1e-5 relative
// (each loss; each weight tensor in the max norm, since entry by entry a
// weight that passes near zero would demand more than float rounding
// gives).
//
// One exception: the key bias, entries [d, 2d) of each attention's
// c_attn.bias. Its exact gradient is zero (a bias added to every key adds
// q.b to all of a query's scores alike, which the softmax cancels), so what
// any run computes for it is rounding noise, and Adam, which divides by the
// gradient's own magnitude, turns any noise into steps of about lr. Two
// summation orders give two different noises: these entries cannot agree
// relatively in any data-parallel system. They are not compared. (Adam
// bounds them, each step moving an entry by at most about lr * (1 - beta1)
// / sqrt(1 - beta2) < 4 lr, but that holds whatever the gradient, so a
// check against it could not fail.) The other two thirds of the bias, the
// queries' and values', are compared as every other tensor.
#ifndef PIPETRAIN_WORKER_RUNTIME_DATA_PARALLEL_TESTING_H_
#define PIPETRAIN_WORKER_RUNTIME_DATA_PARALLEL_TESTING_H_

#include <map>
#include <string>
#include <vector>

namespace pipetrain {
namespace testing {

inline constexpr double kDataParallelRelative = 1e-5;

// Tensor parallelism changes the forward pass too (each row-parallel
// layer's output is a sum of T partial GEMMs, the softmax's normaliser a sum
// of T partial sums), so every gradient carries a rounding perturbation of
// about 1e-7 of its tensor's largest entries, where data parallelism only
// reorders a sum of gradients. AdamW divides each element's step by that
// element's own gradient RMS: an element whose gradient is 1e-3 of its
// tensor's largest takes the perturbation at 1e-4 of its step, and over 10
// steps of lr 1e-3 weights of magnitude ~0.04 drift apart by up to ~2e-5 of
// that magnitude (seen: 2.0e-5 on h.1.mlp.c_proj.weight, 2 workers per
// stage). Tensor-parallel weights are held to 5e-5 of each tensor's largest
// magnitude; their losses still to kDataParallelRelative.
inline constexpr double kTensorParallelWeightsRelative = 5e-5;

// max |got - want| <= relative * max |want| (+ 1e-9 for an all-zero
// `want`), the same sizes, every difference finite (a NaN fails naming its
// entry) (EXPECT; the message names `what`).
void ExpectScaledClose(const std::vector<float>& got, const std::vector<float>& want,
                       double relative, const std::string& what);

// Each loss within kDataParallelRelative of its reference (EXPECT).
void ExpectLossesClose(const std::vector<float>& got, const std::vector<float>& want,
                       const std::string& what);

// Every tensor of `want` present in `got` and within `relative` of its
// largest magnitude in the max norm, but the key bias of a d_model-wide
// model, which is not compared (above); every entry's difference, the key
// bias's too, finite (a NaN fails naming its entry) (EXPECT).
void ExpectWeightsClose(const std::map<std::string, std::vector<float>>& got,
                        const std::map<std::string, std::vector<float>>& want, int d_model,
                        const std::string& what, double relative = kDataParallelRelative);

}  // namespace testing
}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_RUNTIME_DATA_PARALLEL_TESTING_H_
