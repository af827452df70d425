#include "coordinator/planner/distpar_layout.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "worker/model/tensor_parallel.h"

namespace pipetrain {
namespace {

constexpr int kMaxBruteForceLayers = 8;

// One row of the immediate-inference table (header): what a layout needs
// and yields, forward and backward, and the property of its dW.
struct LayoutRow {
  Sbp x, w, y, dy, dx, dw;
};

LayoutRow RowOf(MatmulLayout layout) {
  using S = Sbp;
  switch (layout) {
    case MatmulLayout::kData:
      return {S::kSplitRows, S::kBroadcast, S::kSplitRows,
              S::kSplitRows, S::kSplitRows, S::kPartial};
    case MatmulLayout::kColumn:
      return {S::kBroadcast,    S::kSplitColumns, S::kSplitColumns,
              S::kSplitColumns, S::kPartial,      S::kSplitColumns};
    case MatmulLayout::kRow:
      return {S::kSplitColumns, S::kSplitRows,    S::kPartial,
              S::kBroadcast,    S::kSplitColumns, S::kSplitRows};
    case MatmulLayout::kCube:
      return {S::kCube, S::kCube, S::kCube, S::kCube, S::kCube, S::kCube};
    case MatmulLayout::kReplicate:
      break;
  }
  return {S::kBroadcast, S::kBroadcast, S::kBroadcast, S::kBroadcast, S::kBroadcast, S::kBroadcast};
}

bool Split(Sbp p) { return p == Sbp::kSplitRows || p == Sbp::kSplitColumns; }

// Whether a [rows, cols] tensor can take property `s` on the problem's
// devices, in equal shares; `attention`: it is what the attention core
// works on, which needs whole sequences and heads (the header's
// LayoutProblem). samples and heads of 0 divide by anything.
bool TensorFits(const LayoutProblem& p, Sbp s, int64_t rows, int64_t cols, bool attention) {
  const int64_t n = p.devices;
  switch (s) {
    case Sbp::kBroadcast:
    case Sbp::kPartial:
      return true;
    case Sbp::kSplitRows:
      return rows % n == 0 && (!attention || p.samples % n == 0);
    case Sbp::kSplitColumns:
      return cols % n == 0 && (!attention || p.heads % n == 0);
    case Sbp::kCube: {
      // Blocks of [rows / p^2, cols / p] (worker/cube/cube_linear.h).
      const int64_t side = CubeSide(p.devices);
      return side > 0 && rows % (side * side) == 0 && cols % side == 0 &&
             (!attention || (p.samples % (side * side) == 0 && p.heads % side == 0));
    }
  }
  return false;
}

// Elements of a rows x cols tensor one device holds under `p`.
double LocalElements(Sbp p, int64_t rows, int64_t cols, int n) {
  const double all = static_cast<double>(rows) * static_cast<double>(cols);
  return Split(p) || p == Sbp::kCube ? all / n : all;
}

// A conversion's collective and the elements all devices send (header).
std::pair<std::string, double> Convert(Sbp from, Sbp to, double elements, int n) {
  if (from == to || to == Sbp::kPartial || from == Sbp::kBroadcast) return {"", 0.0};
  if (from == Sbp::kPartial) {
    if (to == Sbp::kBroadcast) return {"all-reduce", 2.0 * (n - 1) * elements};
    return {"reduce-scatter", (n - 1) * elements};  // to S(i) or C
  }
  if (to == Sbp::kBroadcast) return {"all-gather", (n - 1) * elements};  // from S(i) or C
  return {"all-to-all", (n - 1) * elements / n};                         // between S(0), S(1) and C
}

bool Accepts(Joiner joiner, Sbp p) {
  switch (joiner) {
    case Joiner::kElementwise:
    case Joiner::kAttention:
      return p != Sbp::kPartial;
    case Joiner::kRowwise:  // C: the 3-D LayerNorm (3d-parallelism.txt section 3.3)
      return p == Sbp::kSplitRows || p == Sbp::kBroadcast || p == Sbp::kCube;
  }
  return false;
}

// Backward through a joiner: the gradient takes the property of the
// forward activation, or P where that is B (the backward of any operator is
// linear in the incoming gradient, so partial sums pass through a device
// that holds the whole activation).
bool BackwardAccepts(Sbp forward, Sbp gradient) {
  return gradient == forward || (forward == Sbp::kBroadcast && gradient == Sbp::kPartial);
}

// The conversions around one joiner, forward and backward, at least cost:
// forward `from` (|from_elements|) -> p -> `to` (|to_elements|); backward
// `grad_from` (|to_elements|) -> q -> `grad_to` (|from_elements|).
struct Link {
  double communication = 0;
  std::vector<Conversion> conversions;
};

void Add(Link& link, const std::string& where, Sbp from, Sbp to, double elements, int n) {
  auto [collective, sent] = Convert(from, to, elements, n);
  if (sent == 0) return;
  link.communication += sent;
  link.conversions.push_back({where, from, to, collective, sent});
}

// `fits`: the properties the joined tensor may take (TensorFits).
Link BestLink(Joiner joiner, const std::function<bool(Sbp)>& fits, Sbp from, double from_elements,
              Sbp to, double to_elements, Sbp grad_from, Sbp grad_to, int n,
              const std::string& forward_where, const std::string& backward_where) {
  Link best;
  best.communication = std::numeric_limits<double>::infinity();
  // B first: of equal costs, one all-reduce beats a reduce-scatter plus an
  // all-gather (the same elements, one collective fewer).
  constexpr std::array<Sbp, 5> kOrder = {Sbp::kBroadcast, Sbp::kSplitRows, Sbp::kSplitColumns,
                                         Sbp::kCube, Sbp::kPartial};
  for (Sbp p : kOrder) {
    if (!Accepts(joiner, p) || !fits(p)) continue;  // B always fits: a link exists
    for (Sbp q : kOrder) {
      if (!BackwardAccepts(p, q) || !fits(q)) continue;
      Link link;
      Add(link, forward_where, from, p, from_elements, n);
      Add(link, forward_where, p, to, to_elements, n);
      Add(link, backward_where, grad_from, q, to_elements, n);
      Add(link, backward_where, q, grad_to, from_elements, n);
      if (link.communication < best.communication) best = std::move(link);
    }
  }
  return best;
}

double Elements(int64_t rows, int64_t cols) {
  return static_cast<double>(rows) * static_cast<double>(cols);
}

// Computation and weight-gradient communication of one layer.
void LayerTerms(const MatmulLayer& l, MatmulLayout layout, int n, double* computation, Link* sync) {
  const LayoutRow r = RowOf(layout);
  const double x = LocalElements(r.x, l.m, l.k, n), w = LocalElements(r.w, l.k, l.n, n),
               y = LocalElements(r.y, l.m, l.n, n), dy = LocalElements(r.dy, l.m, l.n, n),
               dx = LocalElements(r.dx, l.m, l.k, n), dw = LocalElements(r.dw, l.k, l.n, n);
  if (layout == MatmulLayout::kCube) {
    // Alg. 1 and 2: three products on operands gathered to 1/p^2 of each
    // tensor. The forward gathers X and W and reduce-scatters Y; the
    // backward gathers dY, X and W once for both of its products and
    // reduce-scatters dX and dW (as worker/cube/cube_linear.h runs it:
    // Alg. 2 read literally gathers dY twice, one |Y| more than is sent).
    const int p = CubeSide(n);
    const double mk = Elements(l.m, l.k), kn = Elements(l.k, l.n), mn = Elements(l.m, l.n);
    *computation = n * 3 * (mk + kn + mn) / p / p;
    const double sent = (p - 1) * ((mk + kn + mn) + (mn + 2 * mk + 2 * kn));
    sync->communication += sent;
    sync->conversions.push_back({absl::StrCat(l.name, " (3-D products, forward and backward)"),
                                 Sbp::kCube, Sbp::kCube, "all-gather + reduce-scatter", sent});
    return;
  }
  // Y = XW, dX = dY W^T, dW = X^T dY, on each of the n devices.
  *computation = n * ((x + w + y) + (dy + w + dx) + (x + dy + dw));
  Add(*sync, absl::StrCat("dW of ", l.name), r.dw, r.w, Elements(l.k, l.n), n);
}

// Conversions between layer i and layer i + 1 (or the chain's end when i is
// the last layer).
Link PairLink(const LayoutProblem& p, size_t i, MatmulLayout a, MatmulLayout b) {
  const MatmulLayer& l = p.layers[i];
  const LayoutRow ra = RowOf(a);
  const bool last = i + 1 == p.layers.size();
  const Sbp to = last ? p.output : RowOf(b).x;
  const Sbp grad_from = last ? p.output : RowOf(b).dx;
  const double to_elements =
      last ? Elements(l.m, l.n) : Elements(p.layers[i + 1].m, p.layers[i + 1].k);
  // Whole sequences and heads matter only where the attention core
  // computes: a layer's own X and Y split anywhere the devices divide (a
  // slice or a gather joins them to the core).
  const bool attention = l.after == Joiner::kAttention;
  const auto fits = [&](Sbp s) { return TensorFits(p, s, l.m, l.n, attention); };
  return BestLink(l.after, fits, ra.y, Elements(l.m, l.n), to, to_elements, grad_from, ra.dy,
                  p.devices, absl::StrCat("after ", l.name, " (forward)"),
                  absl::StrCat("into ", l.name, " (backward)"));
}

// The input's conversion into the first layer, and its gradient's back.
Link StartLink(const LayoutProblem& p, MatmulLayout a) {
  const MatmulLayer& l = p.layers[0];
  const LayoutRow r = RowOf(a);
  Link link;
  Add(link, absl::StrCat("into ", l.name, " (forward)"), p.input, r.x, Elements(l.m, l.k),
      p.devices);
  Add(link, absl::StrCat("out of ", l.name, " (backward)"), r.dx, p.input, Elements(l.m, l.k),
      p.devices);
  return link;
}

absl::Status Validate(const LayoutProblem& p) {
  if (p.layers.empty()) return absl::InvalidArgumentError("layout search: no layers");
  for (const MatmulLayer& l : p.layers) {
    if (l.m < 1 || l.k < 1 || l.n < 1) {
      return absl::InvalidArgumentError(absl::StrCat("layout search: layer ", l.name,
                                                     " has a non-positive dimension (", l.m, " x ",
                                                     l.k, " x ", l.n, ")"));
    }
  }
  if (p.devices < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout search: tensor-parallel group of ", p.devices, "; needs >= 2"));
  }
  if (!(p.beta >= 0) || !std::isfinite(p.beta)) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout search: beta ", p.beta, " must be finite and >= 0"));
  }
  if (p.input == Sbp::kPartial || p.output == Sbp::kPartial) {
    return absl::InvalidArgumentError(
        "layout search: the chain's input and output cannot be partial sums (P)");
  }
  if (p.samples < 0 || p.heads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("layout search: samples ", p.samples,
                                                   " and heads ", p.heads, " must be >= 0"));
  }
  const MatmulLayer& first = p.layers.front();
  const MatmulLayer& last = p.layers.back();
  if (!TensorFits(p, p.input, first.m, first.k, false) ||
      !TensorFits(p, p.output, last.m, last.n, false)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout search: the chain's input ", SbpName(p.input), " or output ", SbpName(p.output),
        " splits a dimension that ", p.devices, " devices do not divide"));
  }
  return absl::OkStatus();
}

