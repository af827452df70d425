// The Store contract (store.h) as a value-parameterized test suite that a
// backend's test instantiates with a factory of fresh, empty stores:
//
//   INSTANTIATE_TEST_SUITE_P(Etcd, StoreContractTest,
//                            ::testing::Values(StoreBackend{"Etcd", OpenEtcd}),
//                            StoreBackendName);
//
// The cases are in store_contract_testing.cc; store_test.cc runs them on
// MemoryStore and SqliteStore.
#ifndef PIPETRAIN_COORDINATOR_STORE_STORE_CONTRACT_TESTING_H_
#define PIPETRAIN_COORDINATOR_STORE_STORE_CONTRACT_TESTING_H_

#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/store/store.h"
#include "gtest/gtest.h"

namespace pipetrain {

struct StoreBackend {
  std::string name;
  // A new store holding no keys, each call.
  std::function<absl::StatusOr<std::unique_ptr<Store>>()> open;
};

// Failure messages name the backend rather than dumping its bytes.
void PrintTo(const StoreBackend& backend, std::ostream* os);
std::string StoreBackendName(const ::testing::TestParamInfo<StoreBackend>& info);

class StoreContractTest : public ::testing::TestWithParam<StoreBackend> {
 public:
  using KeyValues = std::vector<std::pair<std::string, std::string>>;

 protected:
  void SetUp() override;

  void MustCommit(const std::vector<StoreWrite>& writes);
  std::optional<std::string> MustGet(const std::string& key);
  KeyValues MustScan(const std::string& prefix);
  std::vector<std::string> Keys(const std::string& prefix);
  // Puts each key with its own name as the value.
  void PutAll(const std::vector<std::string>& keys);

  std::unique_ptr<Store> store_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_STORE_STORE_CONTRACT_TESTING_H_
