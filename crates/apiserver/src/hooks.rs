//! Test hooks, off by default: delaying the delivery of watch events (to test controllers against a lagging
//! cache) and failing a share of requests with a chosen status (to test retries). They can be set at start
//! (`mcm apiserver --test-watch-delay`, `--test-fail-share`, ...) and changed at run time by tests in the same
//! process through [`crate::ApiServer::hooks`].

use std::{
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use crate::error::ApiError;

/// Requests to fail on purpose.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    /// Share of matching requests to fail, from 0 to 1.
    pub share: f64,
    /// HTTP status to answer (429, 500, 503, 504, ...).
    pub status: u16,
    /// Fail only writes (POST, PUT, PATCH, DELETE), never reads.
    pub writes_only: bool,
}

/// The hooks of one server.
#[derive(Debug, Default)]
pub struct Hooks {
    watch_delay_millis: AtomicU64,
    failure: Mutex<Option<Failure>>,
}

impl Hooks {
    /// Delays every live watch event by this much after its commit (0 turns it off).
    pub fn set_watch_delay(&self, delay: Duration) {
        self.watch_delay_millis.store(
            u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// The current watch delay.
    pub fn watch_delay(&self) -> Duration {
        Duration::from_millis(self.watch_delay_millis.load(Ordering::Relaxed))
    }

    /// Fails a share of requests from now on (None turns it off).
    pub fn set_failure(&self, failure: Option<Failure>) {
        *self
            .failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = failure;
    }

    /// The injected failure for a request with this method, when the dice say so.
    pub fn injected_failure(&self, method: &http::Method) -> Option<ApiError> {
        let failure = self
            .failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()?;
        let write = !matches!(
            *method,
            http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
        );
        if (failure.writes_only && !write) || rand::random::<f64>() >= failure.share {
            return None;
        }
        Some(ApiError::Injected(
            failure.status,
            format!("injected failure (test hook): status {}", failure.status),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_follow_the_share_and_the_verb_filter() {
        let hooks = Hooks::default();
        assert!(
            hooks.injected_failure(&http::Method::POST).is_none(),
            "off by default"
        );
        hooks.set_failure(Some(Failure {
            share: 1.0,
            status: 503,
            writes_only: true,
        }));
        let err = hooks
            .injected_failure(&http::Method::POST)
            .expect("a write fails");
        assert_eq!(err.code().as_u16(), 503);
        assert!(hooks.injected_failure(&http::Method::GET).is_none(), "reads pass");
        hooks.set_failure(Some(Failure {
            share: 0.0,
            status: 500,
            writes_only: false,
        }));
        assert!(hooks.injected_failure(&http::Method::POST).is_none());
    }
}
