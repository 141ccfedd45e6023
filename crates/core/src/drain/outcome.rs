//! [`DrainOutcome`]: what a drain came to, and the text the deletion flow writes for it.
//!
//! Separate because it is the drain's report to the deletion flow, not part of the drain's decisions.

use std::{fmt, time::Duration};

use super::{common::go, disruption_budgets::Blocker};

/// How a drain (or one pass of a drain) went, as the controller reports it. Its `Display` is the text that goes into
/// `lastOperation.description` (through [`crate::deletion`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DrainOutcome {
    /// Every pod is gone (or left alone): `evicted` pods were evicted, `deleted` deleted (force drain, or after the
    /// evict retries).
    Drained {
        /// Pods evicted.
        evicted: usize,
        /// Pods deleted.
        deleted: usize,
    },
    /// The drain goes on: `remaining` pods are still to go; `blocked` names a pod whose eviction a budget refuses
    /// for now (retried every `evict_retry_interval`).
    InProgress {
        /// Pods still on the node (to evict or to wait for).
        remaining: usize,
        /// A pod refused by a budget, if any.
        blocked: Option<Blocker>,
    },
    /// A budget refuses a pod for good: misconfigured, or the evict retries are used up.
    Blocked(Blocker),
    /// The drain did not finish within its timeout.
    TimedOut {
        /// The drain timeout.
        timeout: Duration,
        /// Pods still on the node.
        remaining: usize,
    },
    /// Another error (an API call failed).
    Failed {
        /// What failed.
        message: String,
    },
}

impl DrainOutcome {
    /// Whether the node is drained.
    pub fn is_drained(&self) -> bool {
        matches!(self, Self::Drained { .. })
    }
}

/// `1 pod`, `3 pods`.
fn pods(n: usize) -> String {
    if n == 1 {
        "1 pod".to_owned()
    } else {
        format!("{n} pods")
    }
}

impl fmt::Display for DrainOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Drained {
                evicted: 0,
                deleted: 0,
            } => f.write_str("no pods to evict"),
            Self::Drained { evicted, deleted: 0 } => write!(f, "{} evicted", pods(*evicted)),
            Self::Drained { evicted: 0, deleted } => write!(f, "{} deleted", pods(*deleted)),
            Self::Drained { evicted, deleted } => {
                write!(f, "{} evicted, {} deleted", pods(*evicted), pods(*deleted))
            }
            Self::InProgress {
                remaining,
                blocked: None,
            } => write!(f, "{} left", pods(*remaining)),
            Self::InProgress {
                remaining,
                blocked: Some(blocker),
            } => write!(f, "{} left; {blocker}", pods(*remaining)),
            Self::Blocked(blocker) => blocker.fmt(f),
            Self::TimedOut { timeout, remaining } => write!(
                f,
                "the drain did not finish within {}, {} left",
                go(*timeout),
                pods(*remaining)
            ),
            Self::Failed { message } => f.write_str(message),
        }
    }
}
