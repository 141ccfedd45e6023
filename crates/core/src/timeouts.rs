//! The controller's flag defaults and the effective per-machine values.
//!
//! [`ControllerSettings`] holds what the reference's machine-controller flags hold (`--machine-creation-timeout`,
//! `--machine-health-timeout`, …, reference §8.2), with the same defaults, plus this project's retry and remediation
//! knobs. [`effective_settings`] resolves, for one machine, which value applies: the per-machine override
//! (`spec.creationTimeout`, `spec.healthTimeout`, … and, for the creation timeout first of all, the annotation
//! `node.machine.sapcloud.io/effective-creation-timeout`) or the flag.
//!
//! A per-machine value that does not parse (or is negative) is not used: the next source applies and the problem is
//! returned in [`EffectiveSettings::problems`] with the field path, so that the controller can report it. Validation
//! reports the same problem on the object; here it only must not stop the machine from being handled.

use std::time::Duration;

use jiff::Timestamp;
use mcm_api::{GoDuration, Machine, MetaExt, keys::annotations};

use crate::{remediation::RemediationSettings, retry_policy::RetrySettings};

/// The default of `--node-conditions`.
pub const DEFAULT_NODE_CONDITIONS: &str = "KernelDeadlock,ReadonlyFilesystem,DiskPressure,NetworkUnavailable";

/// The machine controller's settings: the reference's flags with their defaults, plus this project's retry policy
/// and remediation guard. Durations are plain [`Duration`]s, so tests and `mcm up` can set them down to seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct ControllerSettings {
    /// `--machine-creation-timeout` (20m): how long a machine may take from creation to a joined node.
    pub machine_creation_timeout: Duration,
    /// `--machine-health-timeout` (10m): how long a machine may stay Unknown before it is marked Failed.
    pub machine_health_timeout: Duration,
    /// `--machine-drain-timeout` (2h): how long a drain may take before it turns into a force drain.
    pub machine_drain_timeout: Duration,
    /// `--machine-inplace-update-timeout` (20m): how long a machine may stay InPlaceUpdating before it is
    /// InPlaceUpdateFailed.
    pub machine_inplace_update_timeout: Duration,
    /// `--machine-preserve-timeout` (96h).
    pub machine_preserve_timeout: Duration,
    /// `--machine-max-evict-retries` (360).
    pub max_evict_retries: i32,
    /// `--machine-pv-detach-timeout` (2m): how long a drain waits for the volumes of an evicted pod to detach from the
    /// node (on top of the pod's termination grace period).
    pub machine_pv_detach_timeout: Duration,
    /// `--machine-pv-reattach-timeout` (90s): how long a drain waits for those volumes to attach to another node.
    pub machine_pv_reattach_timeout: Duration,
    /// Pause between two eviction attempts of a pod refused by a PodDisruptionBudget (20s; the reference's fixed
    /// `PodEvictionRetryInterval`, settable here).
    pub evict_retry_interval: Duration,
    /// A node not Ready, or with a read-only filesystem, for at least this long is force-drained (5m; fixed in the
    /// reference, settable here).
    pub force_drain_unhealthy_after: Duration,
    /// `--node-conditions`, split: condition types that make a node unhealthy unless they are False.
    pub node_conditions: Vec<String>,
    /// `--bootstrap-token-auth-extra-groups` ("" = none): the `auth-extra-groups` of bootstrap tokens.
    pub bootstrap_token_auth_extra_groups: String,
    /// The node this controller runs on, if known (`--controller-node`, default `$NODE_NAME`): its machine is never
    /// drained or deleted (spec 004).
    pub controller_node: Option<String>,
    /// Retry policy of failed provider calls.
    pub retry: RetrySettings,
    /// The remediation guard (how many unhealthy machines are replaced at once).
    pub remediation: RemediationSettings,
}

impl Default for ControllerSettings {
    fn default() -> Self {
        Self {
            machine_creation_timeout: Duration::from_mins(20),
            machine_health_timeout: Duration::from_mins(10),
            machine_drain_timeout: Duration::from_hours(2),
            machine_inplace_update_timeout: Duration::from_mins(20),
            machine_preserve_timeout: Duration::from_hours(96),
            max_evict_retries: 360,
            machine_pv_detach_timeout: Duration::from_mins(2),
            machine_pv_reattach_timeout: Duration::from_secs(90),
            evict_retry_interval: Duration::from_secs(20),
            force_drain_unhealthy_after: Duration::from_mins(5),
            node_conditions: parse_node_conditions(DEFAULT_NODE_CONDITIONS),
            bootstrap_token_auth_extra_groups: String::new(),
            controller_node: None,
            retry: RetrySettings::default(),
            remediation: RemediationSettings::default(),
        }
    }
}

