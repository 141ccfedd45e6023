//! The node conditions the agent reports: kubelet's built-in ones, overridden or added by the condition files in
//! `<machine-dir>/conditions/`, merged with what others posted and stamped with heartbeat and transition times.

use std::{
    collections::BTreeMap,
    io::Read as _,
    path::{Path, PathBuf},
};

use k8s_openapi::{api::core::v1::NodeCondition, jiff::Timestamp};
use mcm_core::node_report::{self, condition};

/// The directory of the condition files in `--machine-dir`.
pub(super) const CONDITIONS_DIR: &str = "conditions";
/// The reason of conditions set by files.
pub(super) const FILE_REASON: &str = "NodeAgentFile";

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

/// The conditions the agent reports (without times): kubelet's, overridden or added by files.
pub(super) fn reported_conditions(files: &BTreeMap<String, FileCondition>) -> Vec<NodeCondition> {
    let from_file = |type_: &str, file: &FileCondition| {
        condition(
            type_,
            &file.status,
            FILE_REASON,
            &format!("set by the file {}", file.path.display()),
        )
    };
    node_report::reported_conditions(
        |kubelet| {
            files
                .get(kubelet.type_)
                .map(|file| from_file(kubelet.type_, file))
        },
        files
            .iter()
            .filter(|(type_, _)| !node_report::is_kubelet_condition(type_))
            .map(|(type_, file)| from_file(type_, file)),
    )
}

/// The conditions to write: `reported`, stamped with `now` as heartbeat and with transition times kept from
/// `current` where the status did not change, followed by the conditions of `current` others posted (not
/// kubelet's, not reported, not set by a file: a file removed while the agent was down loses its condition too).
pub(super) fn merged_conditions(
    current: &[NodeCondition],
    reported: &[NodeCondition],
    now: Timestamp,
) -> Vec<NodeCondition> {
    let mut merged = reported.to_vec();
    node_report::stamp(&mut merged, current, now);
    merged.extend(
        current
            .iter()
            .filter(|c| {
                !node_report::is_kubelet_condition(&c.type_)
                    && !reported.iter().any(|r| r.type_ == c.type_)
                    && c.reason.as_deref() != Some(FILE_REASON)
            })
            .cloned(),
    );
    merged
}
