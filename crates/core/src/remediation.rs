//! The remediation guard: which unhealthy machines may be marked Failed (and so replaced) now.
//!
//! Machines are grouped as the reference groups them for its meltdown protection (reference §3.4, PR #683): by
//! MachineDeployment, read from the machine label `name`; a machine without that label by its controlling
//! MachineSet (controller ownerReference); a lone machine by itself. Within a group:
//!
//! 1. at most [`RemediationSettings::max_concurrent_replacements`] replacements are in progress at a time (default 1,
//!    the reference's fixed `maxReplacements`);
//! 2. none while more than [`RemediationSettings::max_unhealthy_share`] of the group is unhealthy (Unknown) at once
//!    (default 0.5): a zonal outage or a network partition makes many nodes look dead together, and replacing them
//!    does not help (issues #354, #760) — except that a single unhealthy machine is always eligible, so a group of
//!    one or two machines can still heal.
//!
//! What counts: a replacement has a side going away (a machine Failed, Terminating or being deleted) and a side
//! coming up (a machine not settled yet: new, Pending, CrashLoopBackOff, or in an in-place phase; and, when the
//! caller passes the group's desired replicas, a machine not even created yet). The replacements in progress are
//! the larger of the two sides; preserved machines count on neither (as in the reference).
//!
//! **Deliberate difference:** the reference adds both sides up (every machine whose phase is not Running or
//! Unknown) and counts a Terminating machine twice, "to avoid the case where the MachineSet controller is late in
//! adding the new machine". With the default maximum of 1 both counts block in exactly the same situations (any
//! unsettled machine blocks); with a larger maximum the reference's count would charge one replacement two or three
//! times. Here each replacement counts once, and the lag the reference guards against is covered exactly by the
//! desired replicas: a replacement that is not created yet still counts.

use std::{collections::BTreeMap, fmt, time::Duration};

use jiff::Timestamp;
use k8s_openapi::Resource as _;
use mcm_api::{Machine, MachinePhase, MachineSet, MetaExt, keys::labels};

/// Settings of the remediation guard.
#[derive(Clone, Debug, PartialEq)]
pub struct RemediationSettings {
    /// Replacements in progress at a time per group (1, as the reference). 0 turns automatic replacement off.
    pub max_concurrent_replacements: usize,
    /// Above this share of unhealthy machines in a group, none is replaced (0.5). Values outside `[0, 1]` are
    /// clamped; NaN reads as the default.
    pub max_unhealthy_share: f64,
    /// How soon a machine whose replacement was deferred is looked at again (10s).
    pub recheck_interval: Duration,
}

impl Default for RemediationSettings {
    fn default() -> Self {
        Self {
            max_concurrent_replacements: 1,
            max_unhealthy_share: 0.5,
            recheck_interval: Duration::from_secs(10),
        }
    }
}

impl RemediationSettings {
    fn share_threshold(&self) -> f64 {
        if self.max_unhealthy_share.is_nan() {
            0.5
        } else {
            self.max_unhealthy_share.clamp(0.0, 1.0)
        }
    }
}

/// The group a machine is remediated in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GroupKey {
    /// Machines of a MachineDeployment (label `name`).
    MachineDeployment {
        /// Namespace.
        namespace: String,
        /// The deployment's name.
        name: String,
    },
    /// Machines of a MachineSet without a deployment label (controller ownerReference).
    MachineSet {
        /// Namespace.
        namespace: String,
        /// The set's name.
        name: String,
    },
    /// A machine on its own.
    Machine {
        /// Namespace.
        namespace: String,
        /// The machine's name.
        name: String,
    },
}

/// The group of a machine.
pub fn group_key(machine: &Machine) -> GroupKey {
    let namespace = machine.metadata.namespace.clone().unwrap_or_default();
    if let Some(name) = machine.label(labels::NAME).filter(|n| !n.is_empty()) {
        return GroupKey::MachineDeployment {
            namespace,
            name: name.to_owned(),
        };
    }
    if let Some(owner) = machine.controller_ref_of_kind(MachineSet::KIND) {
        return GroupKey::MachineSet {
            namespace,
            name: owner.name.clone(),
        };
    }
    GroupKey::Machine {
        namespace,
        name: machine.metadata.name.clone().unwrap_or_default(),
    }
}

/// Groups machines by [`group_key`].
pub fn group_machines<'a>(
    machines: impl IntoIterator<Item = &'a Machine>,
) -> BTreeMap<GroupKey, Vec<&'a Machine>> {
    let mut groups: BTreeMap<GroupKey, Vec<&Machine>> = BTreeMap::new();
    for machine in machines {
        groups.entry(group_key(machine)).or_default().push(machine);
    }
    groups
}

