// The communication a 3-D cube layout needs (3d-parallelism.txt §2.3, §3.1),
// seen from one rank of a p x p x p processor cube.
//
// Coordinates and rank index: a rank is (i, j, l), 0 <= i, j, l < p, and
// its index in the cube is r = (i * p + j) * p + l (l fastest), the order in
// which a job would list the T = p^3 tensor-parallel workers. The paper's
// three directions are the cube's axes: x moves along i, y along j, z along
// l (Figure 1). An "axis group" is the p ranks that differ only in the
// coordinate of that axis; a rank's coordinate along the axis is its member
// index in the group.
//
// Which axis plays the input, the weight or the output role of a 3-D matrix
// product is a CubeDirection (the paper's "directions y, x, z for A, B, C"
// of Algorithms 1-8); a linear layer's output leaves in the direction with
// input and output exchanged (Swapped()), which is the paper's y / z = 1 - y
// group index.
//
// CubeComm is the contract the 3-D operations use; one object per rank.
// Every collective runs along one axis and needs all p members of this
// rank's group to call it, with the same sizes, in the same order.
// Segments are equal: callers guarantee divisibility (the layouts of
// cube_layout.h make every buffer a multiple of p), so an implementation
// over worker/collectives Collectives (one per axis group, members in
// coordinate order) maps AllGather, ReduceScatter, AllReduce and Broadcast
// onto its calls of the same names, with SegmentBounds giving equal
// segments.
//
// Determinism: each sum is taken in an order fixed by the members'
// coordinates and the size (never by arrival), and every member of a group
// ends with bitwise the same values from AllGather, AllReduce and
// Broadcast. Implementations may differ in that order (a ring's is not a
// left fold), so results equal a sequential sum only to rounding.
//
// Errors: INVALID_ARGUMENT for buffer sizes that break the contract (named
// in the message), DEADLINE_EXCEEDED when the group's members do not all
// arrive in time, INTERNAL when members call different collectives; after
// an error the group's state is undefined and the caller must restart at a
// higher level. Not thread-safe: one collective at a time per object.
#ifndef PIPETRAIN_WORKER_CUBE_CUBE_COMM_H_
#define PIPETRAIN_WORKER_CUBE_CUBE_COMM_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace pipetrain {

// The cube's axes; the value is the coordinate's position in (i, j, l).
enum class CubeAxis { kX = 0, kY = 1, kZ = 2 };

// "x", "y" or "z".
const char* CubeAxisName(CubeAxis axis);

// A rank's place in the cube: coords = {i, j, l}.
struct CubeCoord {
  std::array<int, 3> coords = {0, 0, 0};
  int operator[](CubeAxis axis) const { return coords[static_cast<int>(axis)]; }
  int& operator[](CubeAxis axis) { return coords[static_cast<int>(axis)]; }
};

// r = (i * p + j) * p + l, and back. Require 0 <= coordinates < p, 0 <= r < p^3.
int CubeRankIndex(const CubeCoord& coord, int p);
CubeCoord CubeCoordOf(int rank, int p);

// The axes playing the three roles of a 3-D product C = A B: `input` for A
// (all-gathered in the forward), `weight` for B, `output` for C (reduce-
// scattered). Algorithm 1 as printed uses {y, x, z}.
struct CubeDirection {
  CubeAxis input = CubeAxis::kY;
  CubeAxis weight = CubeAxis::kX;
  CubeAxis output = CubeAxis::kZ;

  // The direction of a linear layer's output, i.e. of the next layer:
  // input and output exchanged, weight kept (§3.1.1 and §3.2).
  CubeDirection Swapped() const { return {output, weight, input}; }
  // True when the three roles name three different axes.
  bool Valid() const;
  std::string ToString() const;  // "in=y w=x out=z"
};

// INVALID_ARGUMENT unless p >= 2 (a 1 x 1 x 1 cube is no parallelism; use
// the unsplit kernels) and `direction` is Valid(); `what` names the caller.
absl::Status ValidateCube(int p, const CubeDirection& direction, const char* what);

class CubeComm {
 public:
  virtual ~CubeComm() = default;

  // Edge length of the cube (>= 2) and this rank's coordinates.
  virtual int p() const = 0;
  virtual CubeCoord coord() const = 0;

  // `out` <- the group members' `segment`s concatenated in coordinate
  // order. Requires out.size() == p() * segment.size(); `out` must not
  // overlap `segment`.
  virtual absl::Status AllGather(CubeAxis axis, absl::Span<const float> segment,
                                 absl::Span<float> out) = 0;
  // `out` <- segment c of the sum of the members' `data`, c = this rank's
  // coordinate along `axis` (segments of out.size() elements, in order).
  // Requires data.size() == p() * out.size(); no overlap.
  virtual absl::Status ReduceScatter(CubeAxis axis, absl::Span<const float> data,
                                     absl::Span<float> out) = 0;
  // `data` <- the sum of the members' `data` (same size on every member),
  // in place. Any size.
  virtual absl::Status AllReduce(CubeAxis axis, absl::Span<float> data) = 0;
  // `data` <- the `data` of the member with coordinate `root` along `axis`,
  // in place (0 <= root < p(), the same on every member). Any size.
  virtual absl::Status Broadcast(CubeAxis axis, int root, absl::Span<float> data) = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_CUBE_CUBE_COMM_H_
