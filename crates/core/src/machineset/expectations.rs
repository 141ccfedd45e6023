//! Expectations: the creations and deletions a set asked for that its cache does not show yet.
//!
//! Separate because they are the controller's only memory between passes.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use mcm_api::{Machine, MetaExt};

use super::{EXPECTATIONS_TIMEOUT, common::name_of};
use crate::timeouts;

/// What a set controller asked the API server for and its cache does not show yet (Kubernetes'
/// `UIDTrackingControllerExpectations`). The controller keeps one per set, in memory; [`decide`](super::decide) creates and deletes
/// nothing while they are not met, so a cache that lags behind the controller's own writes never makes the set
/// create a machine twice or delete one too many. (The reference tracks expectations but its check is commented out,
/// "TODO: Fix working of expectations".)
///
/// Creations are tracked by the name the API server gave the machine (`generateName`), deletions by name. Both are
/// observed from the cache's state ([`Expectations::observe`]), not counted from events, so a missed or repeated
/// event cannot skew them. A creation whose outcome is unknown (the call timed out) is tracked without a name and
/// only the timeout ends it. After [`EXPECTATIONS_TIMEOUT`] since the last expectation was raised they count as met.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expectations {
    creations: BTreeSet<String>,
    unknown_creations: usize,
    deletions: BTreeSet<String>,
    raised_at: Option<Timestamp>,
}

impl Expectations {
    /// No expectations.
    pub fn new() -> Self {
        Self::default()
    }

    fn raise(&mut self, now: Timestamp) {
        self.raised_at = Some(self.raised_at.map_or(now, |at| at.max(now)));
    }

    /// The API server created machine `name` for the set (after a successful create call).
    pub fn expect_creation(&mut self, name: impl Into<String>, now: Timestamp) {
        self.creations.insert(name.into());
        self.raise(now);
    }

    /// A create call whose outcome is unknown (for example a timeout: the machine may exist). Only the timeout ends
    /// this expectation, so the set waits rather than risk a second machine.
    pub fn expect_unknown_creation(&mut self, now: Timestamp) {
        self.unknown_creations += 1;
        self.raise(now);
    }

    /// The controller is about to delete machine `name` (raise it before the call).
    pub fn expect_deletion(&mut self, name: impl Into<String>, now: Timestamp) {
        self.deletions.insert(name.into());
        self.raise(now);
    }

    /// The delete call for `name` failed (other than NotFound): the cache will not show it, so stop waiting for it.
    pub fn deletion_failed(&mut self, name: &str) {
        self.deletions.remove(name);
    }

    /// Observes the cache: `machines` are the machines of the set's namespace as the cache holds them. A creation is
    /// met when a machine of that name is there; a deletion when the machine is not there any more or is being
    /// deleted.
    pub fn observe<'a>(&mut self, machines: impl IntoIterator<Item = &'a Machine>) {
        let mut present: BTreeMap<&str, bool> = BTreeMap::new();
        for machine in machines {
            present.insert(name_of(machine), machine.is_deleting());
        }
        self.creations.retain(|name| !present.contains_key(name.as_str()));
        self.deletions
            .retain(|name| present.get(name.as_str()).is_some_and(|deleting| !deleting));
        if self.is_empty() {
            self.raised_at = None;
        }
    }

    /// The cache reported machine `name` deleted (a watch event): both a creation and a deletion of it are met.
    pub fn observe_gone(&mut self, name: &str) {
        self.creations.remove(name);
        self.deletions.remove(name);
        if self.is_empty() {
            self.raised_at = None;
        }
    }

    /// The names of the machines whose creation or deletion is awaited: with the set's own machines, all that
    /// [`Expectations::observe`] needs to see (a caller with an index need not pass every machine).
    pub fn awaited(&self) -> impl Iterator<Item = &str> {
        self.creations.iter().chain(&self.deletions).map(String::as_str)
    }

    /// Nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.creations.is_empty() && self.unknown_creations == 0 && self.deletions.is_empty()
    }

    /// Creations not seen yet (named and unknown).
    pub fn pending_creations(&self) -> usize {
        self.creations.len() + self.unknown_creations
    }

    /// Deletions not seen yet.
    pub fn pending_deletions(&self) -> usize {
        self.deletions.len()
    }

    /// When pending expectations stop holding the set.
    pub fn expires_at(&self) -> Option<Timestamp> {
        if self.is_empty() {
            return None;
        }
        self.raised_at.map(|at| timeouts::add(at, EXPECTATIONS_TIMEOUT))
    }

    /// Whether the set may act: nothing pending, or the pending expectations expired.
    pub fn satisfied(&self, now: Timestamp) -> bool {
        self.expires_at().is_none_or(|at| now >= at)
    }

    /// Drops expired expectations; returns whether it did.
    pub fn expire(&mut self, now: Timestamp) -> bool {
        if !self.is_empty() && self.satisfied(now) {
            *self = Self::default();
            true
        } else {
            false
        }
    }
}