MatmulLayout LayoutAt(int index) { return static_cast<MatmulLayout>(index); }

// Always fits (nothing split): the fallback where every cost overflows.
constexpr int kReplicateIndex = static_cast<int>(MatmulLayout::kReplicate);

// Whether `cost` beats `best` by more than rounding: the search sums a
// scheme's terms in another order than EvaluateLayouts, so two schemes of
// bitwise-equal evaluated cost can differ by a few ulps here; treating
// costs within 1e-12 of the larger as equal keeps the earlier candidate,
// which is the header's tie rule. Real differences between schemes are
// differences of element counts (times beta), in practice far above this.
bool Cheaper(double cost, double best) {
  constexpr double kRelativeTie = 1e-12;
  if (!(cost < best)) return false;
  if (std::isinf(best)) return true;  // a finite cost beats an overflowed one
  return best - cost > kRelativeTie * std::max(std::fabs(cost), std::fabs(best));
}

}  // namespace

std::string SbpName(Sbp sbp) {
  switch (sbp) {
    case Sbp::kSplitRows:
      return "S(0)";
    case Sbp::kSplitColumns:
      return "S(1)";
    case Sbp::kBroadcast:
      return "B";
    case Sbp::kPartial:
      return "P";
    case Sbp::kCube:
      return "C";
  }
  return "?";
}

