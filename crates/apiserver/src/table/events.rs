//! The Event printer, for both event APIs (`v1` Events and `events.k8s.io` Events): their fields are read into
//! one view, then printed as the real server prints either.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::age::age_since;
use super::printer::{Col, NAME_DESCRIPTION, col, wide};
use super::values::{at, int_at, name_of, str_at};

pub(super) const EVENT_COLUMNS: &[Col] = &[
    col(
        "Last Seen",
        "The time at which the most recent occurrence of this event was recorded.",
    ),
    col(
        "Type",
        "Type of this event (Normal, Warning), new types could be added in the future",
    ),
    col(
        "Reason",
        "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.",
    ),
    col("Object", "The object that this event is about."),
    wide(
        "Subobject",
        "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement.",
    ),
    wide("Source", "The component reporting this event."),
    col(
        "Message",
        "A human-readable description of the status of this operation.",
    ),
    wide("First Seen", "The time at which the event was first recorded."),
    wide("Count", "The number of times this event has occurred."),
    Col {
        name: "Name",
        type_: "string",
        format: "name",
        description: NAME_DESCRIPTION,
        priority: 1,
    },
];

/// The fields of an event that its table shows, read from either event API.
struct EventView<'v> {
    first_timestamp: Option<&'v str>,
    last_timestamp: Option<&'v str>,
    event_time: Option<&'v str>,
    series: Option<&'v Value>,
    count: i64,
    object: &'v Value,
    type_: &'v str,
    reason: &'v str,
    message: &'v str,
    source_component: &'v str,
    source_host: &'v str,
    reporting_controller: &'v str,
    reporting_instance: &'v str,
}

pub(super) fn core_event_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    let s = |path: &[&str]| str_at(obj, path).unwrap_or_default();
    event_row(
        obj,
        &EventView {
            first_timestamp: str_at(obj, &["firstTimestamp"]),
            last_timestamp: str_at(obj, &["lastTimestamp"]),
            event_time: str_at(obj, &["eventTime"]),
            series: at(obj, &["series"]).filter(|v| v.is_object()),
            count: int_at(obj, &["count"]),
            object: at(obj, &["involvedObject"]).unwrap_or(&Value::Null),
            type_: s(&["type"]),
            reason: s(&["reason"]),
            message: s(&["message"]),
            source_component: s(&["source", "component"]),
            source_host: s(&["source", "host"]),
            reporting_controller: s(&["reportingComponent"]),
            reporting_instance: s(&["reportingInstance"]),
        },
        now,
    )
}

pub(super) fn events_event_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    let s = |path: &[&str]| str_at(obj, path).unwrap_or_default();
    event_row(
        obj,
        &EventView {
            first_timestamp: str_at(obj, &["deprecatedFirstTimestamp"]),
            last_timestamp: str_at(obj, &["deprecatedLastTimestamp"]),
            event_time: str_at(obj, &["eventTime"]),
            series: at(obj, &["series"]).filter(|v| v.is_object()),
            count: int_at(obj, &["deprecatedCount"]),
            object: at(obj, &["regarding"]).unwrap_or(&Value::Null),
            type_: s(&["type"]),
            reason: s(&["reason"]),
            message: s(&["note"]),
            source_component: s(&["deprecatedSource", "component"]),
            source_host: s(&["deprecatedSource", "host"]),
            reporting_controller: s(&["reportingController"]),
            reporting_instance: s(&["reportingInstance"]),
        },
        now,
    )
}

fn event_row(obj: &Value, e: &EventView<'_>, now: Timestamp) -> Vec<Value> {
    let first_seen = match e.first_timestamp.filter(|t| !t.is_empty()) {
        Some(t) => age_since(Some(t), now),
        None => age_since(e.event_time, now),
    };
    let mut last_seen = match e.last_timestamp.filter(|t| !t.is_empty()) {
        Some(t) => age_since(Some(t), now),
        None => first_seen.clone(),
    };
    let mut count = e.count;
    if let Some(series) = e.series {
        last_seen = age_since(str_at(series, &["lastObservedTime"]), now);
        count = int_at(series, &["count"]);
    } else if count == 0 {
        count = 1;
    }
    let kind = str_at(e.object, &["kind"]).unwrap_or_default().to_lowercase();
    let target = match str_at(e.object, &["name"]).filter(|n| !n.is_empty()) {
        Some(name) => format!("{kind}/{name}"),
        None => kind,
    };
    let component = if e.source_component.is_empty() {
        e.reporting_controller
    } else {
        e.source_component
    };
    let instance = if e.source_host.is_empty() {
        e.reporting_instance
    } else {
        e.source_host
    };
    let source = match (component.is_empty(), instance.is_empty()) {
        (true, _) => String::new(),
        (false, true) => component.to_owned(),
        (false, false) => format!("{component}, {instance}"),
    };
    vec![
        json!(last_seen),
        json!(e.type_),
        json!(e.reason),
        json!(target),
        json!(str_at(e.object, &["fieldPath"]).unwrap_or_default()),
        json!(source),
        json!(e.message.trim()),
        json!(first_seen),
        json!(count),
        json!(name_of(obj)),
    ]
}
