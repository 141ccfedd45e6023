//! What the MachineSet, MachineDeployment and MachineClass controllers remember about the invalid objects they
//! warned about, so that each distinct problem gives one Warning Event (`mcm_core::validity::should_warn`), even
//! while the cache has not seen the condition written in the same pass.

use std::{collections::BTreeMap, sync::Mutex};

use kube::{Resource, ResourceExt};
use mcm_core::validity::{self, INVALID_SPEC, InvalidSpec};

use crate::events::{EventType, Recorder};

/// The last message warned about, by object uid.
#[derive(Debug, Default)]
pub(crate) struct Warned(Mutex<BTreeMap<String, String>>);

impl Warned {
    /// Records the Warning Event for `invalid` on `object` unless `on_object` (the message its status carries) or
    /// the last warning already said it.
    pub(crate) async fn warn<K>(
        &self,
        recorder: &Recorder,
        object: &K,
        on_object: Option<&str>,
        invalid: &InvalidSpec,
    ) where
        K: Resource<DynamicType = ()>,
    {
        self.warn_once(
            recorder,
            object,
            on_object,
            INVALID_SPEC,
            &invalid.message,
            &invalid.event_message(),
        )
        .await;
    }

    /// Records a Warning Event with `reason` and `event_message` on `object`, unless `on_object` or the last warning
    /// about it already said `message`.
    pub(crate) async fn warn_once<K>(
        &self,
        recorder: &Recorder,
        object: &K,
        on_object: Option<&str>,
        reason: &str,
        message: &str,
        event_message: &str,
    ) where
        K: Resource<DynamicType = ()>,
    {
        let uid = object.uid().unwrap_or_default();
        let warn = {
            let mut warned = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let warn = validity::should_warn(on_object, warned.get(&uid).map(String::as_str), message);
            warned.insert(uid, message.to_owned());
            warn
        };
        if warn {
            tracing::warn!(
                kind = %K::kind(&()),
                name = %object.name_any(),
                reason,
                problems = %message,
                "nothing is created, deleted or scaled for it until it is fixed"
            );
            recorder
                .record(object, EventType::Warning, reason, event_message)
                .await;
        }
    }

    /// Forgets `object`: it is valid (again).
    pub(crate) fn forget<K: Resource>(&self, object: &K) {
        if let Some(uid) = object.uid() {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&uid);
        }
    }
}
