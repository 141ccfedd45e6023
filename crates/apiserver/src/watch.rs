//! Watches: newline-delimited `{"type":…,"object":…}` frames from a resourceVersion, with bookmarks when asked,
//! `timeoutSeconds`, label and field selectors (objects moving in or out of a selector appear as ADDED or
//! DELETED), and a 410 `ERROR` frame when the resourceVersion is older than the retained window.

use std::{convert::Infallible, sync::Arc, time::Duration};

use axum::body::Body;
use bytes::Bytes;
use http::{Response, StatusCode, header};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use crate::{
    error::ApiError,
    objects::{labels, resource_id},
    registry::ResourceDef,
    rest::{AppState, Format, Query},
    selectors::{FieldSelector, LabelSelector},
    store::{EventType, WatchEvent},
    table,
};

struct Filter {
    resource: String,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    fn selects(&self, object: &Value) -> bool {
        self.labels.matches(&labels(object)) && self.fields.matches(object)
    }

    /// The event type a watcher with this filter sees, if any.
    fn view(&self, event: &WatchEvent) -> Option<EventType> {
        if event.resource != self.resource || self.namespace.as_ref().is_some_and(|ns| ns != &event.namespace)
        {
            return None;
        }
        let now = self.selects(&event.object);
        match event.event_type {
            EventType::Modified => {
                let before = event
                    .previous
                    .as_ref()
                    .is_none_or(|previous| self.selects(previous));
                match (before, now) {
                    (true, true) => Some(EventType::Modified),
                    (false, true) => Some(EventType::Added),
                    (true, false) => Some(EventType::Deleted),
                    (false, false) => None,
                }
            }
            other => now.then_some(other),
        }
    }
}

/// The object a watcher is shown for an event it sees as `seen`: for an object that left its selector, the last
/// state that matched at the resourceVersion of the change (as the watch cache sends it), else the object after
/// the change.
fn shown(event: &WatchEvent, seen: EventType) -> std::borrow::Cow<'_, Value> {
    match &event.previous {
        Some(previous) if event.event_type == EventType::Modified && seen == EventType::Deleted => {
            let mut last = (**previous).clone();
            last["metadata"]["resourceVersion"] = json!(event.rv.to_string());
            std::borrow::Cow::Owned(last)
        }
        _ => std::borrow::Cow::Borrowed(&event.object),
    }
}

struct Encoder {
    def: Arc<ResourceDef>,
    format: Format,
    /// What a Table row carries (`includeObject`).
    include: table::IncludeObject,
    first_table: bool,
}

impl Encoder {
    fn frame(&mut self, event_type: &str, object: &Value) -> Bytes {
        let presented;
        let object = if event_type == "BOOKMARK" || event_type == "ERROR" {
            object
        } else {
            presented = self.def.present(object);
            &*presented
        };
        let object = match self.format {
            Format::Table(version) if event_type != "BOOKMARK" && event_type != "ERROR" => {
                let meta = json!({ "resourceVersion": object["metadata"]["resourceVersion"] });
                let columns = std::mem::replace(&mut self.first_table, false);
                table::table_with(
                    &self.def,
                    &[object],
                    self.include,
                    columns,
                    meta,
                    jiff::Timestamp::now(),
                    version,
                )
            }
            Format::Metadata if event_type != "ERROR" => crate::rest::partial_metadata(object),
            Format::Protobuf => return crate::protobuf::watch_frame(event_type, object),
            _ => object.clone(),
        };
        let mut line =
            serde_json::to_vec(&json!({ "type": event_type, "object": object })).unwrap_or_default();
        line.push(b'\n');
        Bytes::from(line)
    }