int CubeSide(int devices) { return CubeEdge(devices); }

bool LayoutFits(const LayoutProblem& problem, size_t index, MatmulLayout layout) {
  const MatmulLayer& l = problem.layers[index];
  if (layout == MatmulLayout::kCube) {
    // W in blocks of [k / p, n / p^2] (worker/cube/cube_linear.h).
    const int64_t side = CubeSide(problem.devices);
    return side > 0 && l.k % side == 0 && l.n % (side * side) == 0 &&
           TensorFits(problem, Sbp::kCube, l.m, l.k, false) &&
           TensorFits(problem, Sbp::kCube, l.m, l.n, false);
  }
  const LayoutRow r = RowOf(layout);
  return TensorFits(problem, r.x, l.m, l.k, false) && TensorFits(problem, r.w, l.k, l.n, false) &&
         TensorFits(problem, r.y, l.m, l.n, false);
}

std::string MatmulLayoutName(MatmulLayout layout) {
  switch (layout) {
    case MatmulLayout::kData:
      return "data";
    case MatmulLayout::kColumn:
      return "column";
    case MatmulLayout::kRow:
      return "row";
    case MatmulLayout::kReplicate:
      return "replicate";
    case MatmulLayout::kCube:
      return "cube";
  }
  return "?";
}

