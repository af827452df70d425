// What the data- and tensor-parallel cluster tests compare a job with
// (testonly): train-local on the same global batch, and the check that a
// finished job's losses, validation loss and exported weights equal it
// within data_parallel_testing.h's tolerance.
#ifndef PIPETRAIN_TESTS_PARALLEL_CLUSTER_TESTING_H_
#define PIPETRAIN_TESTS_PARALLEL_CLUSTER_TESTING_H_

#include <map>
#include <string>
#include <vector>

#include "cli/local_cluster.h"
#include "proto/pipetrain/v1/job.pb.h"

namespace pipetrain {
namespace testing {

struct Reference {
  std::vector<float> losses;
  float val_loss = 0;
  std::map<std::string, std::vector<float>> weights;
};

// train-local on `spec`'s model, data and training (its parallelism
// ignored): every step's loss, the validation loss after the last step,
// and the final weights.
Reference TrainLocally(const v1::JobSpec& spec);

// Submits `spec` to `cluster` and expects it to SUCCEED on data x stages x
// tensor workers with a validation pass after the last step, its losses,
// validation loss and exported weights (spec.output.weights_path) within
// data_parallel_testing.h's tolerance of `ref` (EXPECT/ASSERT).
void ExpectMatchesTrainLocal(LocalCluster* cluster, const v1::JobSpec& spec, const Reference& ref);

}  // namespace testing
}  // namespace pipetrain

#endif  // PIPETRAIN_TESTS_PARALLEL_CLUSTER_TESTING_H_
