// CubeComm over worker/collectives Collectives: one Collectives object per
// axis group of this rank (three in all, members in coordinate order), on
// any Transport (the gRPC data plane between workers, the in-process one in
// tests).
//
// Each call maps onto the Collectives call of the same name; equal
// segments (CubeComm's contract) make SegmentBounds' segment c the member
// with coordinate c's. Sums follow Collectives' ring / recursive-doubling
// order, fixed by the members and the size: every member of a group gets
// bitwise the same values, and with p = 2 (one addition per element) the
// same bits as the in-process comm's left fold. Two ranks share at most one
// axis group, so the three objects never exchange messages between the same
// pair of stages; each collective gets its own tag (a per-axis counter, the
// same on every member because they run the same sequence), under the
// iteration given by SetIteration. Errors are Collectives': DEADLINE_EXCEEDED
// when a member does not answer in options.timeout, the transport's
// otherwise; INVALID_ARGUMENT for sizes that break CubeComm's contract.
// Not thread-safe: one collective at a time.
#ifndef PIPETRAIN_WORKER_CUBE_CUBE_COMM_COLLECTIVES_H_
#define PIPETRAIN_WORKER_CUBE_CUBE_COMM_COLLECTIVES_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/collectives/collectives.h"
#include "worker/cube/cube_comm.h"
#include "worker/transport/transport.h"

namespace pipetrain {

class CollectivesCubeComm : public CubeComm {
 public:
  // `stages[r]`: the transport stage of cube rank r (CubeRankIndex), p^3 of
  // them; this transport's stage must be one of them. status() is
  // INVALID_ARGUMENT when p < 2, stages has another size, or this stage is
  // not (or more than once) in it. `transport` must outlive this.
  CollectivesCubeComm(Transport* transport, int p, const std::vector<int>& stages,
                      const std::string& job_id, CollectiveOptions options = {});

  absl::Status status() const { return status_; }
  // The data-plane iteration the next collectives belong to; restarts the
  // tags at `tag_base` (>= 0; a caller whose other collectives share the
  // transport keeps this comm's tags apart from theirs).
  void SetIteration(int64_t iteration, int tag_base = 0);
  // Bytes this rank has sent, over all three groups.
  int64_t sent_bytes() const;
  // Collectives run so far, and the seconds spent in them.
  int64_t collectives() const { return collectives_; }
  double seconds() const { return seconds_; }

  int p() const override { return p_; }
  CubeCoord coord() const override { return coord_; }
  absl::Status AllGather(CubeAxis axis, absl::Span<const float> segment,
                         absl::Span<float> out) override;
  absl::Status ReduceScatter(CubeAxis axis, absl::Span<const float> data,
                             absl::Span<float> out) override;
  absl::Status AllReduce(CubeAxis axis, absl::Span<float> data) override;
  absl::Status Broadcast(CubeAxis axis, int root, absl::Span<float> data) override;

 private:
  // The group's Collectives and the next tag on `axis`.
  Collectives& Group(CubeAxis axis) { return *groups_[static_cast<int>(axis)]; }
  int NextTag(CubeAxis axis) {
    ++collectives_;
    return tag_base_ + tags_[static_cast<int>(axis)]++;
  }
  // Adds the seconds since `start` (MonotonicClock) to seconds_.
  void Done(absl::Time start);

  const int p_;
  CubeCoord coord_;
  absl::Status status_;
  int64_t iteration_ = 0;
  int tag_base_ = 0;
  std::array<int, 3> tags_ = {0, 0, 0};
  int64_t collectives_ = 0;
  double seconds_ = 0;
  std::array<std::unique_ptr<Collectives>, 3> groups_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_CUBE_CUBE_COMM_COLLECTIVES_H_
