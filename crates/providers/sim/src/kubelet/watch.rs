//! The kubelet's watches: each kind listed, then watched, and what is seen forwarded to the runner as one event
//! stream (listed again after a 410 or an error).

use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::{
    core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod},
    storage::v1::VolumeAttachment,
};
use kube::{
    Api, Resource,
    api::{ListParams, WatchEvent, WatchParams},
};
use tokio::{sync::mpsc, task::JoinHandle};

/// Aborts a task when dropped.
pub(super) struct AbortOnDrop(pub(super) JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a watch reports.
pub(super) enum Seen<K> {
    /// A fresh list: every object, at this resourceVersion.
    Reset(Vec<K>, Option<u64>),
    /// An object was added or modified.
    Applied(K),
    /// An object was deleted.
    Deleted(K),
}

/// What the node watch reports.
pub(super) type NodeEvent = Seen<Node>;

/// What the kubelet's watches report.
pub(super) enum Event {
    Node(Seen<Node>),
    Pod(Seen<Pod>),
    Claim(Seen<PersistentVolumeClaim>),
    Volume(Seen<PersistentVolume>),
    Attachment(Seen<VolumeAttachment>),
}

/// Lists the objects of a kind, then watches them, forwarding what it sees (wrapped by `wrap`); lists again after a
/// 410 or an error.
pub(super) async fn watch_objects<K>(api: Api<K>, events: mpsc::Sender<Event>, wrap: fn(Seen<K>) -> Event)
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + k8s_openapi::serde::de::DeserializeOwned
        + Send
        + 'static,
{
    let kind = K::plural(&()).into_owned();
    let pause = Duration::from_secs(1);
    'list: loop {
        let list = match api.list(&ListParams::default()).await {
            Ok(list) => list,
            Err(err) => {
                tracing::warn!(error = %err, kind, "sim kubelet: listing failed");
                tokio::time::sleep(pause).await;
                continue;
            }
        };
        let mut version = list.metadata.resource_version.clone().unwrap_or_default();
        if events
            .send(wrap(Seen::Reset(list.items, version.parse().ok())))
            .await
            .is_err()
        {
            return;
        }
        loop {
            let stream = match api.watch(&WatchParams::default().timeout(290), &version).await {
                Ok(stream) => stream,
                Err(err) => {
                    tracing::warn!(error = %err, kind, "sim kubelet: watching failed");
                    tokio::time::sleep(pause).await;
                    continue 'list;
                }
            };
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let event = match event {
                    Ok(WatchEvent::Added(object) | WatchEvent::Modified(object)) => {
                        version = object.meta().resource_version.clone().unwrap_or(version);
                        Seen::Applied(object)
                    }
                    Ok(WatchEvent::Deleted(object)) => {
                        version = object.meta().resource_version.clone().unwrap_or(version);
                        Seen::Deleted(object)
                    }
                    Ok(WatchEvent::Bookmark(bookmark)) => {
                        version = bookmark.metadata.resource_version;
                        continue;
                    }
                    Ok(WatchEvent::Error(status)) => {
                        if status.code != 410 {
                            tracing::warn!(status = ?status, kind, "sim kubelet: watch error");
                            tokio::time::sleep(pause).await;
                        }
                        continue 'list;
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, kind, "sim kubelet: watch broke");
                        tokio::time::sleep(pause).await;
                        continue 'list;
                    }
                };
                if events.send(wrap(event)).await.is_err() {
                    return;
                }
            }
        }
    }
}
