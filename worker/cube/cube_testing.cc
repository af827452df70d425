#include "worker/cube/cube_testing.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/annotated_mutex.h"

namespace pipetrain {
namespace {

const char* OpName(int op) {
  static const char* const kNames[] = {"AllGather", "ReduceScatter", "AllReduce", "Broadcast"};
  return kNames[op];
}

std::string RankName(const CubeCoord& c) {
  return absl::StrCat("cube rank (", c.coords[0], ", ", c.coords[1], ", ", c.coords[2], ")");
}

absl::Status CheckSize(const char* op, const char* name, size_t got, int64_t want) {
  if (static_cast<int64_t>(got) != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("CubeComm ", op, ": ", name, " has ", got, " values, expected ", want));
  }
  return absl::OkStatus();
}

}  // namespace

// One axis group's rendezvous. Phases: members arrive (reading false) until
// all p have posted; then reading is true while each reads; the last to
// leave clears it and starts the next round.
struct InProcessCubeFabric::Group {
  AnnotatedMutex mu;
  int64_t round ABSL_GUARDED_BY(mu) = 0;
  int arrived ABSL_GUARDED_BY(mu) = 0;
  int departed ABSL_GUARDED_BY(mu) = 0;
  bool reading ABSL_GUARDED_BY(mu) = false;
  std::vector<Post> posts ABSL_GUARDED_BY(mu);
};

absl::StatusOr<std::unique_ptr<InProcessCubeFabric>> InProcessCubeFabric::Create(
    int p, absl::Duration timeout) {
  if (p < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("InProcessCubeFabric: cube edge p = ", p, " must be >= 2"));
  }
  return std::unique_ptr<InProcessCubeFabric>(new InProcessCubeFabric(p, timeout));
}

InProcessCubeFabric::InProcessCubeFabric(int p, absl::Duration timeout) : p_(p), timeout_(timeout) {
  for (int g = 0; g < 3 * p * p; ++g) {
    groups_.push_back(std::make_unique<Group>());
    AnnotatedMutexLock lock(&groups_.back()->mu);
    groups_.back()->posts.resize(p);
  }
  for (int r = 0; r < p * p * p; ++r) {
    comms_.push_back(
        std::unique_ptr<InProcessCubeComm>(new InProcessCubeComm(this, p, CubeCoordOf(r, p))));
  }
}

InProcessCubeFabric::~InProcessCubeFabric() = default;

InProcessCubeFabric::Group& InProcessCubeFabric::GroupOf(const CubeCoord& coord, CubeAxis axis) {
  const int a = static_cast<int>(axis);
  const int u = coord.coords[(a + 1) % 3], v = coord.coords[(a + 2) % 3];
  return *groups_[(a * p_ + u) * p_ + v];
}

std::vector<absl::Status> InProcessCubeFabric::Run(
    const std::function<absl::Status(InProcessCubeComm&)>& body) {
  const int n = p_ * p_ * p_;
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] { status[r] = body(*comms_[r]); });
  }
  for (std::thread& t : threads) t.join();
  return status;
}

absl::Status InProcessCubeFabric::Exchange(
    const CubeCoord& coord, CubeAxis axis, const Post& mine,
    const std::function<void(const std::vector<Post>&)>& read) {
  Group& g = GroupOf(coord, axis);
  const int member = coord[axis];
  auto timed_out = [&](const char* phase) {
    return absl::DeadlineExceededError(absl::StrCat(
        RankName(coord), ": ", OpName(static_cast<int>(mine.op)), " along ", CubeAxisName(axis),
        " waited ", absl::FormatDuration(timeout_), " for its group to ", phase,
        "; a member did not call it (failed earlier, or ran another collective)"));
  };
  std::vector<Post> posts;
  {
    AnnotatedMutexLock lock(&g.mu);
    // Wait out the previous round's readers, then post.
    if (!g.mu.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g.mu) { return !g.reading; },
                               timeout_)) {
      return timed_out("finish the previous collective");
    }
    g.posts[member] = mine;
    if (++g.arrived == p_) g.reading = true;
    if (!g.mu.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g.mu) { return g.reading; },
                               timeout_)) {
      return timed_out("arrive");
    }
    posts = g.posts;
  }
  // Every member posted the same collective, or none reads.
  absl::Status status;
  for (int m = 0; m < p_ && status.ok(); ++m) {
    const Post& a = posts[m];
    if (a.op != mine.op || a.in_size != mine.in_size || a.out_size != mine.out_size ||
        a.root != mine.root) {
      status = absl::InternalError(absl::StrCat(
          RankName(coord), ": members of its ", CubeAxisName(axis), " group disagree: member ",
          member, " called ", OpName(static_cast<int>(mine.op)), " of ", mine.in_size,
          " values (root ", mine.root, "), member ", m, " ", OpName(static_cast<int>(a.op)), " of ",
          a.in_size, " (root ", a.root, ")"));
    }
  }
  if (status.ok()) read(posts);
  {
    AnnotatedMutexLock lock(&g.mu);
    const int64_t my_round = g.round;
    if (++g.departed == p_) {
      g.arrived = g.departed = 0;
      g.reading = false;
      ++g.round;
    } else if (!g.mu.AwaitWithTimeout(
                   [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g.mu) { return g.round != my_round; },
                   timeout_)) {
      return timed_out("finish reading");
    }
  }
  return status;
}

