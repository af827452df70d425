// DistPar's layout search for the linear layers of a tensor-parallel group
// (distpar.txt §3.2-§3.4; issue 22 scope 5). Planner-side only: jobs run
// Megatron's column-row layout (spec.parallelism.tensor), whatever this
// search chooses; executing its other choices is not built.
//
// Distributed properties of a logical tensor on the group's n devices
// (§3.2): S(0) split along rows, S(1) split along columns, B broadcast
// (every device a full copy), P partial (every device a full-shaped tensor,
// the logical one their sum).
//
// A matmul Y[m,n] = X[m,k] W[k,n] runs in one of these layouts, each an
// entry of the immediate-inference table (§3.3): the properties of X and W
// it needs and of Y it yields, and, for the backward pass, what dY it needs
// and what dX it yields (dX = dY W^T, dW = X^T dY, inferred by the same
// rules):
//
//   layout      X     W     Y   | dY    dX   | weight-gradient sync
//   data        S(0)  B     S(0)| S(0)  S(0) | all-reduce of dW (P -> B)
//   column      B     S(1)  S(1)| S(1)  P    | none
//   row         S(1)  S(0)  P   | B     S(1) | none
//   replicate   B     B     B   | B     B    | none (every device computes all)
//   cube        C     C     C   | C     C    | none (3-D, only where n = p^3)
//
// C is not one of DistPar's properties: it is the balanced block layout of
// 3d-parallelism.txt (section 3.1, Fig. 4), each of the p^3 devices holding
// 1/n of a tensor (A_ijl, B_lji). A cube matmul all-gathers its X and W
// blocks along two axes of the cube (groups of p), multiplies, and
// reduce-scatters Y along the third (Alg. 1): (p-1)(|X| + |W| + |Y|)
// elements sent in all; its backward runs two such products (Alg. 2) on
// one gathered dY: (p-1)(|dY| + 2|X| + 2|W|).
// The output stays in blocks for the next cube layer (the direction swap
// after each block's first linear layer is internal), and GELU, attention
// and the 3-D LayerNorm work on blocks, so C passes every joiner.
// Computation counts the gathered operands (|X|, |W|, |Y| over p^2).
//
// Between two layers sits the operator that joins them (attention core,
// GELU, residual + LayerNorm). It accepts some properties and passes the
// one it gets through; a producer's property that the next layer cannot
// take is converted by a collective (§3.3, "intermediate primitives"), the
// cheapest way through a property the joining operator accepts.
//
// Costs (§3.4), both totals over the group, like the paper's communication.
// Computation: the elements of the inputs and outputs the devices hold,
// summed over the forward matmul and the two backward ones and over all n
// devices (the paper's simplification: every layout runs the same kernels,
// so work follows the operands' sizes; replication thus costs n times).
// This is what `pipetrain plan --tensor` prints. `plan --data auto` prints
// another "DistPar cost" (DistParLayoutCost, data_parallel_layout.h) whose
// computation is the busiest device's, not the sum over devices: the two
// commands' costs are not comparable.
// Communication: the elements all devices together send for each
// conversion, with ring collectives on |T| elements:
//   S(i) -> B   all-gather        (n-1)|T|
//   P -> S(i)   reduce-scatter    (n-1)|T|
//   P -> B      all-reduce        2(n-1)|T|
//   S(0)<->S(1) all-to-all        (n-1)|T|/n
//   S(i) <-> C  all-to-all        (n-1)|T|/n
//   C -> B      all-gather        (n-1)|T|
//   P -> C      reduce-scatter    (n-1)|T|
//   from B, to P, and no change: 0 (a local slice, or
//   zeros on all devices but one: the paper's "12P", Fig. 1b)
// The chosen scheme minimises  computation + beta * communication  over
// the whole chain: beta says how many computed elements one communicated
// element is worth (§3.4 introduces it as the ratio of the two costs; its
// best value depends on the model and the machine, §4.2).
//
// beta from the machine: CalibratedBeta below turns a device's GEMM rate
// and its link's bandwidth into the beta that makes the cost proportional
// to time. Not yet: a job that runs the chosen layouts (jobs run one
// layout for every block: 1-D column-row or the 3-D cube).
//
// Shares are equal (a job's ranks cut a dimension so): a property that
// splits a dimension the devices do not divide is not an option, nor is a
// layout whose operands would need one (Fits below). Replication always
// is, so every chain has a scheme.
//
// All functions are pure and thread-safe.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_DISTPAR_LAYOUT_H_
#define PIPETRAIN_COORDINATOR_PLANNER_DISTPAR_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pipetrain {

// S(0), S(1), B, P, and the 3-D blocks C.
enum class Sbp { kSplitRows, kSplitColumns, kBroadcast, kPartial, kCube };
std::string SbpName(Sbp sbp);  // "S(0)", "S(1)", "B", "P", "C"

enum class MatmulLayout { kData, kColumn, kRow, kReplicate, kCube };
inline constexpr int kMatmulLayouts = 5;
// "data", "column", "row", "replicate", "cube"
std::string MatmulLayoutName(MatmulLayout layout);

// p if devices == p^3 for an integer p >= 2, else 0 (no cube layout).
int CubeSide(int devices);

