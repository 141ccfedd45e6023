//! The one-time warning about settings that are stored but have no effect (`mcm_core::ignored`): a Warning Event
//! with reason `NoEffect` on the object and a log line, once per object and distinct list of settings (not again
//! when only its generation moves: an autoscaler scaling a deployment, or its deletion, would repeat it; again after
//! a restart of the controller, which does not remember).

use std::{collections::BTreeMap, sync::Mutex};

use kube::{Resource, ResourceExt};
use mcm_core::ignored::{self, Ignored, NO_EFFECT};

use crate::events::{EventType, Recorder};

/// What was last warned about, by object uid: the settings' text.
#[derive(Debug, Default)]
pub(crate) struct NoEffect(Mutex<BTreeMap<String, String>>);

impl NoEffect {
    /// Warns about `settings` on `object` unless it was already warned about with the same text; an object without
    /// such settings is forgotten.
    pub(crate) async fn warn<K>(&self, recorder: &Recorder, object: &K, settings: &[Ignored])
    where
        K: Resource<DynamicType = ()>,
    {
        let uid = object.uid().unwrap_or_default();
        let message = ignored::summarize(settings);
        let warn = {
            let mut warned = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if settings.is_empty() {
                warned.remove(&uid);
                false
            } else {
                warned.insert(uid, message.clone()).as_ref() != Some(&message)
            }
        };
        if warn {
            tracing::warn!(
                kind = %K::kind(&()),
                name = %object.name_any(),
                settings = %message,
                "accepted for compatibility with the reference; it has no effect here"
            );
            recorder
                .record(
                    object,
                    EventType::Warning,
                    NO_EFFECT,
                    &format!("has no effect here: {message}"),
                )
                .await;
        }
    }
}
