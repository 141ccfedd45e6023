//! What the machine controller remembers of each machine between reconciles, in one place: the count of failed
//! provider calls in a row, the gate before the provider may be called again, and the gate before a failed class
//! migration may be tried again. Lost on a restart by design: the gates only damp repeated calls.

use std::{collections::BTreeMap, sync::Mutex, time::Duration};

use mcm_core::retry_policy::RetryGate;

/// One machine's memory.
#[derive(Clone, Debug, Default)]
struct Remembered {
    /// Failed provider calls (or class migrations) in a row.
    failures: u32,
    /// After a failed provider call: when the provider may be called again (the back-off of a code marked Y is
    /// over, or the machine, its class or its secret changed after a code marked N). Reconciles come for many
    /// reasons, the controller's own status write among them: without the gate each one called again.
    retry_gate: Option<RetryGate>,
    /// After a failed class migration: when it may be tried again.
    migration_gate: Option<RetryGate>,
}

impl Remembered {
    fn is_empty(&self) -> bool {
        self.failures == 0 && self.retry_gate.is_none() && self.migration_gate.is_none()
    }
}

/// Machine name → what is remembered of it.
#[derive(Debug, Default)]
pub(super) struct MachineMemory(Mutex<BTreeMap<String, Remembered>>);

impl MachineMemory {
    /// Changes the memory of `machine` with `change`, forgetting the machine once nothing is left of it.
    fn with<T>(&self, machine: &str, change: impl FnOnce(&mut Remembered) -> T) -> T {
        let mut map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = map.entry(machine.to_owned()).or_default();
        let result = change(entry);
        if entry.is_empty() {
            map.remove(machine);
        }
        result
    }

    /// Failed calls in a row of `machine`.
    pub(super) fn failures(&self, machine: &str) -> u32 {
        self.with(machine, |m| m.failures)
    }

    /// Counts one more failure of `machine`; returns the count.
    pub(super) fn note_failure(&self, machine: &str) -> u32 {
        self.with(machine, |m| {
            m.failures += 1;
            m.failures
        })
    }

    /// Forgets the failures of `machine` and its provider retry gate (a call succeeded, or it is gone).
    pub(super) fn clear_failures(&self, machine: &str) {
        self.with(machine, |m| {
            m.failures = 0;
            m.retry_gate = None;
        });
    }

    /// Closes the provider retry gate of `machine` until `gate` opens.
    pub(super) fn set_retry_gate(&self, machine: &str, gate: RetryGate) {
        self.with(machine, |m| m.retry_gate = Some(gate));
    }

    /// How long the provider may not be called yet for `machine` after a failed call; `None` when it may.
    pub(super) fn retry_wait(
        &self,
        machine: &str,
        now: jiff::Timestamp,
        fingerprint: &str,
    ) -> Option<Duration> {
        self.with(machine, |m| {
            let gate = m.retry_gate.as_ref().filter(|g| !g.is_open(now, fingerprint))?;
            Duration::try_from(gate.not_before.duration_since(now)).ok()
        })
    }

    /// The class migration gate of `machine`, if a migration failed.
    pub(super) fn migration_gate(&self, machine: &str) -> Option<RetryGate> {
        self.with(machine, |m| m.migration_gate.clone())
    }

    /// Sets (`Some`) or clears (`None`) the class migration gate of `machine`.
    pub(super) fn set_migration_gate(&self, machine: &str, gate: Option<RetryGate>) {
        self.with(machine, |m| m.migration_gate = gate);
    }
}