// Which properties the operator after a layer accepts (and passes on).
enum class Joiner {
  kElementwise,  // GELU, dropout: any but P
  kAttention,    // the attention core: S(0) (batch), S(1) (whole heads), B
  kRowwise,      // residual + LayerNorm: S(0) or B (a row must be whole)
};

struct MatmulLayer {
  std::string name;
  int64_t m = 0;                    // rows of X and Y (tokens)
  int64_t k = 0;                    // columns of X, rows of W
  int64_t n = 0;                    // columns of W and Y
  Joiner after = Joiner::kRowwise;  // the operator between this layer and the next
};

// The linear layers of one GPT-2 block (qkv, attention projection, MLP fc,
// MLP projection) for `tokens` rows (micro-batch x sequence length).
std::vector<MatmulLayer> GptBlockLayers(int64_t tokens, int64_t d_model);

struct LayoutProblem {
  std::vector<MatmulLayer> layers;
  int devices = 2;    // n, the tensor-parallel group; >= 2
  double beta = 1.0;  // weight of communication; >= 0
  // The sequences the layers' m rows hold and the attention heads, when
  // known (0: not constrained). The attention core computes on whole
  // sequences and heads: the property it works on may be S(0) only when
  // the devices divide the sequences, S(1) when they divide the heads,
  // and C when p^2 divides the sequences and p the heads (as
  // worker/model/tensor_parallel.h's ValidateCubeTensorParallel asks). The
  // layers themselves split rows and columns anywhere the devices divide.
  int64_t samples = 0;
  int64_t heads = 0;
  // The first layer's input arrives as, and the last layer's output (and
  // the first layer's input gradient) must leave as:
  Sbp input = Sbp::kBroadcast;
  Sbp output = Sbp::kBroadcast;
};

// One conversion the scheme needs, for the plan printout.
struct Conversion {
  std::string where;  // e.g. "after fc (forward)", "dW of qkv"
  Sbp from = Sbp::kBroadcast;
  Sbp to = Sbp::kBroadcast;
  std::string collective;  // "all-gather", "all-reduce", ...
  double elements = 0;     // sent by all devices together
};

struct LayoutScheme {
  std::vector<MatmulLayout> layouts;  // one per layer
  double computation = 0;
  double communication = 0;
  double cost = 0;  // computation + beta * communication
  std::vector<Conversion> conversions;
};

// The scheme of least cost, by dynamic programming over the chain (exact:
// the cost is a sum of per-layer terms and terms of adjacent pairs), among
// the layouts and conversions whose splits divide (LayoutFits). Ties go
// to the lexicographically smallest layouts (in MatmulLayout order); costs
// within a relative 1e-12 tie, as the search adds a scheme's terms in
// another order than EvaluateLayouts and rounding must not decide.
// INVALID_ARGUMENT for no layers, a non-positive dimension, devices < 2,
// beta < 0 or not finite, negative samples or heads, or an input/output
// property of P or one whose split does not divide the first layer's
// input or the last layer's output.
absl::StatusOr<LayoutScheme> SolveLayouts(const LayoutProblem& problem);

// Whether layer `index` of `problem` may run `layout`: its operands' splits
// divide (data: the rows; column: W's and Y's columns; row: the inner
// dimension; cube: p^3 devices with p^2 | rows and n, p | k; replicate:
// always). Sequences and heads constrain only the property the attention
// core works on, between layers. `problem` must be valid.
bool LayoutFits(const LayoutProblem& problem, size_t index, MatmulLayout layout);
// Whether `layouts` has one layout per layer, each fitting its layer.
bool SchemeFits(const LayoutProblem& problem, const std::vector<MatmulLayout>& layouts);

// The cost of a given assignment (the same model), for tests and for
// comparing fixed schemes (e.g. Megatron's column-row). Requires a valid
// problem and one layout per layer, each fitting it (checked: test with
// SchemeFits first).
LayoutScheme EvaluateLayouts(const LayoutProblem& problem,
                             const std::vector<MatmulLayout>& layouts);

// beta for a machine (distpar.txt §3.4 leaves its value to the user): the
// seconds one communicated element takes (4 bytes over the link's
// `bandwidth_bytes_per_second`) over the seconds one computed element
// stands for. The cost model counts a matmul product's work by its
// operands' elements, mk + kn + mn, while it takes 2 mkn FLOPs; so one
// computed element of `layers` is sum(2 mkn) / sum(mk + kn + mn) FLOPs at
// `flops_per_second`. Both costs are totals over the group, shared alike
// by its devices and their links, so the group size cancels:
//   beta = 4 flops_per_second / (bandwidth x FLOPs per computed element).
// INVALID_ARGUMENT for no layers, a non-positive dimension, or a rate or
// bandwidth that is not positive and finite.
absl::StatusOr<double> CalibratedBeta(const std::vector<MatmulLayer>& layers,
                                      double flops_per_second, double bandwidth_bytes_per_second);

// Every assignment tried; for tests on small chains (at most 8 layers).
// The same tie rule as SolveLayouts, so both return the same scheme.
absl::StatusOr<LayoutScheme> SolveLayoutsBruteForce(const LayoutProblem& problem);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_DISTPAR_LAYOUT_H_