/// Splits a `--node-conditions` / `spec.nodeConditions` list: comma-separated, white space around entries ignored,
/// empty entries dropped (the reference splits without trimming, so `"A, B"` would never match `B` there).
pub fn parse_node_conditions(csv: &str) -> Vec<String> {
    csv.split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Where an effective value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueSource {
    /// The machine's `node.machine.sapcloud.io/effective-creation-timeout` annotation.
    Annotation,
    /// The machine's spec (`spec.creationTimeout`, …).
    MachineSpec,
    /// The controller flag.
    Flag,
}

/// A per-machine value that could not be used, with its field path; the next source was used instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}; the controller's default is used")]
pub struct SettingProblem {
    /// The field path, as validation prints it (`spec.healthTimeout`,
    /// `metadata.annotations[node.machine.sapcloud.io/effective-creation-timeout]`).
    pub field: String,
    /// Why the value could not be used.
    pub reason: String,
}

/// The values that apply to one machine.
#[derive(Clone, Debug, PartialEq)]
pub struct EffectiveSettings {
    /// The creation timeout (annotation, then `spec.creationTimeout`, then the flag).
    pub creation_timeout: Duration,
    /// Where the creation timeout came from.
    pub creation_timeout_source: ValueSource,
    /// The health timeout (`spec.healthTimeout`, then the flag).
    pub health_timeout: Duration,
    /// `spec.disableHealthTimeout`: the machine is never marked Failed for being unhealthy.
    pub health_timeout_disabled: bool,
    /// The drain timeout (`spec.drainTimeout`, then the flag).
    pub drain_timeout: Duration,
    /// The in-place update timeout (`spec.inPlaceUpdateTimeout`, then the flag).
    pub inplace_update_timeout: Duration,
    /// The preservation timeout (`spec.machinePreserveTimeout`, then the flag).
    pub preserve_timeout: Duration,
    /// Eviction retries of a drain (`spec.maxEvictRetries`, then the flag); see `drain::max_evict_retries` for the
    /// value a drain uses.
    pub max_evict_retries: i32,
    /// How long a drain waits for an evicted pod's volumes to detach (the flag).
    pub pv_detach_timeout: Duration,
    /// How long a drain waits for those volumes to attach elsewhere (the flag).
    pub pv_reattach_timeout: Duration,
    /// Pause between eviction attempts of a pod (the setting).
    pub evict_retry_interval: Duration,
    /// Unhealthy (not Ready, read-only filesystem) for this long turns a drain into a force drain (the setting).
    pub force_drain_unhealthy_after: Duration,
    /// Condition types that make the node unhealthy unless False (`spec.nodeConditions`, then the flag).
    pub node_conditions: Vec<String>,
    /// Per-machine values that were ignored, and why.
    pub problems: Vec<SettingProblem>,
}

fn parse_override(
    value: Option<&GoDuration>,
    field: &str,
    problems: &mut Vec<SettingProblem>,
) -> Option<Duration> {
    let value = value?;
    match value.parse() {
        Ok(duration) => Some(duration),
        Err(err) => {
            problems.push(SettingProblem {
                field: field.to_owned(),
                reason: err.to_string(),
            });
            None
        }
    }
}

/// Resolves the values that apply to `machine`.
pub fn effective_settings(machine: &Machine, settings: &ControllerSettings) -> EffectiveSettings {
    let config = &machine.spec.configuration;
    let mut problems = Vec::new();

    let annotation = machine
        .annotation(annotations::EFFECTIVE_CREATION_TIMEOUT)
        .map(GoDuration::new);
    let annotation_field = format!(
        "metadata.annotations[{}]",
        annotations::EFFECTIVE_CREATION_TIMEOUT
    );
    let (creation_timeout, creation_timeout_source) =
        if let Some(d) = parse_override(annotation.as_ref(), &annotation_field, &mut problems) {
            (d, ValueSource::Annotation)
        } else if let Some(d) = parse_override(
            config.creation_timeout.as_ref(),
            "spec.creationTimeout",
            &mut problems,
        ) {
            (d, ValueSource::MachineSpec)
        } else {
            (settings.machine_creation_timeout, ValueSource::Flag)
        };

    let health_timeout = parse_override(
        config.health_timeout.as_ref(),
        "spec.healthTimeout",
        &mut problems,
    )
    .unwrap_or(settings.machine_health_timeout);
    let drain_timeout = parse_override(config.drain_timeout.as_ref(), "spec.drainTimeout", &mut problems)
        .unwrap_or(settings.machine_drain_timeout);
    let inplace_update_timeout = parse_override(
        config.in_place_update_timeout.as_ref(),
        "spec.inPlaceUpdateTimeout",
        &mut problems,
    )
    .unwrap_or(settings.machine_inplace_update_timeout);
    let preserve_timeout = parse_override(
        config.machine_preserve_timeout.as_ref(),
        "spec.machinePreserveTimeout",
        &mut problems,
    )
    .unwrap_or(settings.machine_preserve_timeout);

    let max_evict_retries = match config.max_evict_retries {
        Some(n) if n < 0 => {
            problems.push(SettingProblem {
                field: "spec.maxEvictRetries".into(),
                reason: format!("must not be negative, got {n}"),
            });
            settings.max_evict_retries
        }
        Some(n) => n,
        None => settings.max_evict_retries,
    };

    let node_conditions = config
        .node_conditions
        .as_deref()
        .map_or_else(|| settings.node_conditions.clone(), parse_node_conditions);

    EffectiveSettings {
        creation_timeout,
        creation_timeout_source,
        health_timeout,
        health_timeout_disabled: config.disable_health_timeout.unwrap_or(false),
        drain_timeout,
        inplace_update_timeout,
        preserve_timeout,
        max_evict_retries,
        pv_detach_timeout: settings.machine_pv_detach_timeout,
        pv_reattach_timeout: settings.machine_pv_reattach_timeout,
        evict_retry_interval: settings.evict_retry_interval,
        force_drain_unhealthy_after: settings.force_drain_unhealthy_after,
        node_conditions,
        problems,
    }
}

/// The creation timeout that applies to `machine` (see [`effective_settings`]).
pub fn effective_creation_timeout(machine: &Machine, settings: &ControllerSettings) -> Duration {
    effective_settings(machine, settings).creation_timeout
}

/// `start + duration`, saturating at the end of time instead of failing.
pub fn add(start: Timestamp, duration: Duration) -> Timestamp {
    start.saturating_add(duration).unwrap_or(Timestamp::MAX)
}

/// `later - earlier`, zero when `later` is not after `earlier`.
pub(crate) fn elapsed(earlier: Timestamp, later: Timestamp) -> Duration {
    Duration::try_from(later.duration_since(earlier)).unwrap_or(Duration::ZERO)
}

/// The machine's creation timestamp, if the API server stored it.
pub(crate) fn created_at(machine: &Machine) -> Option<Timestamp> {
    machine.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn machine() -> Machine {
        Machine::default()
    }

    #[test]
    fn defaults_are_the_references_flags() {
        let s = ControllerSettings::default();
        assert_eq!(s.machine_creation_timeout, Duration::from_mins(20));
        assert_eq!(s.machine_health_timeout, Duration::from_mins(10));
        assert_eq!(s.machine_drain_timeout, Duration::from_hours(2));
        assert_eq!(s.machine_inplace_update_timeout, Duration::from_mins(20));
        assert_eq!(s.machine_preserve_timeout, Duration::from_hours(96));
        assert_eq!(s.max_evict_retries, 360);
        assert_eq!(s.machine_pv_detach_timeout, Duration::from_mins(2));
        assert_eq!(s.machine_pv_reattach_timeout, Duration::from_secs(90));
        assert_eq!(s.evict_retry_interval, Duration::from_secs(20));
        assert_eq!(s.force_drain_unhealthy_after, Duration::from_mins(5));
        assert_eq!(
            s.node_conditions,
            [
                "KernelDeadlock",
                "ReadonlyFilesystem",
                "DiskPressure",
                "NetworkUnavailable"
            ]
        );
        assert!(s.bootstrap_token_auth_extra_groups.is_empty());
    }

    #[test]
    fn without_overrides_the_flags_apply() {
        let settings = ControllerSettings {
            machine_creation_timeout: Duration::from_secs(3),
            ..ControllerSettings::default()
        };
        let effective = effective_settings(&machine(), &settings);
        assert_eq!(effective.creation_timeout, Duration::from_secs(3));
        assert_eq!(effective.creation_timeout_source, ValueSource::Flag);
        assert_eq!(effective.health_timeout, Duration::from_mins(10));
        assert!(!effective.health_timeout_disabled);
        assert!(effective.problems.is_empty());
    }

    #[test]
    fn the_annotation_wins_over_the_spec_and_the_spec_over_the_flag() {
        let mut m = machine();
        m.spec.configuration.creation_timeout = Some(GoDuration::new("30m"));
        assert_eq!(
            effective_creation_timeout(&m, &ControllerSettings::default()),
            Duration::from_mins(30)
        );
        m.metadata.annotations = Some(BTreeMap::from([(
            annotations::EFFECTIVE_CREATION_TIMEOUT.to_owned(),
            "45m".to_owned(),
        )]));
        let effective = effective_settings(&m, &ControllerSettings::default());
        assert_eq!(effective.creation_timeout, Duration::from_mins(45));
        assert_eq!(effective.creation_timeout_source, ValueSource::Annotation);
    }

    #[test]
    fn invalid_values_fall_back_and_are_reported_with_their_path() {
        let mut m = machine();
        m.metadata.annotations = Some(BTreeMap::from([(
            annotations::EFFECTIVE_CREATION_TIMEOUT.to_owned(),
            "soon".to_owned(),
        )]));
        m.spec.configuration.creation_timeout = Some(GoDuration::new("7m"));
        m.spec.configuration.health_timeout = Some(GoDuration::new("-1m"));
        m.spec.configuration.drain_timeout = Some(GoDuration::new("5 minutes"));
        m.spec.configuration.max_evict_retries = Some(-3);
        let effective = effective_settings(&m, &ControllerSettings::default());
        assert_eq!(effective.creation_timeout, Duration::from_mins(7));
        assert_eq!(effective.creation_timeout_source, ValueSource::MachineSpec);
        assert_eq!(effective.health_timeout, Duration::from_mins(10));
        assert_eq!(effective.drain_timeout, Duration::from_hours(2));
        assert_eq!(effective.max_evict_retries, 360);
        let fields: Vec<&str> = effective.problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "metadata.annotations[node.machine.sapcloud.io/effective-creation-timeout]",
                "spec.healthTimeout",
                "spec.drainTimeout",
                "spec.maxEvictRetries"
            ]
        );
        assert!(effective.problems[0].to_string().contains("soon"));
    }

    #[test]
    fn node_conditions_and_health_switches_come_from_the_spec() {
        let mut m = machine();
        m.spec.configuration.node_conditions = Some(" DiskPressure ,,MemoryPressure".into());
        m.spec.configuration.disable_health_timeout = Some(true);
        m.spec.configuration.health_timeout = Some(GoDuration::new("90s"));
        m.spec.configuration.max_evict_retries = Some(3);
        let effective = effective_settings(&m, &ControllerSettings::default());
        assert_eq!(effective.node_conditions, ["DiskPressure", "MemoryPressure"]);
        assert!(effective.health_timeout_disabled);
        assert_eq!(effective.health_timeout, Duration::from_secs(90));
        assert_eq!(effective.max_evict_retries, 3);
    }

    #[test]
    fn drain_values_come_from_the_spec_and_the_flags() {
        // Reference §4: effective drainTimeout and maxEvictRetries are spec.drainTimeout / spec.maxEvictRetries, then
        // the flags; the volume timeouts and the force-drain period are flags only.
        let mut m = machine();
        m.spec.configuration.drain_timeout = Some(GoDuration::new("10m"));
        m.spec.configuration.max_evict_retries = Some(7);
        let settings = ControllerSettings {
            machine_pv_detach_timeout: Duration::from_secs(30),
            evict_retry_interval: Duration::from_secs(2),
            ..ControllerSettings::default()
        };
        let effective = effective_settings(&m, &settings);
        assert_eq!(effective.drain_timeout, Duration::from_mins(10));
        assert_eq!(effective.max_evict_retries, 7);
        assert_eq!(effective.pv_detach_timeout, Duration::from_secs(30));
        assert_eq!(effective.pv_reattach_timeout, Duration::from_secs(90));
        assert_eq!(effective.evict_retry_interval, Duration::from_secs(2));
        assert_eq!(effective.force_drain_unhealthy_after, Duration::from_mins(5));
        assert!(effective.problems.is_empty());
    }

    #[test]
    fn time_arithmetic_saturates() {
        let t = Timestamp::from_second(10).unwrap();
        assert_eq!(add(t, Duration::MAX), Timestamp::MAX);
        assert_eq!(elapsed(t, Timestamp::UNIX_EPOCH), Duration::ZERO);
        assert_eq!(elapsed(Timestamp::UNIX_EPOCH, t), Duration::from_secs(10));
    }
}
