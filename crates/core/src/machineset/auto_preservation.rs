//! Auto-preservation (reference `manageAutoPreservationOfFailedMachines`; docs/preservation.md): a set with
//! `autoPreserveFailedMachineMax` annotates its newest Failed machines that carry no preserve value with
//! `node.machine.sapcloud.io/preserve=auto-preserved`, up to the max; the machine controller then preserves them. When
//! the max is lowered, the annotation goes from the oldest auto-preserved machines first.

use std::cmp::Reverse;

use mcm_api::{Machine, MachinePhase, MachineSet, MetaExt, keys::annotations};
use serde_json::{Value, json};

use super::{AUTO_PRESERVED, MachinePatch, PRESERVE_VALUES};

/// The machines of `machines` annotated `auto-preserved` (the set's `status.autoPreserveFailedMachineCount`).
pub fn auto_preserved_count(machines: &[&Machine]) -> usize {
    machines
        .iter()
        .filter(|m| m.annotation(annotations::PRESERVE) == Some(AUTO_PRESERVED))
        .count()
}

/// The annotation patches that bring the set's auto-preserved machines to its `autoPreserveFailedMachineMax`: the
/// newest Failed machines whose preserve annotation is absent or not understood (`false` opts out) get
/// `auto-preserved`; above the max, the oldest auto-preserved machines lose it. The count is of the machines as they
/// are (the reference uses the count of its last status).
pub fn auto_preservation(set: &MachineSet, machines: &[&Machine]) -> Vec<MachinePatch> {
    let max = usize::try_from(set.spec.auto_preserve_failed_machine_max.unwrap_or(0)).unwrap_or(0);
    let count = auto_preserved_count(machines);
    let created = |m: &&&Machine| m.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let patch = |m: &Machine, value: Value| MachinePatch {
        name: m.metadata.name.clone().unwrap_or_default(),
        patch: json!({"metadata": {"annotations": {annotations::PRESERVE: value}}}),
    };
    if count > max {
        let mut preserved: Vec<&&Machine> = machines
            .iter()
            .filter(|m| m.annotation(annotations::PRESERVE) == Some(AUTO_PRESERVED))
            .collect();
        preserved.sort_by_key(created);
        return preserved
            .into_iter()
            .take(count - max)
            .map(|m| patch(m, Value::Null))
            .collect();
    }
    let mut candidates: Vec<&&Machine> = machines
        .iter()
        .filter(|m| {
            m.phase() == Some(MachinePhase::Failed)
                && !m.is_deleting()
                && m.annotation(annotations::PRESERVE)
                    .is_none_or(|v| !PRESERVE_VALUES.contains(&v) && v != "false")
        })
        .collect();
    candidates.sort_by_key(|m| Reverse(created(m)));
    candidates
        .into_iter()
        .take(max - count)
        .map(|m| patch(m, Value::String(AUTO_PRESERVED.into())))
        .collect()
}

#[cfg(test)]
mod tests {
    use jiff::Timestamp;
    use mcm_api::builders::{MachineBuilder, MachineSetBuilder};

    use super::*;

    fn machine(name: &str, created: i64, phase: MachinePhase, preserve: Option<&str>) -> Machine {
        let mut b = MachineBuilder::new(name)
            .phase(phase)
            .created_at(Timestamp::from_second(created).unwrap());
        if let Some(v) = preserve {
            b = b.annotation(annotations::PRESERVE, v);
        }
        b.build()
    }

    fn set(max: Option<i32>) -> MachineSet {
        MachineSetBuilder::new("s")
            .with(|s| s.spec.auto_preserve_failed_machine_max = max)
            .build()
    }

    fn names(patches: &[MachinePatch]) -> Vec<(&str, &Value)> {
        patches
            .iter()
            .map(|p| {
                (
                    p.name.as_str(),
                    &p.patch["metadata"]["annotations"][annotations::PRESERVE],
                )
            })
            .collect()
    }

    #[test]
    fn the_newest_failed_machines_without_a_value_are_annotated_up_to_the_max() {
        let machines = [
            machine("old", 1, MachinePhase::Failed, None),
            machine("new", 3, MachinePhase::Failed, None),
            machine("mid", 2, MachinePhase::Failed, None),
            machine("opted-out", 4, MachinePhase::Failed, Some("false")),
            machine("user", 5, MachinePhase::Failed, Some("when-failed")),
            machine("running", 6, MachinePhase::Running, None),
            machine("already", 0, MachinePhase::Failed, Some("auto-preserved")),
        ];
        let refs: Vec<&Machine> = machines.iter().collect();
        let patches = auto_preservation(&set(Some(3)), &refs);
        let auto = json!("auto-preserved");
        assert_eq!(names(&patches), vec![("new", &auto), ("mid", &auto)]);
        assert!(
            auto_preservation(&set(None), &refs[..6]).is_empty(),
            "no max, nothing"
        );
    }

    #[test]
    fn a_lowered_max_removes_the_annotation_from_the_oldest_first() {
        let machines = [
            machine("b", 2, MachinePhase::Failed, Some("auto-preserved")),
            machine("a", 1, MachinePhase::Failed, Some("auto-preserved")),
            machine("c", 3, MachinePhase::Failed, Some("auto-preserved")),
        ];
        let refs: Vec<&Machine> = machines.iter().collect();
        let patches = auto_preservation(&set(Some(1)), &refs);
        assert_eq!(names(&patches), vec![("a", &Value::Null), ("b", &Value::Null)]);
        assert_eq!(auto_preserved_count(&refs), 3);
    }
}
