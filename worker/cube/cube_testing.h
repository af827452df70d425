// An in-process CubeComm for tests: the p^3 ranks of a cube are threads of
// one process exchanging through shared memory.
//
// Each axis group (3 p^2 of them) has a rendezvous: a member posts a
// pointer to its input and waits until all p members have posted; each
// then computes its own result by reading the others' inputs (sums as a
// left fold in coordinate order, x_0 + x_1 + ... + x_{p-1}, so every member
// gets bitwise the same value and every run the same bits), and waits
// again until all have read before it returns (so no input changes while a
// peer reads it). Waits are on a condition, never sleeps; a wait longer
// than the fabric's timeout is DEADLINE_EXCEEDED naming the rank, axis and
// collective. Members that post different collectives (kind, size, root)
// all get INTERNAL naming both.
//
// Bytes sent are counted as a direct exchange would send them, which is
// also the ring's volume: AllGather of s floats per member (p - 1) s;
// ReduceScatter to s floats per member (p - 1) s; AllReduce of n floats
// n - n_c + (p - 1) n_c, n_c = member c's segment (n / p, the first n % p
// one longer), i.e. 2 (p - 1) n / p when p divides n; Broadcast of n
// floats (p - 1) n from the root (a star), 0 from the others.
//
// InProcessCubeFabric is thread-safe; each InProcessCubeComm must be used
// by one thread at a time.
#ifndef PIPETRAIN_WORKER_CUBE_CUBE_TESTING_H_
#define PIPETRAIN_WORKER_CUBE_CUBE_TESTING_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/cube/cube_comm.h"

namespace pipetrain {

class InProcessCubeFabric;

class InProcessCubeComm : public CubeComm {
 public:
  int p() const override { return p_; }
  CubeCoord coord() const override { return coord_; }
  absl::Status AllGather(CubeAxis axis, absl::Span<const float> segment,
                         absl::Span<float> out) override;
  absl::Status ReduceScatter(CubeAxis axis, absl::Span<const float> data,
                             absl::Span<float> out) override;
  absl::Status AllReduce(CubeAxis axis, absl::Span<float> data) override;
  absl::Status Broadcast(CubeAxis axis, int root, absl::Span<float> data) override;

  // Bytes this rank has sent (model above) since construction or Reset.
  int64_t sent_bytes() const { return sent_bytes_; }
  void ResetSentBytes() { sent_bytes_ = 0; }

 private:
  friend class InProcessCubeFabric;
  InProcessCubeComm(InProcessCubeFabric* fabric, int p, CubeCoord coord)
      : fabric_(fabric), p_(p), coord_(coord) {}

  InProcessCubeFabric* const fabric_;
  const int p_;
  const CubeCoord coord_;
  int64_t sent_bytes_ = 0;
};

class InProcessCubeFabric {
 public:
  // INVALID_ARGUMENT when p < 2.
  static absl::StatusOr<std::unique_ptr<InProcessCubeFabric>> Create(
      int p, absl::Duration timeout = absl::Seconds(60));
  ~InProcessCubeFabric();

  int p() const { return p_; }
  // Rank r's comm (0 <= r < p^3, r = CubeRankIndex), owned by the fabric.
  InProcessCubeComm& comm(int rank) { return *comms_[rank]; }

  // Runs body(comm(r)) on one thread per rank and returns each rank's
  // status, indexed by rank.
  std::vector<absl::Status> Run(const std::function<absl::Status(InProcessCubeComm&)>& body);

 private:
  friend class InProcessCubeComm;
  struct Group;
  enum class Op { kAllGather, kReduceScatter, kAllReduce, kBroadcast };
  struct Post {
    Op op = Op::kAllGather;
    int root = 0;
    int64_t in_size = 0, out_size = 0;
    const float* in = nullptr;
  };
  // The rendezvous: posts `mine` to this rank's group along `axis`, runs
  // read(posts) once every member has posted, then waits until every
  // member has read. `read` must only read peers' inputs and write this
  // rank's own memory.
  absl::Status Exchange(const CubeCoord& coord, CubeAxis axis, const Post& mine,
                        const std::function<void(const std::vector<Post>&)>& read);

  InProcessCubeFabric(int p, absl::Duration timeout);
  Group& GroupOf(const CubeCoord& coord, CubeAxis axis);

  const int p_;
  const absl::Duration timeout_;
  std::vector<std::unique_ptr<Group>> groups_;  // [axis][the other two coords]
  std::vector<std::unique_ptr<InProcessCubeComm>> comms_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_CUBE_CUBE_TESTING_H_
