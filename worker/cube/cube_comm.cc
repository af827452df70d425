#include "worker/cube/cube_comm.h"

#include "absl/strings/str_cat.h"

namespace pipetrain {

const char* CubeAxisName(CubeAxis axis) {
  switch (axis) {
    case CubeAxis::kX:
      return "x";
    case CubeAxis::kY:
      return "y";
    case CubeAxis::kZ:
      return "z";
  }
  return "?";
}

int CubeRankIndex(const CubeCoord& coord, int p) {
  return (coord.coords[0] * p + coord.coords[1]) * p + coord.coords[2];
}

CubeCoord CubeCoordOf(int rank, int p) {
  CubeCoord c;
  c.coords = {rank / (p * p), (rank / p) % p, rank % p};
  return c;
}

bool CubeDirection::Valid() const {
  auto ok = [](CubeAxis a) { return static_cast<int>(a) >= 0 && static_cast<int>(a) < 3; };
  return ok(input) && ok(weight) && ok(output) && input != weight && input != output &&
         weight != output;
}

std::string CubeDirection::ToString() const {
  return absl::StrCat("in=", CubeAxisName(input), " w=", CubeAxisName(weight),
                      " out=", CubeAxisName(output));
}

absl::Status ValidateCube(int p, const CubeDirection& direction, const char* what) {
  if (p < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": cube edge p = ", p, " must be >= 2 (T = p^3 ranks; use the unsplit layer for 1)"));
  }
  if (!direction.Valid()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": direction ", direction.ToString(),
                                                   " must give the three roles three axes"));
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
