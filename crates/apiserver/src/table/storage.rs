//! Storage printers: PersistentVolume, PersistentVolumeClaim and VolumeAttachment, with the access-mode
//! abbreviations and storage class lookup they share.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::printer::{AGE, Col, NAME, col, wide};
use super::values::{array_at, at, creation_age, int_or_string, name_of, str_at, string_at};
use crate::metadata::is_deleting;

fn access_modes(modes: &[Value]) -> String {
    let has = |mode: &str| modes.iter().any(|m| m.as_str() == Some(mode));
    [
        ("ReadWriteOnce", "RWO"),
        ("ReadOnlyMany", "ROX"),
        ("ReadWriteMany", "RWX"),
        ("ReadWriteOncePod", "RWOP"),
    ]
    .iter()
    .filter(|(mode, _)| has(mode))
    .map(|(_, short)| *short)
    .collect::<Vec<_>>()
    .join(",")
}

fn storage_class(obj: &Value) -> String {
    str_at(
        obj,
        &[
            "metadata",
            "annotations",
            "volume.beta.kubernetes.io/storage-class",
        ],
    )
    .or_else(|| str_at(obj, &["spec", "storageClassName"]))
    .unwrap_or_default()
    .to_owned()
}

fn unset_or(v: Option<&str>) -> String {
    v.filter(|s| !s.is_empty()).unwrap_or("<unset>").to_owned()
}

pub(super) const PV_COLUMNS: &[Col] = &[
    NAME,
    col(
        "Capacity",
        "capacity is the description of the persistent volume's resources and capacity.",
    ),
    col(
        "Access Modes",
        "accessModes contains all ways the volume can be mounted.",
    ),
    col(
        "Reclaim Policy",
        "persistentVolumeReclaimPolicy defines what happens to a persistent volume when released from its claim.",
    ),
    col(
        "Status",
        "phase indicates if a volume is available, bound to a claim, or released by a claim.",
    ),
    col(
        "Claim",
        "claimRef is part of a bi-directional binding between PersistentVolume and PersistentVolumeClaim.",
    ),
    col("StorageClass", "StorageClass of the pv"),
    col("VolumeAttributesClass", "VolumeAttributesClass of the pv"),
    col(
        "Reason",
        "reason is a brief CamelCase string that describes any failure.",
    ),
    AGE,
    wide(
        "VolumeMode",
        "volumeMode defines if a volume is intended to be used with a formatted filesystem or to remain in raw block state.",
    ),
];

pub(super) fn pv_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    let claim = match at(obj, &["spec", "claimRef"]).filter(|c| c.is_object()) {
        Some(c) => format!("{}/{}", string_at(c, &["namespace"]), string_at(c, &["name"])),
        None => String::new(),
    };
    let phase = if is_deleting(obj) {
        "Terminating".to_owned()
    } else {
        string_at(obj, &["status", "phase"])
    };
    vec![
        json!(name_of(obj)),
        json!(int_or_string(at(obj, &["spec", "capacity", "storage"])).unwrap_or_default()),
        json!(access_modes(array_at(obj, &["spec", "accessModes"]))),
        json!(string_at(obj, &["spec", "persistentVolumeReclaimPolicy"])),
        json!(phase),
        json!(claim),
        json!(storage_class(obj)),
        json!(unset_or(str_at(obj, &["spec", "volumeAttributesClassName"]))),
        json!(string_at(obj, &["status", "reason"])),
        creation_age(obj, now),
        json!(unset_or(str_at(obj, &["spec", "volumeMode"]))),
    ]
}

pub(super) const PVC_COLUMNS: &[Col] = &[
    NAME,
    col(
        "Status",
        "phase represents the current phase of PersistentVolumeClaim.",
    ),
    col(
        "Volume",
        "volumeName is the binding reference to the PersistentVolume backing this claim.",
    ),
    col(
        "Capacity",
        "capacity represents the actual resources of the underlying volume.",
    ),
    col(
        "Access Modes",
        "accessModes contains the actual access modes the volume backing the PVC has.",
    ),
    col("StorageClass", "StorageClass of the pvc"),
    col("VolumeAttributesClass", "VolumeAttributesClass of the pvc"),
    AGE,
    wide(
        "VolumeMode",
        "volumeMode defines what type of volume is required by the claim.",
    ),
];

pub(super) fn pvc_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    let phase = if is_deleting(obj) {
        "Terminating".to_owned()
    } else {
        string_at(obj, &["status", "phase"])
    };
    let volume = string_at(obj, &["spec", "volumeName"]);
    let (capacity, modes) = if volume.is_empty() {
        (String::new(), String::new())
    } else {
        (
            int_or_string(at(obj, &["status", "capacity", "storage"])).unwrap_or_default(),
            access_modes(array_at(obj, &["status", "accessModes"])),
        )
    };
    vec![
        json!(name_of(obj)),
        json!(phase),
        json!(volume),
        json!(capacity),
        json!(modes),
        json!(storage_class(obj)),
        json!(unset_or(str_at(obj, &["spec", "volumeAttributesClassName"]))),
        creation_age(obj, now),
        json!(unset_or(str_at(obj, &["spec", "volumeMode"]))),
    ]
}

pub(super) const VOLUME_ATTACHMENT_COLUMNS: &[Col] = &[
    NAME,
    col(
        "Attacher",
        "attacher indicates the name of the volume driver that MUST handle this request.",
    ),
    col(
        "PV",
        "persistentVolumeName represents the name of the persistent volume to attach.",
    ),
    col(
        "Node",
        "nodeName represents the node that the volume should be attached to.",
    ),
    Col {
        name: "Attached",
        type_: "boolean",
        format: "",
        description: "attached indicates the volume is successfully attached.",
        priority: 0,
    },
    AGE,
];

pub(super) fn volume_attachment_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        json!(name_of(obj)),
        json!(string_at(obj, &["spec", "attacher"])),
        json!(string_at(obj, &["spec", "source", "persistentVolumeName"])),
        json!(string_at(obj, &["spec", "nodeName"])),
        json!(
            at(obj, &["status", "attached"])
                .and_then(Value::as_bool)
                .unwrap_or(false)
        ),
        creation_age(obj, now),
    ]
}
