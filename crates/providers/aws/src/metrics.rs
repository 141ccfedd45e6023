//! The reference's provider-side metrics of cloud API calls: `mcm_cloud_api_requests_total`,
//! `mcm_cloud_api_requests_failed_total` and `mcm_cloud_api_api_request_duration_seconds`, labelled by
//! `provider` (`aws`) and `service` (`ec2`, `sts`). One observation per HTTP request to AWS (retries included).

use std::time::Duration;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

/// The labels of the cloud API metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabels {
    /// Always `aws`.
    pub provider: String,
    /// The AWS service called (`ec2`, `sts`, `iam`).
    pub service: String,
}

fn histogram() -> Histogram {
    Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
}

/// The metrics and their registry (prefix `mcm`).
#[derive(Debug)]
pub struct CloudApiMetrics {
    registry: Registry,
    requests: Family<ApiLabels, Counter>,
    failed: Family<ApiLabels, Counter>,
    duration: Family<ApiLabels, Histogram, fn() -> Histogram>,
}

impl Default for CloudApiMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("mcm");
        let requests = Family::<ApiLabels, Counter>::default();
        let failed = Family::<ApiLabels, Counter>::default();
        let duration: Family<ApiLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(histogram);
        registry.register(
            "cloud_api_requests",
            "Requests made to the cloud provider's API",
            requests.clone(),
        );
        registry.register(
            "cloud_api_requests_failed",
            "Requests to the cloud provider's API that failed",
            failed.clone(),
        );
        registry.register(
            "cloud_api_api_request_duration_seconds",
            "Duration of requests to the cloud provider's API",
            duration.clone(),
        );
        Self {
            registry,
            requests,
            failed,
            duration,
        }
    }
}

impl CloudApiMetrics {
    /// Records one request to `service` that took `took`.
    pub fn observe(&self, service: &str, took: Duration, failed: bool) {
        let labels = ApiLabels {
            provider: "aws".into(),
            service: service.into(),
        };
        self.requests.get_or_create(&labels).inc();
        if failed {
            self.failed.get_or_create(&labels).inc();
        }
        self.duration.get_or_create(&labels).observe(took.as_secs_f64());
    }

    /// Writes the families into `out` without the closing `# EOF`, to be served among another registry's (the
    /// controllers' `/metrics` when the provider runs in their process).
    ///
    /// # Errors
    /// Only those of writing into `out`.
    pub fn encode_families(&self, out: &mut String) -> std::fmt::Result {
        prometheus_client::encoding::text::encode_registry(out, &self.registry)
    }

    /// The OpenMetrics text of the metrics.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
