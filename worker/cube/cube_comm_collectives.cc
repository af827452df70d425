#include "worker/cube/cube_comm_collectives.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

Tensor FromSpan(absl::Span<const float> values) {
  Tensor t = Tensor::Uninitialized({static_cast<int64_t>(values.size())});
  if (!values.empty()) std::memcpy(t.data(), values.data(), values.size() * sizeof(float));
  return t;
}

void ToSpan(const Tensor& t, absl::Span<float> out) {
  if (!out.empty()) std::memcpy(out.data(), t.data(), out.size() * sizeof(float));
}

absl::Status CheckSize(const char* op, const char* name, size_t got, int64_t want) {
  if (static_cast<int64_t>(got) != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("CubeComm ", op, ": ", name, " has ", got, " values, expected ", want));
  }
  return absl::OkStatus();
}

}  // namespace

CollectivesCubeComm::CollectivesCubeComm(Transport* transport, int p,
                                         const std::vector<int>& stages, const std::string& job_id,
                                         CollectiveOptions options)
    : p_(p) {
  status_ = ValidateCube(p, CubeDirection{}, "CollectivesCubeComm");
  if (!status_.ok()) return;
  const int n = p * p * p;
  if (static_cast<int>(stages.size()) != n) {
    status_ = absl::InvalidArgumentError(absl::StrCat("CollectivesCubeComm: ", stages.size(),
                                                      " stages for a cube of p^3 = ", n, " ranks"));
    return;
  }
  const int64_t found = std::count(stages.begin(), stages.end(), transport->stage());
  if (found != 1) {
    status_ = absl::InvalidArgumentError(absl::StrCat("CollectivesCubeComm: stage ",
                                                      transport->stage(), " appears ", found,
                                                      " times in the cube's stages, not once"));
    return;
  }
  coord_ =
      CubeCoordOf(static_cast<int>(std::find(stages.begin(), stages.end(), transport->stage()) -
                                   stages.begin()),
                  p);
  for (CubeAxis axis : {CubeAxis::kX, CubeAxis::kY, CubeAxis::kZ}) {
    CollectiveGroup group{{}, job_id};
    for (int m = 0; m < p; ++m) {
      CubeCoord member = coord_;
      member[axis] = m;
      group.members.push_back(stages[CubeRankIndex(member, p)]);
    }
    auto collectives = std::make_unique<Collectives>(transport, group, options);
    if (status_.ok()) status_ = collectives->status();
    groups_[static_cast<int>(axis)] = std::move(collectives);
  }
}

void CollectivesCubeComm::SetIteration(int64_t iteration, int tag_base) {
  iteration_ = iteration;
  tag_base_ = tag_base;
  tags_ = {0, 0, 0};
}

int64_t CollectivesCubeComm::sent_bytes() const {
  int64_t total = 0;
  for (const auto& g : groups_) total += g ? g->sent_bytes() : 0;
  return total;
}

void CollectivesCubeComm::Done(absl::Time start) {
  // On the monotonic clock: a step of the wall clock must not make it
  // negative (or add the step).
  seconds_ += absl::ToDoubleSeconds(MonotonicClock()->Now() - start);
}

absl::Status CollectivesCubeComm::AllGather(CubeAxis axis, absl::Span<const float> segment,
                                            absl::Span<float> out) {
  RETURN_IF_ERROR(status_);
  const absl::Time start = MonotonicClock()->Now();
  RETURN_IF_ERROR(CheckSize("AllGather", "out", out.size(), p_ * int64_t(segment.size())));
  ASSIGN_OR_RETURN(const Tensor all,
                   Group(axis).AllGather(iteration_, NextTag(axis), FromSpan(segment), out.size()));
  ToSpan(all, out);
  Done(start);
  return absl::OkStatus();
}

absl::Status CollectivesCubeComm::ReduceScatter(CubeAxis axis, absl::Span<const float> data,
                                                absl::Span<float> out) {
  RETURN_IF_ERROR(status_);
  const absl::Time start = MonotonicClock()->Now();
  RETURN_IF_ERROR(CheckSize("ReduceScatter", "data", data.size(), p_ * int64_t(out.size())));
  ASSIGN_OR_RETURN(const Tensor mine,
                   Group(axis).ReduceScatter(iteration_, NextTag(axis), FromSpan(data)));
  ToSpan(mine, out);
  Done(start);
  return absl::OkStatus();
}

absl::Status CollectivesCubeComm::AllReduce(CubeAxis axis, absl::Span<float> data) {
  RETURN_IF_ERROR(status_);
  const absl::Time start = MonotonicClock()->Now();
  Tensor t = FromSpan(data);
  RETURN_IF_ERROR(Group(axis).AllReduce(iteration_, NextTag(axis), t));
  ToSpan(t, data);
  Done(start);
  return absl::OkStatus();
}

absl::Status CollectivesCubeComm::Broadcast(CubeAxis axis, int root, absl::Span<float> data) {
  RETURN_IF_ERROR(status_);
  const absl::Time start = MonotonicClock()->Now();
  Tensor t = FromSpan(data);
  RETURN_IF_ERROR(Group(axis).Broadcast(iteration_, NextTag(axis), root, t));
  ToSpan(t, data);
  Done(start);
  return absl::OkStatus();
}

}  // namespace pipetrain
