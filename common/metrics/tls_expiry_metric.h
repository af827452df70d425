// pipetrain_tls_certificate_expiry_timestamp_seconds{flag}: when each TLS
// file a process was started with stops working (TlsCertificateExpiries),
// so that an alert fires weeks before a certificate expires, rather than
// new connections failing with "certificate verify failed" after.
#ifndef PIPETRAIN_COMMON_METRICS_TLS_EXPIRY_METRIC_H_
#define PIPETRAIN_COMMON_METRICS_TLS_EXPIRY_METRIC_H_

#include <vector>

#include "common/tls_credentials.h"
#include "prometheus/registry.h"

namespace pipetrain {

// Registers the gauge in `registry` with one series per entry (none when
// `certificates` is empty: a process without TLS). Call once per registry.
void AddTlsCertificateExpiry(prometheus::Registry& registry,
                             const std::vector<TlsCertificateExpiry>& certificates);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_METRICS_TLS_EXPIRY_METRIC_H_