absl::StatusOr<double> CalibratedBeta(const std::vector<MatmulLayer>& layers,
                                      double flops_per_second, double bandwidth_bytes_per_second) {
  if (!(flops_per_second > 0) || !std::isfinite(flops_per_second) ||
      !(bandwidth_bytes_per_second > 0) || !std::isfinite(bandwidth_bytes_per_second)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a calibrated beta needs a positive GEMM rate and link bandwidth, got ",
                     flops_per_second, " FLOP/s and ", bandwidth_bytes_per_second, " bytes/s"));
  }
  if (layers.empty()) return absl::InvalidArgumentError("a calibrated beta needs layers");
  double flops = 0, elements = 0;
  for (const MatmulLayer& l : layers) {
    if (l.m < 1 || l.k < 1 || l.n < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l.name, " has a non-positive dimension"));
    }
    const double m = static_cast<double>(l.m), k = static_cast<double>(l.k),
                 n = static_cast<double>(l.n);
    flops += 2 * m * k * n;
    elements += m * k + k * n + m * n;
  }
  const double flops_per_element = flops / elements;
  return 4 * flops_per_second / (bandwidth_bytes_per_second * flops_per_element);
}

std::vector<MatmulLayer> GptBlockLayers(int64_t tokens, int64_t d_model) {
  return {
      {"qkv", tokens, d_model, 3 * d_model, Joiner::kAttention},
      {"attention projection", tokens, d_model, d_model, Joiner::kRowwise},
      {"fc", tokens, d_model, 4 * d_model, Joiner::kElementwise},
      {"fc projection", tokens, 4 * d_model, d_model, Joiner::kRowwise},
  };
}

bool SchemeFits(const LayoutProblem& problem, const std::vector<MatmulLayout>& layouts) {
  if (layouts.size() != problem.layers.size()) return false;
  for (size_t i = 0; i < layouts.size(); ++i) {
    if (!LayoutFits(problem, i, layouts[i])) return false;
  }
  return true;
}

LayoutScheme EvaluateLayouts(const LayoutProblem& problem,
                             const std::vector<MatmulLayout>& layouts) {
  PT_CHECK(Validate(problem).ok()) << Validate(problem);
  PT_CHECK(layouts.size() == problem.layers.size()) << layouts.size();
  for (size_t i = 0; i < layouts.size(); ++i) {
    PT_CHECK(LayoutFits(problem, i, layouts[i]))
        << MatmulLayoutName(layouts[i]) << " layout of " << problem.layers[i].name << " on "
        << problem.devices << " devices: a split does not divide";
  }
  LayoutScheme scheme;
  scheme.layouts = layouts;
  auto take = [&](Link link) {
    scheme.communication += link.communication;
    for (Conversion& c : link.conversions) scheme.conversions.push_back(std::move(c));
  };
  take(StartLink(problem, layouts[0]));
  for (size_t i = 0; i < layouts.size(); ++i) {
    double computation = 0;
    Link sync;
    LayerTerms(problem.layers[i], layouts[i], problem.devices, &computation, &sync);
    scheme.computation += computation;
    take(std::move(sync));
    const MatmulLayout next = i + 1 < layouts.size() ? layouts[i + 1] : layouts[i];
    take(PairLink(problem, i, layouts[i], next));
  }
  scheme.cost = scheme.computation + problem.beta * scheme.communication;
  return scheme;
}