/// What the guard counted in a group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupCounts {
    /// Machines in the group.
    pub total: usize,
    /// Machines in phase Unknown (not being deleted).
    pub unhealthy: usize,
    /// Machines going away: Failed, Terminating or being deleted (not preserved).
    pub going: usize,
    /// Machines coming up: not settled yet (not preserved), plus desired machines not created yet.
    pub coming: usize,
    /// Replacements in progress: the larger of `going` and `coming`.
    pub in_progress: usize,
}

/// Not going ([`Machine::is_failed_or_terminating`]) and not settled (Running, Unknown or Available).
fn is_coming(machine: &Machine) -> bool {
    !machine.is_failed_or_terminating()
        && !matches!(
            machine.phase(),
            Some(MachinePhase::Running | MachinePhase::Unknown | MachinePhase::Available)
        )
}

/// Counts a group. `desired_replicas` is the group's desired machine count when the caller knows it (the
/// deployment's or set's `spec.replicas`); desired machines not created yet count as coming.
pub fn count(group: &[&Machine], desired_replicas: Option<u32>, now: Timestamp) -> GroupCounts {
    let unhealthy = group
        .iter()
        .filter(|m| !m.is_deleting() && m.phase() == Some(MachinePhase::Unknown))
        .count();
    let counted = || group.iter().filter(|m| !m.is_preserved(now));
    let going = counted().filter(|m| m.is_failed_or_terminating()).count();
    let mut coming = counted().filter(|m| is_coming(m)).count();
    if let Some(desired) = desired_replicas {
        let active = group.iter().filter(|m| !m.is_failed_or_terminating()).count();
        let desired = usize::try_from(desired).unwrap_or(usize::MAX);
        coming = coming.saturating_add(desired.saturating_sub(active));
    }
    GroupCounts {
        total: group.len(),
        unhealthy,
        going,
        coming,
        in_progress: going.max(coming),
    }
}

/// Why a candidate is not marked Failed now.
#[derive(Clone, Debug, PartialEq)]
pub enum DeferReason {
    /// The machine is not in the group, or not Unknown (any more).
    NotEligible,
    /// The group has as many replacements in progress as allowed.
    TooManyInProgress {
        /// Replacements in progress, those allowed in this decision included.
        in_progress: usize,
        /// The maximum.
        max: usize,
    },
    /// Too large a share of the group is unhealthy at once.
    UnhealthyShareTooHigh {
        /// Unhealthy machines.
        unhealthy: usize,
        /// Machines in the group.
        total: usize,
        /// The threshold.
        max_share: f64,
    },
}

impl fmt::Display for DeferReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotEligible => f.write_str("the machine is not unhealthy in its group"),
            Self::TooManyInProgress { in_progress, max } => write!(
                f,
                "{in_progress} replacement(s) in progress in the machine's group; at most {max} at a time"
            ),
            Self::UnhealthyShareTooHigh {
                unhealthy,
                total,
                max_share,
            } => write!(
                f,
                "{unhealthy} of {total} machines of the group are unhealthy, more than {:.0}%: no machine is replaced \
                 while so many are unhealthy at once",
                max_share * 100.0
            ),
        }
    }
}

/// A candidate that is not marked Failed now.
#[derive(Clone, Debug, PartialEq)]
pub struct Deferred {
    /// The machine's name.
    pub machine: String,
    /// Why.
    pub reason: DeferReason,
}

/// The guard's answer for one group.
#[derive(Clone, Debug, PartialEq)]
#[must_use]
pub struct RemediationDecision {
    /// Candidates that may be marked Failed now, longest unhealthy first.
    pub allowed: Vec<String>,
    /// Candidates that may not, with the reason (for events and the requeue).
    pub deferred: Vec<Deferred>,
    /// What the guard counted before this decision.
    pub counts: GroupCounts,
}

