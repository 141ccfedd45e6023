//! Kubernetes Events on the objects the controllers act on (core v1, so that `kubectl describe` shows them).
//! Messages pass through the caller's redactor first; no secret value is ever written here.
//!
//! Repeats are correlated as client-go's recorder does (`mcm_core::event_correlation`): an identical Event bumps the
//! count of the first with a patch, the tenth different message of one object's reason within 10 minutes starts one
//! aggregate Event, and more than 25 Events of one component about one object at once are dropped (one more per 5
//! minutes). kube-runtime's own `Recorder` only dedups identical Events, and on `events.k8s.io/v1`.

use k8s_openapi::{
    api::core::v1::{Event, EventSource, ObjectReference},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time},
};
use std::sync::{Arc, Mutex, PoisonError};

use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use mcm_core::event_correlation::{Correlated, CorrelationSettings, Correlator, EventIdentity};
use serde_json::json;

/// Normal or Warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Something expected happened.
    Normal,
    /// Something went wrong or needs attention.
    Warning,
}

/// Writes Events as one component; clones share its correlation of repeats.
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    component: String,
    correlator: Arc<Mutex<Correlator>>,
}

impl Recorder {
    /// A recorder writing as `component` (for example `machine-controller`), correlating with client-go's limits.
    pub fn new(client: Client, component: &str) -> Self {
        Self::with_correlation(client, component, CorrelationSettings::default())
    }

    /// A recorder with other correlation limits.
    pub fn with_correlation(client: Client, component: &str, settings: CorrelationSettings) -> Self {
        Self {
            client,
            component: component.to_owned(),
            correlator: Arc::new(Mutex::new(Correlator::new(settings))),
        }
    }

    /// Records an event about `object`. Failures are logged, never returned: an event is worth less than the work.
    pub async fn record<K>(&self, object: &K, event_type: EventType, reason: &str, message: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        let namespace = object.namespace().unwrap_or_else(|| "default".into());
        let now = jiff::Timestamp::now();
        let type_ = match event_type {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        };
        let identity = EventIdentity {
            component: self.component.clone(),
            object: format!(
                "{}/{}/{namespace}/{}/{}",
                K::api_version(&()),
                K::kind(&()),
                object.name_any(),
                object.uid().unwrap_or_default()
            ),
            event_type: type_.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
        };
        let (correlated, ticket) = self
            .correlator
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .observe(&identity, now);
        tracing::debug!(reason, object = %identity.object, outcome = ?correlated, "event correlated");
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let message = match correlated {
            Correlated::Skip => {
                tracing::debug!(reason, "event dropped by the spam filter");
                return;
            }
            Correlated::Bump { name, count, message } => {
                let patch = json!({ "count": count, "lastTimestamp": Time(now), "message": message });
                match api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => return,
                    // Expired or deleted: write it anew.
                    Err(kube::Error::Api(status)) if status.code == 404 => {
                        self.correlator
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .forget(&ticket);
                        message
                    }
                    Err(err) => {
                        tracing::debug!(reason, error = %err, "could not update an event");
                        return;
                    }
                }
            }
            Correlated::Create { message } => message,
        };
        let name = format!("{}.{:x}", object.name_any(), now.as_nanosecond());
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some(K::api_version(&()).into_owned()),
                kind: Some(K::kind(&()).into_owned()),
                name: Some(object.name_any()),
                namespace: object.namespace(),
                uid: object.uid(),
                resource_version: object.resource_version(),
                field_path: None,
            },
            reason: Some(reason.to_owned()),
            message: Some(message),
            type_: Some(type_.to_owned()),
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: None,
            }),
            reporting_component: Some(self.component.clone()),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            count: Some(1),
            action: Some(reason.to_owned()),
            ..Event::default()
        };
        let created = match api.create(&PostParams::default(), &event).await {
            Ok(created) => created.metadata.name,
            Err(err) => {
                tracing::debug!(reason, error = %err, "could not record an event");
                None
            }
        };
        self.correlator
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .created(&ticket, created);
    }
}