absl::Status InProcessCubeComm::AllGather(CubeAxis axis, absl::Span<const float> segment,
                                          absl::Span<float> out) {
  const int64_t s = segment.size();
  if (absl::Status st = CheckSize("AllGather", "out", out.size(), p_ * s); !st.ok()) return st;
  InProcessCubeFabric::Post post{InProcessCubeFabric::Op::kAllGather, 0, s, p_ * s, segment.data()};
  absl::Status st = fabric_->Exchange(coord_, axis, post, [&](const auto& posts) {
    for (int m = 0; m < p_; ++m) std::copy(posts[m].in, posts[m].in + s, out.data() + m * s);
  });
  if (st.ok()) sent_bytes_ += int64_t{4} * (p_ - 1) * s;
  return st;
}

absl::Status InProcessCubeComm::ReduceScatter(CubeAxis axis, absl::Span<const float> data,
                                              absl::Span<float> out) {
  const int64_t s = out.size();
  if (absl::Status st = CheckSize("ReduceScatter", "data", data.size(), p_ * s); !st.ok()) {
    return st;
  }
  InProcessCubeFabric::Post post{InProcessCubeFabric::Op::kReduceScatter, 0, p_ * s, s,
                                 data.data()};
  const int64_t begin = coord_[axis] * s;
  absl::Status st = fabric_->Exchange(coord_, axis, post, [&](const auto& posts) {
    std::copy(posts[0].in + begin, posts[0].in + begin + s, out.data());
    for (int m = 1; m < p_; ++m) {
      for (int64_t k = 0; k < s; ++k) out[k] += posts[m].in[begin + k];
    }
  });
  if (st.ok()) sent_bytes_ += int64_t{4} * (p_ - 1) * s;
  return st;
}

absl::Status InProcessCubeComm::AllReduce(CubeAxis axis, absl::Span<float> data) {
  const int64_t n = data.size();
  InProcessCubeFabric::Post post{InProcessCubeFabric::Op::kAllReduce, 0, n, n, data.data()};
  // Summed into a copy while peers read `data`; written back once all have.
  std::vector<float> sum(data.size());
  absl::Status st = fabric_->Exchange(coord_, axis, post, [&](const auto& posts) {
    std::copy(posts[0].in, posts[0].in + n, sum.begin());
    for (int m = 1; m < p_; ++m) {
      for (int64_t k = 0; k < n; ++k) sum[k] += posts[m].in[k];
    }
  });
  if (!st.ok()) return st;
  std::copy(sum.begin(), sum.end(), data.begin());
  const int c = coord_[axis];
  const int64_t own = n / p_ + (c < n % p_ ? 1 : 0);
  sent_bytes_ += int64_t{4} * (n - own + (p_ - 1) * own);
  return st;
}

absl::Status InProcessCubeComm::Broadcast(CubeAxis axis, int root, absl::Span<float> data) {
  if (root < 0 || root >= p_) {
    return absl::InvalidArgumentError(
        absl::StrCat("CubeComm Broadcast: root ", root, " is not a coordinate in [0, ", p_, ")"));
  }
  const int64_t n = data.size();
  const bool is_root = coord_[axis] == root;
  InProcessCubeFabric::Post post{InProcessCubeFabric::Op::kBroadcast, root, n, n, data.data()};
  std::vector<float> copy;
  absl::Status st = fabric_->Exchange(coord_, axis, post, [&](const auto& posts) {
    if (!is_root) copy.assign(posts[root].in, posts[root].in + n);
  });
  if (!st.ok()) return st;
  if (is_root) {
    sent_bytes_ += int64_t{4} * (p_ - 1) * n;
  } else {
    std::copy(copy.begin(), copy.end(), data.begin());
  }
  return st;
}

}  // namespace pipetrain
