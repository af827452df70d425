#include "worker/transport/data_plane_tls.h"

#include "common/status_macros.h"
#include "common/tls_credentials.h"

namespace pipetrain {

absl::StatusOr<DataPlaneTls> DataPlaneTlsFromFlags(const std::string& cert, const std::string& key,
                                                   const std::string& ca,
                                                   const std::string& server_name) {
  DataPlaneTls tls;
  ASSIGN_OR_RETURN(
      const bool on,
      CheckMutualTlsFlags({{"data-tls-cert", cert}, {"data-tls-key", key}, {"data-tls-ca", ca}},
                          "data-tls-server-name", server_name, "the peers'",
                          "the data plane's TLS is mutual (each worker serves its "
                          "certificate and presents it to its peers, and the CA "
                          "checks both ways)"));
  if (!on) return tls;
  ASSIGN_OR_RETURN(
      tls.server,
      ServerTlsCredentials(cert, key, ca, {"data-tls-cert", "data-tls-key", "data-tls-ca"}));
  ASSIGN_OR_RETURN(tls.channel, ClientTlsCredentials(ca, cert, key,
                                                     {"data-tls-ca", "data-tls-cert",
                                                      "data-tls-key", "the peers' data planes"}));
  tls.server_name = server_name;
  return tls;
}

}  // namespace pipetrain
