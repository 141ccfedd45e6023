//! What the machine controller remembers of each machine between reconciles: its [`Attempts`] (failed provider
//! calls in a row, the provider retry gate, the class migration gate), as `mcm_core::creation` decides them. Lost on
//! a restart by design: the gates only damp repeated calls.

use std::{collections::BTreeMap, sync::Mutex};

use mcm_core::creation::Attempts;

/// Machine name → its attempts; a machine with nothing to remember has no entry.
#[derive(Debug, Default)]
pub(super) struct MachineMemory(Mutex<BTreeMap<String, Attempts>>);

impl MachineMemory {
    /// The attempts of `machine` (empty when nothing is remembered).
    pub(super) fn attempts(&self, machine: &str) -> Attempts {
        self.lock().get(machine).cloned().unwrap_or_default()
    }

    /// Changes the attempts of `machine` with `change` (one of [`Attempts`]'s decisions), forgetting the machine
    /// once nothing is left of it.
    pub(super) fn change(&self, machine: &str, change: impl FnOnce(&mut Attempts)) {
        let mut map = self.lock();
        let entry = map.entry(machine.to_owned()).or_default();
        change(entry);
        if entry.is_empty() {
            map.remove(machine);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Attempts>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
