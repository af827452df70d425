#include "common/metrics/tls_expiry_metric.h"

#include "prometheus/gauge.h"

namespace pipetrain {

void AddTlsCertificateExpiry(prometheus::Registry& registry,
                             const std::vector<TlsCertificateExpiry>& certificates) {
  if (certificates.empty()) return;
  auto& family =
      prometheus::BuildGauge()
          .Name("pipetrain_tls_certificate_expiry_timestamp_seconds")
          .Help(
              "When the TLS file given to --<flag> stops working (Unix seconds): its "
              "certificate's notAfter, or for a CA file the first of its certificates to "
              "expire. Files are read at start: restart after replacing them")
          .Register(registry);
  for (const TlsCertificateExpiry& c : certificates) {
    family.Add({{"flag", c.flag}}).Set(absl::ToDoubleSeconds(c.not_after - absl::UnixEpoch()));
  }
}

}  // namespace pipetrain
