//! Spacing of the full passes over one MachineDeployment, whose pass reads every machine of its sets.
//!
//! Every change of any of its machines asks for a pass of the deployment; kube-runtime merges the requests that
//! arrive while a pass runs, so under churn the passes of a deployment of N machines run back to back, each O(N):
//! the controller spends a whole core re-deciding what one more pass would decide alike (docs/benchmarks.md).
//! MachineSet passes are not spaced: a set's status is what its deployment reads for availability, and the sooner it
//! is written the better (holding set passes once exposed a deployment trusting a stale set status, fixed since,
//! docs/benchmarks.md); the owner index ([`crate::owners`]) keeps a set's pass O(its own machines).
//! A pass may therefore start only once `factor` times its predecessor's duration has gone by since that one ended,
//! and never later than `max_wait` after it: a pass of a small set (microseconds) is never held, a pass of 5000
//! machines at most takes a quarter of the time, and no request waits longer than `max_wait`. A held request
//! requeues for the rest of the wait; nothing is lost, since a pass reads the caches as they are when it runs.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

/// How many times its own duration must pass after a pass before the next one of the same object (3: passes take at
/// most a quarter of the time).
pub(crate) const DEFAULT_FACTOR: u32 = 3;

/// The longest a pass is held (1s): a bound on the latency the spacing adds.
pub(crate) const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(1);

/// Entries kept before the old ones are dropped (objects deleted long ago).
const PRUNE_ABOVE: usize = 1024;

/// When each object's last pass ended and how long it took; cheap to clone (shared).
#[derive(Clone, Debug)]
pub(crate) struct PassThrottle {
    factor: u32,
    max_wait: Duration,
    last: Arc<Mutex<HashMap<String, (Instant, Duration)>>>,
}

impl PassThrottle {
    /// A throttle holding passes `factor` times their predecessor's duration, at most `max_wait`.
    pub(crate) fn new(factor: u32, max_wait: Duration) -> Self {
        Self {
            factor,
            max_wait,
            last: Arc::default(),
        }
    }

    /// How long the pass of `key` asked for at `now` must wait, if at all.
    pub(crate) fn wait(&self, key: &str, now: Instant) -> Option<Duration> {
        let last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let (ended, took) = last.get(key)?;
        let spacing = took.saturating_mul(self.factor).min(self.max_wait);
        let ready = *ended + spacing;
        (now < ready).then(|| ready - now)
    }

    /// Records that a pass of `key` ended at `ended` after `took`.
    pub(crate) fn record(&self, key: &str, ended: Instant, took: Duration) {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if last.len() > PRUNE_ABOVE {
            let max_wait = self.max_wait;
            last.retain(|_, (at, _)| ended.saturating_duration_since(*at) < max_wait);
        }
        last.insert(key.to_owned(), (ended, took));
    }
}

impl Default for PassThrottle {
    fn default() -> Self {
        Self::new(DEFAULT_FACTOR, DEFAULT_MAX_WAIT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_pass_and_a_cheap_one_are_never_held() {
        let throttle = PassThrottle::default();
        let t0 = Instant::now();
        assert_eq!(throttle.wait("set", t0), None);
        throttle.record("set", t0, Duration::ZERO);
        assert_eq!(throttle.wait("set", t0), None);
    }

    #[test]
    fn an_expensive_pass_holds_the_next_one_factor_times_its_duration() {
        let throttle = PassThrottle::default();
        let t0 = Instant::now();
        throttle.record("set", t0, Duration::from_millis(100));
        assert_eq!(throttle.wait("set", t0), Some(Duration::from_millis(300)));
        assert_eq!(
            throttle.wait("set", t0 + Duration::from_millis(250)),
            Some(Duration::from_millis(50))
        );
        assert_eq!(throttle.wait("set", t0 + Duration::from_millis(300)), None);
        // Another object is not held.
        assert_eq!(throttle.wait("other", t0), None);
    }

    #[test]
    fn no_pass_waits_longer_than_the_maximum() {
        let throttle = PassThrottle::new(3, Duration::from_secs(1));
        let t0 = Instant::now();
        throttle.record("set", t0, Duration::from_secs(10));
        assert_eq!(throttle.wait("set", t0), Some(Duration::from_secs(1)));
        assert_eq!(throttle.wait("set", t0 + Duration::from_secs(1)), None);
    }

    #[test]
    fn old_entries_are_dropped_once_many_objects_were_seen() {
        let throttle = PassThrottle::default();
        let t0 = Instant::now();
        for i in 0..=PRUNE_ABOVE {
            throttle.record(&format!("set-{i}"), t0, Duration::from_millis(1));
        }
        throttle.record("late", t0 + Duration::from_secs(5), Duration::from_millis(1));
        assert_eq!(throttle.last.lock().unwrap().len(), 1);
    }
}
