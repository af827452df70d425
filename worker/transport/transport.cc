#include "worker/transport/transport.h"

#include <tuple>

#include "absl/strings/str_cat.h"

namespace pipetrain {

std::string TensorAddress::DebugString() const {
  return absl::StrCat(v1::TensorKind_Name(kind), " of unit ", unit, ", micro-batch ",
                      micro_batch, ", iteration ", iteration, " (job ", job_id, ")");
}

bool TensorAddress::operator<(const TensorAddress& o) const {
  return std::tie(job_id, iteration, kind, micro_batch, unit) <
         std::tie(o.job_id, o.iteration, o.kind, o.micro_batch, o.unit);
}

bool TensorAddress::operator==(const TensorAddress& o) const {
  return std::tie(job_id, iteration, kind, micro_batch, unit) ==
         std::tie(o.job_id, o.iteration, o.kind, o.micro_batch, o.unit);
}

TensorAddress MakeAddress(const std::string& job_id, int64_t iteration,
                          const v1::TensorKey& key) {
  return {job_id, iteration, key.kind(), key.micro_batch(), key.unit()};
}

}  // namespace pipetrain
