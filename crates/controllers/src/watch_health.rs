//! Whether a watch keeps failing, for `/readyz`, and a log line per failure that never carries a response body.
//!
//! kube-runtime's watchers retry on their own (with back-off) and report each failure as an item of their stream;
//! without a look at those items a watch that fails for ever (an object the client cannot decode, a permission
//! taken away) leaves the controller idle while `/readyz` says ready. [`WatchHealth::observe`] sees every item:
//! after [`WatchHealth::FAILING_AFTER`] failures in a row the watch's readiness check fails, naming the kind and the
//! error's class, until the watch delivers again.

use std::sync::{Arc, Mutex, PoisonError};

use kube::runtime::watcher;

#[derive(Debug, Default)]
struct State {
    failures_in_a_row: u32,
    last_error: String,
}

/// The health of one watch (cheap to clone; clones share the state).
#[derive(Clone, Debug)]
pub struct WatchHealth {
    kind: &'static str,
    state: Arc<Mutex<State>>,
}

impl WatchHealth {
    /// Failures in a row after which the watch counts as failing (with kube's default back-off, a few seconds).
    pub const FAILING_AFTER: u32 = 3;

    /// The health of a watch of `kind` (e.g. `Secret`), healthy until it fails.
    pub fn new(kind: &'static str) -> Self {
        Self {
            kind,
            state: Arc::default(),
        }
    }

    /// Notes one item of the watch stream: a delivery resets the count, a failure is counted and logged (the kind
    /// and the error's class, never a body). `Init` is neither: the watcher emits it before each list attempt, also
    /// before one that fails.
    pub fn observe<K>(&self, item: &Result<watcher::Event<K>, watcher::Error>) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match item {
            Ok(watcher::Event::Init) => {}
            Ok(_) => {
                if state.failures_in_a_row >= Self::FAILING_AFTER {
                    tracing::info!(kind = self.kind, "watch delivers again");
                }
                state.failures_in_a_row = 0;
            }
            Err(err) => {
                state.failures_in_a_row = state.failures_in_a_row.saturating_add(1);
                state.last_error = describe(err);
                tracing::warn!(kind = self.kind, failures_in_a_row = state.failures_in_a_row,
                    error = %state.last_error, "watch failed; retrying");
            }
        }
    }

    /// The readiness check: `Err` with the kind, the count and the error's class while the watch keeps failing.
    pub fn check(&self) -> Result<(), String> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.failures_in_a_row >= Self::FAILING_AFTER {
            Err(format!(
                "the {} watch failed {} times in a row: {}",
                self.kind, state.failures_in_a_row, state.last_error
            ))
        } else {
            Ok(())
        }
    }

    /// Adds the check to `/readyz` as `watch-<kind>` (lower case).
    pub fn register(&self, metrics: Option<&crate::metrics::Metrics>) {
        if let Some(metrics) = metrics {
            let health = self.clone();
            metrics.add_readiness_check(&format!("watch-{}", self.kind.to_lowercase()), move || {
                health.check()
            });
        }
    }
}

/// A watch error as a log line or readiness reason may show it: what failed and the error's class. kube's errors
/// for undecodable responses carry serde's text, which can quote a value; only its class is kept.
pub fn describe(err: &watcher::Error) -> String {
    let (what, source) = match err {
        watcher::Error::InitialListFailed(e) => ("the list", e),
        watcher::Error::WatchStartFailed(e) => ("starting the watch", e),
        watcher::Error::WatchFailed(e) => ("the watch stream", e),
        watcher::Error::WatchError(status) => {
            return format!(
                "the API server ended the watch: {} {}",
                status.code, status.reason
            );
        }
        watcher::Error::NoResourceVersion => return "no resourceVersion in a watch result".to_owned(),
    };
    format!("{what} failed: {}", describe_client_error(source))
}

/// A client error without anything of a response body.
pub fn describe_client_error(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => format!("the API server answered {} {}", status.code, status.reason),
        kube::Error::SerdeError(e) => format!(
            "a response could not be decoded ({}; body withheld: it may hold secrets)",
            crate::secrets::class_of(e)
        ),
        kube::Error::FromUtf8(_) => "a response was not UTF-8 (body withheld)".to_owned(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serde_error() -> watcher::Error {
        let err = serde_json::from_str::<k8s_openapi::api::core::v1::Secret>(
            r#"{"metadata":{"name":"x"},"data":{"k":"AKIA-plain-text"}}"#,
        )
        .unwrap_err();
        watcher::Error::InitialListFailed(kube::Error::SerdeError(err))
    }

    #[test]
    fn a_watch_fails_readiness_after_failures_in_a_row_and_recovers() {
        let health = WatchHealth::new("Secret");
        assert_eq!(health.check(), Ok(()));
        for _ in 0..WatchHealth::FAILING_AFTER - 1 {
            health.observe::<()>(&Err(serde_error()));
        }
        assert_eq!(health.check(), Ok(()), "a failure or two is a hiccup");
        health.observe::<()>(&Err(serde_error()));
        let reason = health.check().unwrap_err();
        assert!(
            reason.starts_with(
                "the Secret watch failed 3 times in a row: the list failed: a response could not"
            ),
            "{reason}"
        );
        assert!(!reason.contains("AKIA"), "{reason}");
        health.observe::<()>(&Ok(watcher::Event::Init));
        assert!(health.check().is_err(), "a new list attempt is not a delivery");
        health.observe::<()>(&Ok(watcher::Event::InitDone));
        assert_eq!(health.check(), Ok(()));
    }

    #[test]
    fn registered_checks_show_in_readyz() {
        let metrics = crate::metrics::Metrics::new();
        let health = WatchHealth::new("Node");
        health.register(Some(&metrics));
        for _ in 0..WatchHealth::FAILING_AFTER {
            health.observe::<()>(&Err(serde_error()));
        }
        let (ready, text) = metrics.readiness();
        assert!(!ready);
        assert!(
            text.contains("[-]watch-node failed: the Node watch failed 3 times"),
            "{text}"
        );
    }
}
