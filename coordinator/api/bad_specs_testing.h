// Malformed job specs shared by the REST and gRPC tests: each must be
// rejected with INVALID_ARGUMENT and a message that names `field`.
#ifndef PIPETRAIN_COORDINATOR_API_BAD_SPECS_TESTING_H_
#define PIPETRAIN_COORDINATOR_API_BAD_SPECS_TESTING_H_

#include <string>
#include <vector>

namespace pipetrain {

struct BadSpec {
  std::string name;   // what is wrong, for test output
  std::string json;   // the JobSpec as JSON
  std::string field;  // a substring the error message must contain
  // Only expressible in JSON (unknown field, wrong type): a proto client
  // cannot send it.
  bool json_only = false;
};

// A valid one-stage spec (2 layers, d_model 16, 10 steps on generated text).
std::string ValidSpecJson();

// The malformed specs.
std::vector<BadSpec> BadSpecs();

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_API_BAD_SPECS_TESTING_H_