    fn bookmark(&mut self, rv: u64, initial_events_end: bool) -> Bytes {
        let mut metadata = json!({ "resourceVersion": rv.to_string() });
        if initial_events_end {
            metadata["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
        }
        let object =
            json!({ "kind": self.def.kind, "apiVersion": self.def.api_version(), "metadata": metadata });
        self.frame("BOOKMARK", &object)
    }
}

fn parse_rv(text: &str) -> Result<u64, ApiError> {
    text.parse()
        .map_err(|_| ApiError::BadRequest(format!("invalid resourceVersion {text:?}")))
}

/// Starts a watch and returns the streaming response.
pub fn start(
    state: &AppState,
    def: Arc<ResourceDef>,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    query: &Query,
    format: Format,
) -> Result<Response<Body>, ApiError> {
    let filter = Filter {
        resource: resource_id(&def),
        namespace,
        labels,
        fields,
    };
    let bookmarks = query.flag("allowWatchBookmarks");
    let send_initial = query.flag("sendInitialEvents");
    let timeout = match query.get("timeoutSeconds").filter(|t| !t.is_empty()) {
        Some(text) => {
            Some(Duration::from_secs(text.parse().map_err(|_| {
                ApiError::BadRequest(format!("invalid timeoutSeconds {text:?}"))
            })?))
        }
        None => None,
    };
    let requested = query.get("resourceVersion").unwrap_or("");
    let include = match format {
        Format::Table(_) => {
            table::IncludeObject::parse(query.get("includeObject")).map_err(ApiError::BadRequest)?
        }
        _ => table::IncludeObject::default(),
    };
    let mut encoder = Encoder {
        def,
        format,
        include,
        first_table: true,
    };
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(256);
    let mut initial = Vec::new();
    let (last_rv, receiver) = if requested.is_empty() || requested == "0" || send_initial {
        let (items, rv, receiver) = state
            .store
            .snapshot_and_subscribe(&filter.resource, filter.namespace.as_deref());
        for item in items.iter().filter(|item| filter.selects(item)) {
            initial.push(encoder.frame("ADDED", item));
        }
        if send_initial && bookmarks {
            initial.push(encoder.bookmark(rv, true));
        }
        (rv, Some(receiver))
    } else {
        let rv = parse_rv(requested)?;
        match state.store.watch_from(rv) {
            Ok((backlog, receiver)) => {
                let mut last = rv;
                for event in &backlog {
                    if let Some(seen) = filter.view(event) {
                        initial.push(encoder.frame(seen.as_str(), &shown(event, seen)));
                    }
                    last = event.rv;
                }
                (last, Some(receiver))
            }
            Err(err) => {
                // As a real server: 200, then one ERROR frame carrying the 410 Status.
                initial.push(encoder.frame("ERROR", &err.to_status()));
                (rv, None)
            }
        }
    };
    let live = Live {
        receiver,
        filter,
        encoder,
        last_rv,
        bookmarks,
        timeout,
        bookmark_interval: state.bookmark_interval,
        hooks: Arc::clone(&state.hooks),
    };
    tokio::spawn(live.pump(initial, tx, state.shutdown.clone()));
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    Response::builder()
        .status(StatusCode::OK)
        .header(
            header::CONTENT_TYPE,
            if format == Format::Protobuf {
                crate::protobuf::WATCH_MEDIA_TYPE
            } else {
                "application/json"
            },
        )
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(body)
        .map_err(|err| ApiError::Internal(err.to_string()))
}

/// The live part of a watch: frames after the initial ones, until timeout, shutdown or the client leaves.
struct Live {
    receiver: Option<broadcast::Receiver<Arc<WatchEvent>>>,
    filter: Filter,
    encoder: Encoder,
    last_rv: u64,
    bookmarks: bool,
    timeout: Option<Duration>,
    bookmark_interval: Duration,
    hooks: Arc<crate::hooks::Hooks>,
}

impl Live {
    async fn pump(
        mut self,
        initial: Vec<Bytes>,
        tx: mpsc::Sender<Result<Bytes, Infallible>>,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        for frame in initial {
            if tx.send(Ok(frame)).await.is_err() {
                return;
            }
        }
        let Some(mut receiver) = self.receiver.take() else {
            return;
        };
        let deadline = self.timeout.map(|t| tokio::time::Instant::now() + t);
        let mut ticker = tokio::time::interval(self.bookmark_interval);
        ticker.tick().await;
        loop {
            let frame = tokio::select! {
                event = receiver.recv() => match event {
                    Ok(event) => {
                        if event.rv <= self.last_rv {
                            continue;
                        }
                        self.last_rv = event.rv;
                        let delay = self.hooks.watch_delay();
                        if !delay.is_zero() {
                            tokio::time::sleep_until(tokio::time::Instant::from_std(event.at + delay)).await;
                        }
                        match self.filter.view(&event) {
                            Some(seen) => self.encoder.frame(seen.as_str(), &shown(&event, seen)),
                            None => continue,
                        }
                    }
                    // A watcher that fell behind the broadcast buffer ends; its client resumes from its last
                    // resourceVersion, from the log, losing nothing.
                    Err(broadcast::error::RecvError::Lagged(_) | broadcast::error::RecvError::Closed) => return,
                },
                _ = ticker.tick(), if self.bookmarks => self.encoder.bookmark(self.last_rv, false),
                () = sleep_until(deadline) => {
                    if self.bookmarks {
                        let _ = tx.send(Ok(self.encoder.bookmark(self.last_rv, false))).await;
                    }
                    return;
                }
                _ = shutdown.changed() => return,
                () = tx.closed() => return,
            };
            if tx.send(Ok(frame)).await.is_err() {
                return;
            }
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