absl::StatusOr<LayoutScheme> SolveLayouts(const LayoutProblem& problem) {
  if (absl::Status s = Validate(problem); !s.ok()) return s;
  const size_t layers = problem.layers.size();
  // suffix[i][a]: the least cost of layers i.. given layer i runs layout a,
  // counting layer i's own terms and every link after it; then[i][a]: the
  // layout of layer i + 1 that reaches it (the earliest in MatmulLayout
  // order on ties). Backtracking on these choices, rather than matching
  // costs again going forward, cannot lose the optimum to rounding (or to
  // inf - inf when beta times a link overflows).
  std::vector<std::array<double, kMatmulLayouts>> suffix(layers);
  std::vector<std::array<int, kMatmulLayouts>> then(layers);
  auto own = [&](size_t i, int a) {
    double computation = 0;
    Link sync;
    LayerTerms(problem.layers[i], LayoutAt(a), problem.devices, &computation, &sync);
    return computation + problem.beta * sync.communication;
  };
  for (size_t i = layers; i-- > 0;) {
    for (int a = 0; a < kMatmulLayouts; ++a) {
      double best = std::numeric_limits<double>::infinity();
      then[i][a] = kReplicateIndex;
      if (!LayoutFits(problem, i, LayoutAt(a))) {
        suffix[i][a] = best;
        continue;
      }
      if (i + 1 == layers) {
        best = problem.beta * PairLink(problem, i, LayoutAt(a), LayoutAt(a)).communication;
        then[i][a] = a;
      } else {
        for (int b = 0; b < kMatmulLayouts; ++b) {
          if (!LayoutFits(problem, i + 1, LayoutAt(b))) continue;
          const double link = PairLink(problem, i, LayoutAt(a), LayoutAt(b)).communication;
          const double cost = problem.beta * link + suffix[i + 1][b];
          if (Cheaper(cost, best)) best = cost, then[i][a] = b;
        }
      }
      suffix[i][a] = own(i, a) + best;
    }
  }
  // The first layer's layout, with the link from the input, then the
  // choices recorded above.
  int a = kReplicateIndex;
  double target = std::numeric_limits<double>::infinity();
  for (int b = 0; b < kMatmulLayouts; ++b) {
    if (!LayoutFits(problem, 0, LayoutAt(b))) continue;
    const double cost = problem.beta * StartLink(problem, LayoutAt(b)).communication + suffix[0][b];
    if (Cheaper(cost, target)) target = cost, a = b;
  }
  std::vector<MatmulLayout> layouts;
  for (size_t i = 0; i < layers; ++i) {
    layouts.push_back(LayoutAt(a));
    a = then[i][a];
  }
  return EvaluateLayouts(problem, layouts);
}

absl::StatusOr<LayoutScheme> SolveLayoutsBruteForce(const LayoutProblem& problem) {
  if (absl::Status s = Validate(problem); !s.ok()) return s;
  if (problem.layers.size() > kMaxBruteForceLayers) {
    return absl::InvalidArgumentError(absl::StrCat("brute force: at most ", kMaxBruteForceLayers,
                                                   " layers, not ", problem.layers.size()));
  }
  std::vector<int> digits(problem.layers.size(), 0);
  LayoutScheme best;
  best.cost = std::numeric_limits<double>::infinity();
  while (true) {
    std::vector<MatmulLayout> layouts;
    for (int d : digits) layouts.push_back(LayoutAt(d));
    if (SchemeFits(problem, layouts)) {
      LayoutScheme scheme = EvaluateLayouts(problem, layouts);
      if (Cheaper(scheme.cost, best.cost)) best = std::move(scheme);
    }
    size_t i = digits.size();
    while (i > 0 && digits[i - 1] == kMatmulLayouts - 1) digits[--i] = 0;
    if (i == 0) break;
    ++digits[i - 1];
  }
  return best;
}

}  // namespace pipetrain
