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
// relatively in any data-parallel system. They are held to Adam's bound
// instead: each step moves an entry by at most about lr * (1 - beta1) /
// sqrt(1 - beta2) < 4 lr, so two runs differ by at most 8 lr per step.
#ifndef PIPETRAIN_WORKER_RUNTIME_DATA_PARALLEL_TESTING_H_
#define PIPETRAIN_WORKER_RUNTIME_DATA_PARALLEL_TESTING_H_

#include <map>
#include <string>
#include <vector>

namespace pipetrain {
namespace testing {

inline constexpr double kDataParallelRelative = 1e-5;

// Each loss within kDataParallelRelative of its reference (EXPECT).
void ExpectLossesClose(const std::vector<float>& got, const std::vector<float>& want,
                       const std::string& what);

// Every tensor of `want` present in `got` and within kDataParallelRelative
// in the max norm, the key bias of a d_model-wide model within
// 8 * max_lr * steps (EXPECT).
void ExpectWeightsClose(const std::map<std::string, std::vector<float>>& got,
                        const std::map<std::string, std::vector<float>>& want, int d_model,
                        double max_lr, int steps, const std::string& what);

}  // namespace testing
}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_RUNTIME_DATA_PARALLEL_TESTING_H_
