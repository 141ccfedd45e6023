//! Events expire, as kube-apiserver's `--event-ttl` (default 1h) makes them: kube-apiserver stores each Event under
//! an etcd lease of that TTL, renewed by every write, so an Event not written for the TTL disappears. Here a sweep
//! deletes both kinds of Event (`v1` and `events.k8s.io/v1`) whose last write is older than the TTL, so that the
//! store does not grow with every machine ever made. The last write is the latest of the times the object carries:
//! `metadata.creationTimestamp`, `managedFields[].time` (every write stamps its manager's entry),
//! `firstTimestamp`/`lastTimestamp`/`eventTime` and `series.lastObservedTime`. Expired Events are deleted outright
//! (finalizers are not waited for, as a lease expiry does not), each a watch DELETED event.

use std::{sync::Arc, time::Duration};

use jiff::Timestamp;
use serde_json::Value;
use tokio::sync::watch;

use crate::store::{Mutation, Store};

/// The store keys of the two Event resources.
pub const EVENT_RESOURCES: [&str; 2] = ["/events", "events.k8s.io/events"];
/// kube-apiserver's default `--event-ttl`.
pub const DEFAULT_EVENT_TTL: Duration = Duration::from_hours(1);
/// [`DEFAULT_EVENT_TTL`] as the `--event-ttl` flags of `mcm apiserver`, `mcm up` and `mcm bench` write their default.
pub const DEFAULT_EVENT_TTL_FLAG: &str = "1h";

/// The latest write time an Event carries (see the module doc), or `None` when it carries none.
pub fn last_write(event: &Value) -> Option<Timestamp> {
    let meta = &event["metadata"];
    let managed = meta["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|entry| &entry["time"]);
    [
        &meta["creationTimestamp"],
        &event["firstTimestamp"],
        &event["lastTimestamp"],
        &event["eventTime"],
        &event["series"]["lastObservedTime"],
        &event["deprecatedLastTimestamp"],
    ]
    .into_iter()
    .chain(managed)
    .filter_map(|v| v.as_str()?.parse::<Timestamp>().ok())
    .max()
}

/// Whether an Event last written at `written` has outlived `ttl` at `now`.
pub fn expired(written: Option<Timestamp>, ttl: Duration, now: Timestamp) -> bool {
    let Ok(ttl) = jiff::SignedDuration::try_from(ttl) else {
        return false;
    };
    written.is_some_and(|written| now.duration_since(written) >= ttl)
}

/// How many expired Events one transaction deletes at most: a sweep holds the store's lock for one batch at a time.
const BATCH: usize = 500;

/// Deletes the Events that have outlived `ttl` at `now`, [`BATCH`] to a transaction (one fsync each, as etcd
/// removes a lease's keys together, instead of one per Event: expiring them then costs the server next to nothing
/// beside the writes that made them); returns how many went.
pub fn sweep(store: &Store, ttl: Duration, now: Timestamp) -> usize {
    let mut deleted = 0;
    for resource in EVENT_RESOURCES {
        let (events, _) = store.list(resource, None);
        let expired_keys: Vec<(String, String)> = events
            .iter()
            .filter(|e| expired(last_write(e), ttl, now))
            .map(|e| {
                let meta = &e["metadata"];
                let field = |f: &str| meta[f].as_str().unwrap_or_default().to_owned();
                (field("namespace"), field("name"))
            })
            .collect();
        for batch in expired_keys.chunks(BATCH) {
            // Decided again under the lock: a write since the listing renews the Event.
            let result = store.mutate_many(resource, batch, |current| {
                Ok(match current {
                    Some(current) if expired(last_write(current), ttl, now) => {
                        Mutation::Delete((**current).clone())
                    }
                    _ => Mutation::Unchanged,
                })
            });
            match result {
                Ok(n) => deleted += n,
                Err(err) => {
                    tracing::warn!(resource, events = batch.len(), error = %err, "could not delete expired events");
                }
            }
        }
    }
    deleted
}

/// How often [`run`] sweeps: a tenth of the TTL, between 1 s and 1 min.
pub fn sweep_period(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_secs(1), Duration::from_mins(1))
}

/// Sweeps every [`sweep_period`] until shutdown.
pub async fn run(store: Arc<Store>, ttl: Duration, mut shutdown: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(sweep_period(ttl));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                let deleted = sweep(&store, ttl, Timestamp::now());
                if deleted > 0 {
                    tracing::debug!(deleted, ttl = ?ttl, "expired events deleted");
                }
            }
            _ = shutdown.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn the_last_write_is_the_latest_time_the_event_carries() {
        let event = json!({
            "metadata": {
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "managedFields": [{"time": "2026-01-01T00:30:00Z"}, {"time": "not a time"}],
            },
            "firstTimestamp": "2026-01-01T00:00:00Z",
            "lastTimestamp": "2026-01-01T00:20:00Z",
        });
        assert_eq!(last_write(&event), Some(at("2026-01-01T00:30:00Z")));
        let series = json!({"metadata": {}, "series": {"lastObservedTime": "2026-01-01T02:00:00.000001Z"}});
        assert_eq!(last_write(&series), Some(at("2026-01-01T02:00:00.000001Z")));
        assert_eq!(last_write(&json!({"metadata": {}})), None);
    }

    #[test]
    fn an_event_expires_once_the_ttl_has_passed_since_its_last_write() {
        let ttl = Duration::from_hours(1);
        let written = Some(at("2026-01-01T00:00:00Z"));
        assert!(!expired(written, ttl, at("2026-01-01T00:59:59Z")));
        assert!(expired(written, ttl, at("2026-01-01T01:00:00Z")));
        assert!(!expired(None, ttl, at("2030-01-01T00:00:00Z")), "no time: kept");
    }

    #[test]
    fn the_sweep_period_is_a_tenth_of_the_ttl_within_bounds() {
        assert_eq!(sweep_period(DEFAULT_EVENT_TTL), Duration::from_mins(1));
        assert_eq!(
            mcm_api::GoDuration::new(DEFAULT_EVENT_TTL_FLAG).parse(),
            Ok(DEFAULT_EVENT_TTL),
            "the flags' default is the default"
        );
        assert_eq!(sweep_period(Duration::from_secs(30)), Duration::from_secs(3));
        assert_eq!(sweep_period(Duration::from_secs(2)), Duration::from_secs(1));
    }

    #[test]
    fn the_sweep_deletes_only_expired_events() {
        let store = Store::open(None, 100).unwrap();
        let event = |name: &str, last: &str| {
            json!({"apiVersion": "v1", "kind": "Event",
                   "metadata": {"name": name, "namespace": "default", "creationTimestamp": "2026-01-01T00:00:00Z"},
                   "lastTimestamp": last})
        };
        for (name, last) in [
            ("old", "2026-01-01T00:00:00Z"),
            ("recent", "2026-01-01T00:50:00Z"),
        ] {
            store
                .mutate("/events", "default", name, |_| {
                    Ok(Mutation::Put(event(name, last)))
                })
                .unwrap();
        }
        assert_eq!(
            sweep(&store, Duration::from_hours(1), at("2026-01-01T01:10:00Z")),
            1
        );
        assert!(store.get("/events", "default", "old").is_none());
        assert!(store.get("/events", "default", "recent").is_some());
    }
}
