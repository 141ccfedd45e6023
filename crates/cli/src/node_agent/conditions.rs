//! The node conditions the agent reports: kubelet's built-in ones, overridden or added by the condition files in
//! `<machine-dir>/conditions/`, merged with what others posted and stamped with heartbeat and transition times.

use std::{
    collections::BTreeMap,
    io::Read as _,
    path::{Path, PathBuf},
};

use k8s_openapi::{api::core::v1::NodeCondition, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};

/// The directory of the condition files in `--machine-dir`.
pub(super) const CONDITIONS_DIR: &str = "conditions";
/// The reason of conditions set by files.
pub(super) const FILE_REASON: &str = "NodeAgentFile";

/// The conditions kubelet posts: type, healthy status, reason, message.
const BUILT_IN_CONDITIONS: [(&str, &str, &str, &str); 4] = [
    (
        "MemoryPressure",
        "False",
        "KubeletHasSufficientMemory",
        "kubelet has sufficient memory available",
    ),
    (
        "DiskPressure",
        "False",
        "KubeletHasNoDiskPressure",
        "kubelet has no disk pressure",
    ),
    (
        "PIDPressure",
        "False",
        "KubeletHasSufficientPID",
        "kubelet has sufficient PID available",
    ),
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
];

/// The status of a condition file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct FileCondition {
    pub(super) status: String,
    pub(super) path: PathBuf,
}

/// A condition type a file may name: letters, digits, `.`, `_`, `-`, starting with a letter or digit.
fn is_condition_type(name: &str) -> bool {
    name.len() <= 316
        && name.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The condition files of a directory; `problems` collects (file, why) of the ignored ones.
pub(super) fn read_condition_files(
    dir: &Path,
    problems: &mut BTreeMap<PathBuf, String>,
) -> BTreeMap<String, FileCondition> {
    let mut conditions = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return conditions;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            problems.insert(path, "the name is not UTF-8".into());
            continue;
        };
        if name.starts_with('.') || !path.is_file() {
            continue;
        }
        if !is_condition_type(&name) {
            problems.insert(path, "the name is not a condition type".into());
            continue;
        }
        let mut content = String::new();
        let read = std::fs::File::open(&path).and_then(|file| file.take(256).read_to_string(&mut content));
        if let Err(err) = read {
            problems.insert(path, format!("unreadable: {err}"));
            continue;
        }
        match content.trim() {
            status @ ("True" | "False" | "Unknown") => {
                conditions.insert(
                    name,
                    FileCondition {
                        status: status.to_owned(),
                        path,
                    },
                );
            }
            other => {
                let shown: String = other.chars().take(32).collect();
                problems.insert(
                    path,
                    format!("the content {shown:?} is not True, False or Unknown"),
                );
            }
        }
    }
    conditions
}

pub(super) fn condition(type_: &str, status: &str, reason: &str, message: &str) -> NodeCondition {
    NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: None,
        last_transition_time: None,
    }
}

/// The conditions the agent reports (without times): the built-in ones, overridden or added by files.
pub(super) fn reported_conditions(files: &BTreeMap<String, FileCondition>) -> Vec<NodeCondition> {
    let from_file = |type_: &str, file: &FileCondition| {
        condition(
            type_,
            &file.status,
            FILE_REASON,
            &format!("set by the file {}", file.path.display()),
        )
    };
    let mut conditions: Vec<NodeCondition> = BUILT_IN_CONDITIONS
        .iter()
        .map(|&(type_, status, reason, message)| match files.get(type_) {
            Some(file) => from_file(type_, file),
            None => condition(type_, status, reason, message),
        })
        .collect();
    for (type_, file) in files {
        if !BUILT_IN_CONDITIONS.iter().any(|c| c.0 == type_) {
            conditions.push(from_file(type_, file));
        }
    }
    conditions
}

/// The conditions to write: `reported`, stamped with `now` as heartbeat and with transition times kept from
/// `current` where the status did not change, followed by the conditions of `current` others posted (not built-in,
/// not reported, not set by a file: a file removed while the agent was down loses its condition too).
pub(super) fn merged_conditions(
    current: &[NodeCondition],
    reported: &[NodeCondition],
    now: Timestamp,
) -> Vec<NodeCondition> {
    let mut merged: Vec<NodeCondition> = reported
        .iter()
        .map(|wanted| {
            let kept = current
                .iter()
                .find(|c| c.type_ == wanted.type_ && c.status == wanted.status)
                .and_then(|c| c.last_transition_time.clone());
            NodeCondition {
                last_heartbeat_time: Some(Time(now)),
                last_transition_time: Some(kept.unwrap_or(Time(now))),
                ..wanted.clone()
            }
        })
        .collect();
    merged.extend(
        current
            .iter()
            .filter(|c| {
                !BUILT_IN_CONDITIONS.iter().any(|b| b.0 == c.type_)
                    && !reported.iter().any(|r| r.type_ == c.type_)
                    && c.reason.as_deref() != Some(FILE_REASON)
            })
            .cloned(),
    );
    merged
}

/// A condition without its times: type, status, reason, message.
type ConditionFingerprint = (String, String, Option<String>, Option<String>);

/// Conditions without times, sorted by type: equal fingerprints need no write.
pub(super) fn fingerprint(conditions: &[NodeCondition]) -> Vec<ConditionFingerprint> {
    let mut list: Vec<_> = conditions
        .iter()
        .map(|c| {
            (
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone(),
                c.message.clone(),
            )
        })
        .collect();
    list.sort();
    list
}
