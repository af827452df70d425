// The worker's data-plane TLS (--data-tls-cert, --data-tls-key,
// --data-tls-ca, --data-tls-server-name; docs/operations.md "Security").
//
// Mutual: the worker's port (DataPlane streams from peers, WorkerControl
// from the coordinator, gRPC health) serves its certificate and requires a
// client certificate signed by the CA, and its transports present the same
// certificate to peers and check theirs against the CA. So a process
// without a certificate of the cluster's CA cannot open a connection at
// all, and tensors cross encrypted. The streams' proofs
// (data_plane_auth.h) are still checked inside.
//
// Thread-safe (a value type and a pure function).
#ifndef PIPETRAIN_WORKER_TRANSPORT_DATA_PLANE_TLS_H_
#define PIPETRAIN_WORKER_TRANSPORT_DATA_PLANE_TLS_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace pipetrain {

struct DataPlaneTls {
  // Both null: plaintext.
  std::shared_ptr<grpc::ServerCredentials> server;
  std::shared_ptr<grpc::ChannelCredentials> channel;
  // The name peers' certificates are checked for ("": each peer's host).
  std::string server_name;
  bool enabled() const { return server != nullptr; }
};

// The flags' files read and checked. None given: plaintext. Otherwise all
// of cert, key and ca (the TLS is mutual), and server_name only with them
// (CheckTlsServerName). INVALID_ARGUMENT naming the flag for a missing
// partner or a bad name; the credential builders' errors (unreadable,
// mismatched or expired files) as they name them.
absl::StatusOr<DataPlaneTls> DataPlaneTlsFromFlags(const std::string& cert, const std::string& key,
                                                   const std::string& ca,
                                                   const std::string& server_name);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRANSPORT_DATA_PLANE_TLS_H_
