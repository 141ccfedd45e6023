//! Kubernetes clients from the command line: a kubeconfig file, the in-cluster configuration of a pod, or no
//! cluster at all (`--target-kubeconfig none`), each with the client-side request rate limit of `--kube-api-qps`
//! and `--kube-api-burst`, as the reference's clients have, and client-go's REST client metrics.

use std::{path::Path, time::Duration};

use anyhow::Context;

/// The literal the reference accepts for "the pod's service account" (an empty flag means the same).
pub(crate) const IN_CLUSTER: &str = "inClusterConfig";

/// Where a cluster is: a kubeconfig path, the in-cluster configuration, or none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// A kubeconfig file.
    Kubeconfig(std::path::PathBuf),
    /// The service account of the pod (`KUBERNETES_SERVICE_HOST` and the mounted token).
    InCluster,
    /// No cluster (`--target-kubeconfig none`).
    None,
}

impl Source {
    /// Reads a kubeconfig flag: `none`, `inClusterConfig` or empty (in-cluster), else a path.
    pub(crate) fn from_flag(value: &str) -> Self {
        match value {
            "none" => Self::None,
            "" | IN_CLUSTER => Self::InCluster,
            path => Self::Kubeconfig(path.into()),
        }
    }
}

/// The reference's `--control-kubeconfig` / `--target-kubeconfig` rules: the control cluster defaults to the target
/// cluster, the target defaults to the control cluster, and with neither (or `none` for the target and no control)
/// the pod's in-cluster configuration is the control cluster. Returns (control, target); the control cluster cannot
/// be `none`.
pub(crate) fn resolve(control: Option<&str>, target: Option<&str>) -> anyhow::Result<(Source, Source)> {
    let target = target.map(Source::from_flag);
    let control = match (control.map(Source::from_flag), &target) {
        (Some(Source::None), _) => anyhow::bail!(
            "--control-kubeconfig none: the machines live on the control cluster, it cannot be none (only \
             --target-kubeconfig can)"
        ),
        (None, Some(Source::None) | None) => Source::InCluster,
        (Some(control), _) => control,
        (None, Some(target)) => target.clone(),
    };
    let target = target.unwrap_or_else(|| control.clone());
    Ok((control, target))
}

/// The client-side request rate limit (`--kube-api-qps`, `--kube-api-burst`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RateLimit {
    /// Requests per second on average; 0 turns the limit off.
    pub(crate) qps: f32,
    /// Requests allowed at once above the average.
    pub(crate) burst: u32,
}

impl RateLimit {
    /// The limit as a tower window: `burst` requests per `burst / qps` seconds, so the average is `qps` and no more
    /// than `burst` go out back to back. `None` when off.
    fn window(self) -> Option<(u64, Duration)> {
        if self.qps <= 0.0 {
            return None;
        }
        let burst = self.burst.max(1);
        Some((
            u64::from(burst),
            Duration::from_secs_f64(f64::from(burst) / f64::from(self.qps)),
        ))
    }
}

/// A client for `source` with `limit`; `None` for [`Source::None`].
pub(crate) async fn connect(source: &Source, limit: RateLimit) -> anyhow::Result<Option<kube::Client>> {
    let config = match source {
        Source::None => return Ok(None),
        Source::InCluster => kube::Config::incluster().context(
            "no kubeconfig given (--control-kubeconfig / --target-kubeconfig) and not running in a pod: the \
             in-cluster configuration needs KUBERNETES_SERVICE_HOST and the service account token",
        )?,
        Source::Kubeconfig(path) => config_from(path).await?,
    };
    // client-go's REST client metrics (`rest_client_*`) count every request, outermost so that the rate limit's wait
    // is part of the latency, as in client-go.
    let metered = mcm_controllers::metrics::RestMetricsLayer::new(&config.cluster_url);
    let builder = kube::client::ClientBuilder::try_from(without_client_retries(config))
        .context("building the client")?;
    Ok(Some(match limit.window() {
        Some((requests, per)) => builder
            .with_layer(&tower::limit::RateLimitLayer::new(requests, per))
            .with_layer(&metered)
            .build(),
        None => builder.with_layer(&metered).build(),
    }))
}

async fn config_from(path: &Path) -> anyhow::Result<kube::Config> {
    let file =
        kube::config::Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
        .await
        .with_context(|| format!("using {}", path.display()))
}

/// The controllers handle 429, 503 and 504 themselves (requeue with back-off; the drain retries refused evictions
/// on its own period and must see a `force-deletion` label meanwhile), so kube's built-in retry, which would block a
/// PDB-refused eviction inside the client for minutes, is off (docs/pitfalls.md).
fn without_client_retries(mut config: kube::Config) -> kube::Config {
    config.default_retry = false;
    config
}

/// A client for a kubeconfig file, without a rate limit (the provider and agent commands).
pub(crate) async fn from_kubeconfig(path: &Path) -> anyhow::Result<kube::Client> {
    let unlimited = RateLimit { qps: 0.0, burst: 0 };
    connect(&Source::Kubeconfig(path.to_owned()), unlimited)
        .await?
        .context("a kubeconfig is a cluster")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(p: &str) -> Source {
        Source::Kubeconfig(p.into())
    }

    #[test]
    fn the_control_cluster_defaults_to_the_target_and_the_target_to_the_control() {
        assert_eq!(resolve(Some("c"), None).unwrap(), (path("c"), path("c")));
        assert_eq!(resolve(None, Some("t")).unwrap(), (path("t"), path("t")));
        assert_eq!(resolve(Some("c"), Some("t")).unwrap(), (path("c"), path("t")));
    }

    #[test]
    fn without_a_kubeconfig_the_pod_configuration_is_used() {
        assert_eq!(
            resolve(None, None).unwrap(),
            (Source::InCluster, Source::InCluster)
        );
        assert_eq!(
            resolve(Some(""), None).unwrap(),
            (Source::InCluster, Source::InCluster)
        );
        assert_eq!(
            resolve(Some(IN_CLUSTER), Some("t")).unwrap(),
            (Source::InCluster, path("t"))
        );
    }

    #[test]
    fn target_none_turns_the_target_cluster_off_but_never_the_control_cluster() {
        assert_eq!(
            resolve(Some("c"), Some("none")).unwrap(),
            (path("c"), Source::None)
        );
        assert_eq!(
            resolve(None, Some("none")).unwrap(),
            (Source::InCluster, Source::None)
        );
        let err = resolve(Some("none"), Some("t")).unwrap_err().to_string();
        assert!(err.contains("--control-kubeconfig"), "{err}");
    }

    #[test]
    fn the_rate_limit_averages_qps_with_bursts_of_burst() {
        let (requests, per) = RateLimit { qps: 20.0, burst: 30 }.window().unwrap();
        assert_eq!(requests, 30);
        assert_eq!(per, Duration::from_millis(1500));
        assert_eq!(RateLimit { qps: 0.0, burst: 30 }.window(), None);
        assert_eq!(
            RateLimit { qps: 5.0, burst: 0 }.window(),
            Some((1, Duration::from_millis(200)))
        );
    }
}