/// Decides which of `candidates` (names of machines of `group` whose health timeout expired) may be marked Failed
/// now. `group` holds every machine of the group, the candidates included.
pub fn decide(
    group: &[&Machine],
    candidates: &[&str],
    desired_replicas: Option<u32>,
    now: Timestamp,
    settings: &RemediationSettings,
) -> RemediationDecision {
    let counts = count(group, desired_replicas, now);
    let mut eligible: Vec<&Machine> = Vec::new();
    let mut deferred = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for &candidate in candidates {
        if seen.contains(&candidate) {
            continue;
        }
        seen.push(candidate);
        match group
            .iter()
            .find(|m| m.metadata.name.as_deref() == Some(candidate))
        {
            Some(machine) if !machine.is_deleting() && machine.phase() == Some(MachinePhase::Unknown) => {
                eligible.push(machine);
            }
            _ => deferred.push(Deferred {
                machine: candidate.to_owned(),
                reason: DeferReason::NotEligible,
            }),
        }
    }
    // Longest unhealthy first (the Unknown phase's time), then by name, so the choice is stable.
    eligible.sort_by_key(|m| {
        (
            m.status
                .as_ref()
                .and_then(|s| s.current_status.last_update_time.as_ref())
                .map(|t| t.0),
            m.metadata.name.clone(),
        )
    });

    let threshold = settings.share_threshold();
    #[allow(clippy::cast_precision_loss)] // machine counts are far below 2^52
    let share = if counts.total == 0 {
        0.0
    } else {
        counts.unhealthy as f64 / counts.total as f64
    };
    let mut allowed = Vec::new();
    if counts.unhealthy > 1 && share > threshold {
        for machine in eligible {
            deferred.push(Deferred {
                machine: machine.metadata.name.clone().unwrap_or_default(),
                reason: DeferReason::UnhealthyShareTooHigh {
                    unhealthy: counts.unhealthy,
                    total: counts.total,
                    max_share: threshold,
                },
            });
        }
    } else {
        let slots = settings
            .max_concurrent_replacements
            .saturating_sub(counts.in_progress);
        for (index, machine) in eligible.into_iter().enumerate() {
            let name = machine.metadata.name.clone().unwrap_or_default();
            if index < slots {
                allowed.push(name);
            } else {
                deferred.push(Deferred {
                    machine: name,
                    reason: DeferReason::TooManyInProgress {
                        in_progress: counts.in_progress + slots,
                        max: settings.max_concurrent_replacements,
                    },
                });
            }
        }
    }
    RemediationDecision {
        allowed,
        deferred,
        counts,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use proptest::prelude::*;

    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    fn machine(name: &str, phase: Option<MachinePhase>) -> Machine {
        mcm_api::builders::MachineBuilder::new(name)
            .namespace("ns")
            .label(labels::NAME, "md")
            .phase(phase)
            .phase_since(at(100))
            .build()
    }

    fn names(decision: &RemediationDecision) -> Vec<&str> {
        decision.allowed.iter().map(String::as_str).collect()
    }

    #[test]
    fn groups_by_deployment_then_set_then_machine() {
        let a = machine("a", Some(MachinePhase::Running));
        assert_eq!(
            group_key(&a),
            GroupKey::MachineDeployment {
                namespace: "ns".into(),
                name: "md".into()
            }
        );
        let mut b = machine("b", Some(MachinePhase::Running));
        b.metadata.labels = None;
        b.metadata.owner_references = Some(vec![OwnerReference {
            kind: "MachineSet".into(),
            name: "ms".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        assert_eq!(
            group_key(&b),
            GroupKey::MachineSet {
                namespace: "ns".into(),
                name: "ms".into()
            }
        );
        let mut c = machine("c", Some(MachinePhase::Running));
        c.metadata.labels = None;
        assert_eq!(
            group_key(&c),
            GroupKey::Machine {
                namespace: "ns".into(),
                name: "c".into()
            }
        );
        let groups = group_machines([&a, &b, &c]);
        assert_eq!(groups.len(), 3);
    }

    #[test]
    fn one_unhealthy_machine_of_a_healthy_group_is_replaced() {
        let machines = [
            machine("a", Some(MachinePhase::Running)),
            machine("b", Some(MachinePhase::Running)),
            machine("c", Some(MachinePhase::Unknown)),
        ];
        let group: Vec<&Machine> = machines.iter().collect();
        let decision = decide(&group, &["c"], None, at(1000), &RemediationSettings::default());
        assert_eq!(names(&decision), ["c"]);
    }

    #[test]
    fn only_one_replacement_at_a_time_by_default() {
        let machines = [
            machine("a", Some(MachinePhase::Running)),
            machine("b", Some(MachinePhase::Running)),
            machine("c", Some(MachinePhase::Running)),
            machine("d", Some(MachinePhase::Pending)),
            machine("e", Some(MachinePhase::Unknown)),
        ];
        let group: Vec<&Machine> = machines.iter().collect();
        let decision = decide(&group, &["e"], None, at(1000), &RemediationSettings::default());
        assert!(
            decision.allowed.is_empty(),
            "the Pending replacement must join first"
        );
        assert!(matches!(
            decision.deferred[0].reason,
            DeferReason::TooManyInProgress {
                in_progress: 1,
                max: 1
            }
        ));
    }

    #[test]
    fn a_larger_maximum_allows_more_and_picks_the_longest_unhealthy() {
        let mut machines = [
            machine("a", Some(MachinePhase::Running)),
            machine("b", Some(MachinePhase::Running)),
            machine("c", Some(MachinePhase::Running)),
            machine("d", Some(MachinePhase::Unknown)),
            machine("e", Some(MachinePhase::Unknown)),
            machine("f", Some(MachinePhase::Unknown)),
            machine("g", Some(MachinePhase::Running)),
        ];
        machines[5]
            .status
            .as_mut()
            .unwrap()
            .current_status
            .last_update_time = Some(Time(at(5)));
        let group: Vec<&Machine> = machines.iter().collect();
        let settings = RemediationSettings {
            max_concurrent_replacements: 2,
            ..RemediationSettings::default()
        };
        let decision = decide(&group, &["d", "e", "f"], None, at(1000), &settings);
        assert_eq!(names(&decision), ["f", "d"]);
        assert_eq!(decision.deferred.len(), 1);
    }

    #[test]
    fn a_partition_stops_replacements() {
        let machines = [
            machine("a", Some(MachinePhase::Unknown)),
            machine("b", Some(MachinePhase::Unknown)),
            machine("c", Some(MachinePhase::Running)),
        ];
        let group: Vec<&Machine> = machines.iter().collect();
        let decision = decide(
            &group,
            &["a", "b"],
            None,
            at(1000),
            &RemediationSettings::default(),
        );
        assert!(decision.allowed.is_empty());
        assert!(decision.deferred.iter().all(|d| matches!(
            d.reason,
            DeferReason::UnhealthyShareTooHigh {
                unhealthy: 2,
                total: 3,
                ..
            }
        )));
        assert!(decision.deferred[0].reason.to_string().contains("2 of 3"));
    }

    #[test]
    fn a_lone_unhealthy_machine_is_always_eligible() {
        let machines = [machine("a", Some(MachinePhase::Unknown))];
        let group: Vec<&Machine> = machines.iter().collect();
        let decision = decide(&group, &["a"], None, at(1000), &RemediationSettings::default());
        assert_eq!(names(&decision), ["a"]);
    }

    #[test]
    fn terminating_counts_once_and_a_missing_replacement_counts_too() {
        let machines = [
            machine("a", Some(MachinePhase::Running)),
            machine("b", Some(MachinePhase::Running)),
            machine("c", Some(MachinePhase::Terminating)),
            machine("d", Some(MachinePhase::Unknown)),
        ];
        let group: Vec<&Machine> = machines.iter().collect();
        assert_eq!(count(&group, None, at(1000)).in_progress, 1);
        // Desired 4, active 3 (a, b, d): the terminating machine's replacement is not created yet; it is the same
        // replacement, so still 1.
        assert_eq!(count(&group, Some(4), at(1000)).in_progress, 1);
        // Desired 5: a second machine is missing, which is a second replacement on its way.
        assert_eq!(count(&group, Some(5), at(1000)).in_progress, 2);
        let settings = RemediationSettings {
            max_concurrent_replacements: 2,
            ..RemediationSettings::default()
        };
        assert_eq!(names(&decide(&group, &["d"], None, at(1000), &settings)), ["d"]);
        assert!(
            decide(&group, &["d"], Some(5), at(1000), &settings)
                .allowed
                .is_empty()
        );
    }

    /// A Failed machine that asks for preservation but has no expiry yet (the machine controller is about to set
    /// it) is not preserved for the guard: it counts as going; with an expiry it is preserved and counts on neither
    /// side (reference: preserved machines are not replacements in progress).
    #[test]
    fn a_preserve_annotation_without_expiry_does_not_make_a_machine_preserved() {
        let mut failed = machine("a", Some(MachinePhase::Failed));
        failed.metadata.annotations = Some(BTreeMap::from([(
            mcm_api::keys::annotations::PRESERVE.to_owned(),
            "when-failed".to_owned(),
        )]));
        let running = machine("b", Some(MachinePhase::Running));
        let counts = count(&[&failed, &running], None, at(1000));
        assert_eq!((counts.going, counts.in_progress), (1, 1));
        failed
            .status
            .as_mut()
            .unwrap()
            .current_status
            .preserve_expiry_time = Some(Time(at(5000)));
        let counts = count(&[&failed, &running], None, at(1000));
        assert_eq!((counts.going, counts.in_progress), (0, 0));
    }

    #[test]
    fn preserved_machines_are_not_in_progress_and_non_candidates_are_refused() {
        let mut failed = machine("a", Some(MachinePhase::Failed));
        failed
            .status
            .as_mut()
            .unwrap()
            .current_status
            .preserve_expiry_time = Some(Time(at(5000)));
        let machines = [
            failed,
            machine("b", Some(MachinePhase::Running)),
            machine("c", Some(MachinePhase::Unknown)),
        ];
        let group: Vec<&Machine> = machines.iter().collect();
        let decision = decide(
            &group,
            &["c", "b", "zz", "c"],
            None,
            at(1000),
            &RemediationSettings::default(),
        );
        assert_eq!(names(&decision), ["c"]);
        assert_eq!(decision.deferred.len(), 2);
        assert!(
            decision
                .deferred
                .iter()
                .all(|d| d.reason == DeferReason::NotEligible)
        );
    }

    #[test]
    fn zero_turns_automatic_replacement_off() {
        let machines = [machine("a", Some(MachinePhase::Unknown))];
        let group: Vec<&Machine> = machines.iter().collect();
        let settings = RemediationSettings {
            max_concurrent_replacements: 0,
            ..RemediationSettings::default()
        };
        assert!(
            decide(&group, &["a"], None, at(1000), &settings)
                .allowed
                .is_empty()
        );
    }

    fn phase_strategy() -> impl Strategy<Value = Option<MachinePhase>> {
        prop_oneof![
            Just(None),
            proptest::sample::select(MachinePhase::ALL.to_vec()).prop_map(Some),
        ]
    }

    proptest! {
        #[test]
        fn never_more_than_the_maximum_in_progress_and_no_replacement_in_a_partition(
            phases in proptest::collection::vec((phase_strategy(), any::<bool>(), any::<bool>()), 1..30),
            candidate_mask in proptest::collection::vec(any::<bool>(), 30),
            max in 0usize..5,
            max_share in 0.0f64..=1.0,
            desired in proptest::option::of(0u32..40),
        ) {
            let now = at(1000);
            let machines: Vec<Machine> = phases
                .iter()
                .enumerate()
                .map(|(i, (phase, preserved, deleting))| {
                    let mut m = machine(&format!("m{i}"), *phase);
                    if *preserved {
                        m.status.as_mut().unwrap().current_status.preserve_expiry_time = Some(Time(at(2000)));
                    }
                    if *deleting {
                        m.metadata.deletion_timestamp = Some(Time(at(900)));
                    }
                    m
                })
                .collect();
            let group: Vec<&Machine> = machines.iter().collect();
            let names: Vec<String> = (0..machines.len()).map(|i| format!("m{i}")).collect();
            let candidates: Vec<&str> = names
                .iter()
                .zip(&candidate_mask)
                .filter(|(_, c)| **c)
                .map(|(n, _)| n.as_str())
                .collect();
            let settings = RemediationSettings {
                max_concurrent_replacements: max,
                max_unhealthy_share: max_share,
                ..RemediationSettings::default()
            };
            let decision = decide(&group, &candidates, desired, now, &settings);
            let before = count(&group, desired, now);

            // Never more than the maximum in progress.
            prop_assert!(decision.allowed.len() <= max.saturating_sub(before.in_progress));
            // Marking the allowed machines Failed keeps the group within the maximum (or where it already was).
            let after_machines: Vec<Machine> = machines
                .iter()
                .map(|m| {
                    let mut m = m.clone();
                    if decision.allowed.contains(m.metadata.name.as_ref().unwrap()) {
                        m.status.as_mut().unwrap().current_status.phase = Some(MachinePhase::Failed);
                    }
                    m
                })
                .collect();
            let after_group: Vec<&Machine> = after_machines.iter().collect();
            let after = count(&after_group, desired, now);
            prop_assert!(after.in_progress <= max.max(before.in_progress));
            // No replacement while the unhealthy share is above the threshold, unless exactly one is unhealthy.
            #[allow(clippy::cast_precision_loss)]
            let share = before.unhealthy as f64 / before.total as f64;
            if before.unhealthy != 1 && share > max_share {
                prop_assert!(decision.allowed.is_empty());
            }
            // Only unhealthy candidates are allowed, each once.
            for name in &decision.allowed {
                prop_assert!(candidates.contains(&name.as_str()));
                let m = machines.iter().find(|m| m.metadata.name.as_ref() == Some(name)).unwrap();
                prop_assert_eq!(m.phase(), Some(MachinePhase::Unknown));
            }
            let mut unique = decision.allowed.clone();
            unique.dedup();
            prop_assert_eq!(unique.len(), decision.allowed.len());
        }
    }
}
