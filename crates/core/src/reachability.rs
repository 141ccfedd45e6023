//! The API server reachability freeze (reference §3.10), decided purely: the control and target API servers are
//! probed every `--machine-safety-apiserver-statuscheck-period`; one unreachable for longer than
//! `--machine-safety-apiserver-statuscheck-timeout` freezes the machine controller (no work but deletions already
//! under way), so that an outage never makes machines look unhealthy and get replaced. While an API server is
//! down, probes come every timeout/5.
//!
//! **Recovery** (a deliberate difference): the reference unfreezes at the first good probe and resets Unknown
//! machines to Running. Nodes whose kubelets could not heartbeat during the outage are still stale at that moment,
//! so health clocks restarted then can run out before the kubelets are back. Here the freeze holds for one more
//! timeout after both API servers answer again (the kubelets' time to heartbeat), then lifts, and the controller
//! restarts the health clocks of the machines still Unknown.

use std::time::Duration;

use jiff::Timestamp;

use crate::timeouts;

/// The reference's text on a machine whose health clock restarted.
pub const HEALTH_TIMEOUT_RESET: &str = "Machine Health Timeout was reset due to APIServer being unreachable";

/// Probe period and outage timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReachabilitySettings {
    /// `--machine-safety-apiserver-statuscheck-period` (1m).
    pub period: Duration,
    /// `--machine-safety-apiserver-statuscheck-timeout` (30s).
    pub timeout: Duration,
}

impl Default for ReachabilitySettings {
    fn default() -> Self {
        Self {
            period: Duration::from_mins(1),
            timeout: Duration::from_secs(30),
        }
    }
}

impl ReachabilitySettings {
    /// The reference's validation: the period is at least the timeout. The message names both flags.
    pub fn validate(&self) -> Result<(), String> {
        if self.period < self.timeout {
            return Err(format!(
                "--machine-safety-apiserver-statuscheck-period ({:?}) must be at least \
                 --machine-safety-apiserver-statuscheck-timeout ({:?})",
                self.period, self.timeout
            ));
        }
        Ok(())
    }
}

/// What a probe result changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Nothing.
    None,
    /// Freeze: an API server has been unreachable for longer than the timeout.
    Freeze,
    /// Unfreeze: both answered for a timeout; restart the health clocks of Unknown machines.
    Unfreeze,
}

/// The freeze state across probes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reachability {
    /// Since when an API server has been failing its probes.
    pub down_since: Option<Timestamp>,
    /// Since when both have answered again, while frozen.
    pub up_since: Option<Timestamp>,
    /// Whether the controller is frozen.
    pub frozen: bool,
}

impl Reachability {
    /// Takes a probe result (`reachable`: both API servers answered) at `now`.
    pub fn observe(&mut self, reachable: bool, now: Timestamp, settings: ReachabilitySettings) -> Change {
        if reachable {
            self.down_since = None;
            if !self.frozen {
                return Change::None;
            }
            let since = *self.up_since.get_or_insert(now);
            if timeouts::add(since, settings.timeout) <= now {
                self.frozen = false;
                self.up_since = None;
                return Change::Unfreeze;
            }
            return Change::None;
        }
        self.up_since = None;
        let since = *self.down_since.get_or_insert(now);
        if !self.frozen && timeouts::add(since, settings.timeout) <= now {
            self.frozen = true;
            return Change::Freeze;
        }
        Change::None
    }

    /// When to probe next: every timeout/5 while an API server is down or the freeze holds, else every period.
    pub fn next_probe(&self, settings: ReachabilitySettings) -> Duration {
        if self.frozen || self.down_since.is_some() {
            (settings.timeout / 5).max(Duration::from_millis(50))
        } else {
            settings.period
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_000 + seconds).unwrap()
    }

    fn settings() -> ReachabilitySettings {
        ReachabilitySettings {
            period: Duration::from_mins(1),
            timeout: Duration::from_secs(30),
        }
    }

    #[test]
    fn an_outage_longer_than_the_timeout_freezes_and_a_shorter_one_does_not() {
        let mut state = Reachability::default();
        assert_eq!(state.observe(false, at(0), settings()), Change::None);
        assert_eq!(state.observe(false, at(29), settings()), Change::None);
        assert_eq!(
            state.observe(true, at(31), settings()),
            Change::None,
            "back before the timeout"
        );
        assert!(!state.frozen);
        assert_eq!(state.observe(false, at(40), settings()), Change::None);
        assert_eq!(state.observe(false, at(70), settings()), Change::Freeze);
        assert!(state.frozen);
        assert_eq!(
            state.observe(false, at(80), settings()),
            Change::None,
            "frozen once"
        );
    }

    #[test]
    fn recovery_holds_the_freeze_for_a_timeout_then_unfreezes_once() {
        let mut state = Reachability {
            frozen: true,
            down_since: Some(at(0)),
            up_since: None,
        };
        assert_eq!(state.observe(true, at(100), settings()), Change::None);
        assert_eq!(state.observe(true, at(120), settings()), Change::None);
        assert_eq!(
            state.observe(false, at(125), settings()),
            Change::None,
            "a relapse restarts the wait"
        );
        assert_eq!(state.observe(true, at(126), settings()), Change::None);
        assert_eq!(state.observe(true, at(156), settings()), Change::Unfreeze);
        assert!(!state.frozen);
        assert_eq!(state.observe(true, at(200), settings()), Change::None);
    }

    #[test]
    fn probes_come_faster_while_something_is_down() {
        let mut state = Reachability::default();
        assert_eq!(state.next_probe(settings()), Duration::from_mins(1));
        state.observe(false, at(0), settings());
        assert_eq!(state.next_probe(settings()), Duration::from_secs(6));
    }

    #[test]
    fn the_period_must_not_be_shorter_than_the_timeout() {
        assert!(settings().validate().is_ok());
        let bad = ReachabilitySettings {
            period: Duration::from_secs(10),
            timeout: Duration::from_secs(30),
        };
        let err = bad.validate().unwrap_err();
        assert!(
            err.contains("--machine-safety-apiserver-statuscheck-period"),
            "{err}"
        );
        assert!(
            err.contains("--machine-safety-apiserver-statuscheck-timeout"),
            "{err}"
        );
    }
}
