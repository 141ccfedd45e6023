//! Kubernetes Events on the objects the controllers act on (core v1, so that `kubectl describe` shows them).
//! Messages pass through the caller's redactor first; no secret value is ever written here.

use k8s_openapi::{
    api::core::v1::{Event, EventSource, ObjectReference},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time},
};
use kube::{Api, Client, Resource, ResourceExt, api::PostParams};

/// Normal or Warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Something expected happened.
    Normal,
    /// Something went wrong or needs attention.
    Warning,
}

/// Writes Events as one component.
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    component: String,
}

impl Recorder {
    /// A recorder writing as `component` (for example `machine-controller`).
    pub fn new(client: Client, component: &str) -> Self {
        Self {
            client,
            component: component.to_owned(),
        }
    }

    /// Records an event about `object`. Failures are logged, never returned: an event is worth less than the work.
    pub async fn record<K>(&self, object: &K, event_type: EventType, reason: &str, message: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        let namespace = object.namespace().unwrap_or_else(|| "default".into());
        let now = jiff::Timestamp::now();
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
            message: Some(message.to_owned()),
            type_: Some(match event_type {
                EventType::Normal => "Normal".into(),
                EventType::Warning => "Warning".into(),
            }),
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
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        if let Err(err) = api.create(&PostParams::default(), &event).await {
            tracing::debug!(reason, error = %err, "could not record an event");
        }
    }
}
